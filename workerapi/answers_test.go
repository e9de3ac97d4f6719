package workerapi_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// answerAEAD is the AES-256-GCM of the answers a worker's key seals, for
// the request the worker sent to route for job jobID, derived as
// answers.go says, here on its own so that the test checks the format
// rather than the code: salt nil is how answers were sealed before the
// pepper took part (v1, info "…\x00seal"), salt a pepper how they are now
// (v2, info "…\x00seal v2").
func answerAEAD(t *testing.T, key, route, workerID, jobID string, salt []byte, info string) cipher.AEAD {
	t.Helper()
	scope := strings.Join([]string{"nodelane answer v1", route, workerID, jobID}, "\x00")
	k, err := hkdf.Key(sha256.New, []byte(key), salt, scope+"\x00"+info, 32)
	if err != nil {
		t.Fatal(err)
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return aead
}

// TestAnswerSealedUnderPepper checks that a remembered answer is sealed
// under a key that takes the server's pepper as well as the worker's key
// (v2: "nla2", the pepper version, nonce, ciphertext), so that a weak key
// and the database row alone open nothing; and that an answer sealed the
// way it was before (v1) still answers a repeat after the upgrade.
func TestAnswerSealedUnderPepper(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		f := setup(t, d)
		id, tok := f.running(t, "status_check")
		// A weak key, as a careless third-party client would send.
		const key = "request-000000001"
		req := wire.StatusRequest{LeaseToken: tok, EventType: "progress", IdempotencyKey: key}
		path := wire.JobPath(id, "status")
		st, first := post(t, f.node, path, req)
		if st != http.StatusOK {
			t.Fatalf("status: %d %s", st, first)
		}
		ctx := context.Background()
		var row struct {
			ID   []byte `bun:"id"`
			Body []byte `bun:"body"`
		}
		if err := f.env.DB.Bun().NewSelect().Table("nodelane_answers").Column("id", "body").
			Where("worker_id = ?", f.node.WorkerID).Scan(ctx, &row); err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSuffix(string(first), "\n")

		t.Run("new rows are v2", func(t *testing.T) {
			b := row.Body
			if len(b) < 8+12 || string(b[:4]) != "nla2" || binary.BigEndian.Uint32(b[4:8]) != 1 {
				t.Fatalf("the stored answer does not begin with nla2 and pepper version 1: % x", b[:min(len(b), 12)])
			}
			ad := append(append([]byte(nil), row.ID...), b[:8]...)
			body := b[8:]
			v2 := answerAEAD(t, key, "status", f.node.WorkerID, id, f.env.Config.Peppers[1], "seal v2")
			got, err := v2.Open(nil, body[:12], body[12:], ad)
			if err != nil || string(got) != want {
				t.Fatalf("with the pepper: %q, %v; want the first answer %s", got, err, want)
			}
			// Whoever reads the database and guesses the key, without the
			// pepper: neither the old derivation nor the new one opens it.
			v1 := answerAEAD(t, key, "status", f.node.WorkerID, id, nil, "seal")
			noPepper := answerAEAD(t, key, "status", f.node.WorkerID, id, nil, "seal v2")
			for name, try := range map[string]func() error{
				"v1 over the row":       func() error { _, err := v1.Open(nil, b[:12], b[12:], row.ID); return err },
				"v1 past the header":    func() error { _, err := v1.Open(nil, body[:12], body[12:], row.ID); return err },
				"v1 with the header":    func() error { _, err := v1.Open(nil, body[:12], body[12:], ad); return err },
				"v2 without the pepper": func() error { _, err := noPepper.Open(nil, body[:12], body[12:], ad); return err },
				"v2 with another pepper": func() error {
					other := make([]byte, 32)
					rand.Read(other)
					_, err := answerAEAD(t, key, "status", f.node.WorkerID, id, other, "seal v2").Open(nil, body[:12], body[12:], ad)
					return err
				},
			} {
				if try() == nil {
					t.Errorf("%s: the answer opened", name)
				}
			}
		})

		t.Run("old rows still answer", func(t *testing.T) {
			// The row as a server before the upgrade sealed it: nonce ||
			// ciphertext under the key derived without the pepper, here of
			// an answer that tells it from the new one.
			const old = `{"sealed":"v1"}`
			v1 := answerAEAD(t, key, "status", f.node.WorkerID, id, nil, "seal")
			nonce := make([]byte, v1.NonceSize())
			rand.Read(nonce)
			sealed := v1.Seal(nonce, nonce, []byte(old), row.ID)
			if _, err := f.env.DB.Bun().NewUpdate().Table("nodelane_answers").Set("body = ?", sealed).
				Where("id = ?", row.ID).Exec(ctx); err != nil {
				t.Fatal(err)
			}
			f.unchanged(t, id, func() {
				st, b := post(t, f.node, path, req)
				if st != http.StatusOK || strings.TrimSuffix(string(b), "\n") != old {
					t.Fatalf("a repeat over an answer sealed v1: %d %s, want 200 %s", st, b, old)
				}
			})
		})
	})
}
