package leasetest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

var answerTests = []test{
	{"RememberRecall", testRememberRecall},
	{"AnswerExpiry", testAnswerExpiry},
	{"AnswerArguments", testAnswerArguments},
}

func answerKey(s string) []byte {
	k := sha256.Sum256([]byte(s))
	return k[:]
}

// testRememberRecall: an answer comes back byte for byte under its key
// only, and a second one under the same key is refused while it lives.
func testRememberRecall(t *testing.T, f *fixture) {
	body := []byte{0, 1, 2, 0xff, 'x', 0}
	a := lease.Answer{
		Key: answerKey("a"), WorkerID: "wrk_a", Digest: answerKey("digest"), Status: 201, Body: body,
		ExpiresAt: f.now().Add(time.Hour),
	}
	if err := f.m.Remember(f.ctx, a); err != nil {
		t.Fatalf("Remember: %v", err)
	}
	got, err := f.m.Recall(f.ctx, answerKey("a"))
	if err != nil {
		t.Fatalf("Recall: %v", err)
	}
	if !bytes.Equal(got.Key, a.Key) || got.WorkerID != a.WorkerID || !bytes.Equal(got.Digest, a.Digest) ||
		got.Status != 201 || !bytes.Equal(got.Body, body) || !got.CreatedAt.Equal(f.now()) || !got.ExpiresAt.Equal(a.ExpiresAt) {
		t.Errorf("Recall = %+v, want %+v created at %v", got, a, f.now())
	}
	if _, err := f.m.Recall(f.ctx, answerKey("b")); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Recall of another key: %v, want ErrNotFound", err)
	}
	b := a
	b.Body = []byte("second")
	if err := f.m.Remember(f.ctx, b); !errors.Is(err, lease.ErrConflict) {
		t.Errorf("Remember under a live key: %v, want ErrConflict", err)
	}
	if got, err := f.m.Recall(f.ctx, a.Key); err != nil || !bytes.Equal(got.Body, body) {
		t.Errorf("after the refused Remember: %v, %v; want the first answer", got, err)
	}
}

// testAnswerExpiry: an answer is forgotten at its expiry, its key may be
// used again, and ForgetAnswers deletes only dead answers.
func testAnswerExpiry(t *testing.T, f *fixture) {
	for i, k := range []string{"short", "long"} {
		a := lease.Answer{Key: answerKey(k), WorkerID: "wrk_a", Digest: answerKey(k), Status: 200,
			Body: []byte(k), ExpiresAt: f.now().Add(time.Duration(i+1) * time.Minute)}
		if err := f.m.Remember(f.ctx, a); err != nil {
			t.Fatalf("Remember(%s): %v", k, err)
		}
	}
	f.clock.Advance(time.Minute - time.Microsecond)
	if _, err := f.m.Recall(f.ctx, answerKey("short")); err != nil {
		t.Fatalf("Recall before expiry: %v", err)
	}
	f.clock.Advance(time.Microsecond)
	if _, err := f.m.Recall(f.ctx, answerKey("short")); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Recall at expiry: %v, want ErrNotFound", err)
	}
	if n, err := f.m.ForgetAnswers(f.ctx); err != nil || n != 1 {
		t.Errorf("ForgetAnswers = %d, %v; want 1", n, err)
	}
	if _, err := f.m.Recall(f.ctx, answerKey("long")); err != nil {
		t.Errorf("Recall of the live answer after ForgetAnswers: %v", err)
	}
	// An expired key is free again, even before it is deleted.
	f.clock.Advance(time.Minute)
	a := lease.Answer{Key: answerKey("long"), WorkerID: "wrk_b", Digest: answerKey("x"), Status: 201,
		Body: []byte("again"), ExpiresAt: f.now().Add(time.Minute)}
	if err := f.m.Remember(f.ctx, a); err != nil {
		t.Fatalf("Remember under an expired key: %v", err)
	}
	if got, err := f.m.Recall(f.ctx, a.Key); err != nil || string(got.Body) != "again" || got.WorkerID != "wrk_b" {
		t.Errorf("Recall = %+v, %v; want the new answer", got, err)
	}
	if n, err := f.m.ForgetAnswers(f.ctx); err != nil || n != 0 {
		t.Errorf("ForgetAnswers = %d, %v; want 0", n, err)
	}
}

func testAnswerArguments(t *testing.T, f *fixture) {
	for _, a := range []lease.Answer{
		{Key: []byte("short"), ExpiresAt: f.now().Add(time.Minute)},
		{Key: answerKey("k"), ExpiresAt: f.now()},
	} {
		if err := f.m.Remember(f.ctx, a); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("Remember(%x, expires %v): %v, want ErrInvalidArgument", a.Key, a.ExpiresAt, err)
		}
	}
	if _, err := f.store.DeleteAnswers(f.ctx, f.now(), 0); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("DeleteAnswers(limit 0): %v, want ErrInvalidArgument", err)
	}
}
