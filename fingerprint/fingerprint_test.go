package fingerprint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	fingerprinttest.Run(t, func(t *testing.T) fingerprint.Store { return fingerprint.NewMemoryStore() })
}

func TestFingerprints(t *testing.T) {
	t.Parallel()
	p := bytes.Repeat([]byte{0x5a}, 32)
	a, b := fingerprint.Pepper(1, p), fingerprint.Pepper(1, bytes.Repeat([]byte{0x5b}, 32))
	if a.Value == b.Value || a.Kind != fingerprint.KindPepper || a.ID != "1" || a.Validate() != nil {
		t.Fatalf("pepper fingerprints %+v %+v", a, b)
	}
	if strings.Contains(a.Value, hex.EncodeToString(p)[:8]) {
		t.Fatal("a pepper's fingerprint shows the pepper")
	}
	const vkey = "nodelane.example/receipts+01234567+AbCd"
	sum := sha256.Sum256([]byte(vkey))
	if rk := fingerprint.ReceiptKey(vkey); rk.Value != hex.EncodeToString(sum[:]) || rk.Kind != fingerprint.KindReceiptKey || rk.ID != "" {
		t.Fatalf("receipt key fingerprint %+v", rk)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p1, p2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	st := fingerprint.NewMemoryStore()
	first := []fingerprint.Fingerprint{fingerprint.Pepper(1, p1), fingerprint.ReceiptKey("key-a")}
	if unheld, err := fingerprint.Check(ctx, st, first); err != nil || unheld != nil {
		t.Fatalf("first Check: %v %v", unheld, err)
	}
	// The same secrets again, and with a new pepper version added.
	if _, err := fingerprint.Check(ctx, st, first); err != nil {
		t.Fatalf("same secrets: %v", err)
	}
	rotated := []fingerprint.Fingerprint{fingerprint.Pepper(1, p1), fingerprint.Pepper(2, p2), fingerprint.ReceiptKey("key-a")}
	if _, err := fingerprint.Check(ctx, st, rotated); err != nil {
		t.Fatalf("a new pepper version: %v", err)
	}
	// The old version dropped: started, and reported.
	unheld, err := fingerprint.Check(ctx, st, []fingerprint.Fingerprint{fingerprint.Pepper(2, p2), fingerprint.ReceiptKey("key-a")})
	if err != nil || len(unheld) != 1 || unheld[0].ID != "1" {
		t.Fatalf("pepper 1 retired: %v %v", unheld, err)
	}

	// A replica with a wrong pepper 1 and a new pepper 3 adds nothing: pepper
	// 3 is still free for the right secrets file.
	p3 := bytes.Repeat([]byte{3}, 32)
	if _, err := fingerprint.Check(ctx, st, []fingerprint.Fingerprint{fingerprint.Pepper(1, p2), fingerprint.Pepper(3, p2), fingerprint.ReceiptKey("key-a")}); !errors.Is(err, fingerprint.ErrMismatch) {
		t.Fatalf("wrong pepper 1 with a new pepper 3: %v", err)
	}
	if _, err := fingerprint.Check(ctx, st, []fingerprint.Fingerprint{fingerprint.Pepper(1, p1), fingerprint.Pepper(3, p3), fingerprint.ReceiptKey("key-a")}); err != nil {
		t.Fatalf("the right pepper 3 after a refused replica offered another: %v", err)
	}
	if _, err := fingerprint.Check(ctx, st, []fingerprint.Fingerprint{fingerprint.Pepper(1, p1), fingerprint.Pepper(1, p1)}); !errors.Is(err, fingerprint.ErrInvalidArgument) {
		t.Fatalf("a secret given twice: %v", err)
	}

	for _, c := range []struct {
		name string
		have []fingerprint.Fingerprint
		want []string // in the message
	}{
		{"other pepper", []fingerprint.Fingerprint{fingerprint.Pepper(1, p2), fingerprint.ReceiptKey("key-a")},
			[]string{"credential pepper 1 (fingerprint " + fingerprint.Pepper(1, p2).Value[:16] + " here, " + fingerprint.Pepper(1, p1).Value[:16] + " in the database)"}},
		{"other receipt key", []fingerprint.Fingerprint{fingerprint.Pepper(1, p1), fingerprint.ReceiptKey("key-b")},
			[]string{"receipt signing key (verifier key fingerprint " + fingerprint.ReceiptKey("key-b").Value[:16] + " here, " + fingerprint.ReceiptKey("key-a").Value[:16] + " in the database)"}},
		{"both", []fingerprint.Fingerprint{fingerprint.Pepper(1, p2), fingerprint.ReceiptKey("key-b")},
			[]string{"credential pepper 1", "; receipt signing key"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := fingerprint.Check(ctx, st, c.have)
			var me *fingerprint.MismatchError
			if !errors.Is(err, fingerprint.ErrMismatch) || !errors.As(err, &me) {
				t.Fatalf("Check: %v, want a MismatchError", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
			for _, s := range [][]byte{p1, p2} {
				if strings.Contains(err.Error(), hex.EncodeToString(s)) {
					t.Errorf("message %q shows a pepper", err)
				}
			}
		})
	}
}
