package replay_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nodelane/nodelane/replay"
)

// counterReader yields distinct nonces: a counter in the first 8 bytes.
type counterReader struct{ n uint64 }

func (c *counterReader) Read(p []byte) (int, error) {
	clear(p)
	c.n++
	binary.BigEndian.PutUint64(p, c.n)
	return len(p), nil
}

var benchBody = []byte(`{"status":"idle","current_jobs":["job-1"],"metrics":{"gpu_util":0.93,"vram_used_mb":20100}}`)

// BenchmarkVerify measures a server's full check of one request:
// parse, digest, signature, window and a nonce insert into a MemoryStore.
func BenchmarkVerify(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 32)))
	clock := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	signer := replay.NewSigner(priv, &replay.SignerConfig{Now: now, Rand: &counterReader{}})
	// Every request needs its own nonce, so they are signed beforehand.
	reqs := make([]*http.Request, b.N)
	for i := range reqs {
		r := httptest.NewRequest("POST", "/workers/heartbeat", nil)
		r.Host = "cp.example"
		r.Header.Set("Content-Type", "application/json")
		if err := signer.Sign(r, benchBody); err != nil {
			b.Fatal(err)
		}
		reqs[i] = r
	}
	store := replay.NewMemoryStore(&replay.MemoryConfig{PerNode: b.N + 1, Total: b.N + 1})
	v := replay.NewVerifier(store, &replay.VerifierConfig{Now: now})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := v.Verify(ctx, reqs[i], benchBody, "studio-gpu-1", pub); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSign measures a worker signing one request.
func BenchmarkSign(b *testing.B) {
	_, priv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 32)))
	signer := replay.NewSigner(priv, &replay.SignerConfig{Rand: &counterReader{}})
	r, _ := http.NewRequest("POST", "https://cp.example/api/nl/workers/heartbeat", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	for b.Loop() {
		if err := signer.Sign(r, benchBody); err != nil {
			b.Fatal(err)
		}
	}
}
