package replay_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/replay"
)

// SignStream signs a request whose body is streamed: given the body's
// SHA-256, it sets the Content-Digest Sign would set, and the signature
// verifies, with Check over the body and with CheckStream as it streams;
// a sum of other bytes is refused.
func TestSignStream(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("part bytes "), 5000)
	sign := func(sum [sha256.Size]byte) *http.Request {
		r, err := http.NewRequest(http.MethodPut, "https://cp.example/workers/jobs/j/uploads/u/parts/1", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/octet-stream")
		if err := replay.NewSigner(priv, nil).SignStream(r, sum); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := sign(sha256.Sum256(body))
	want, _ := replay.ContentDigest(replay.DigestSHA256, body)
	if got := r.Header.Get("Content-Digest"); got != want {
		t.Errorf("Content-Digest %q, want %q", got, want)
	}
	v := replay.NewVerifier(replay.NewMemoryStore(nil), nil)
	if _, err := v.Check(r, body, pub); err != nil {
		t.Errorf("Check: %v", err)
	}
	_, d, err := v.CheckStream(sign(sha256.Sum256(body)), pub)
	if err != nil {
		t.Fatal(err)
	}
	d.Write(body)
	if err := d.Check(); err != nil {
		t.Errorf("CheckStream's digest: %v", err)
	}
	if _, err := v.Check(sign(sha256.Sum256(body[1:])), body, pub); !errors.Is(err, replay.ErrBadDigest) {
		t.Errorf("the sum of other bytes: %v", err)
	}
	// The signature covers the digest: changing it breaks the signature.
	r = sign(sha256.Sum256(body))
	other, _ := replay.ContentDigest(replay.DigestSHA256, body[1:])
	r.Header.Set("Content-Digest", other)
	if _, err := v.Check(r, body[1:], pub); !errors.Is(err, replay.ErrBadSignature) {
		t.Errorf("a replaced digest: %v", err)
	}
}
