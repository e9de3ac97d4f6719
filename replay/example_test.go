package replay_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/nodelane/nodelane/replay"
)

func Example() {
	// The worker's key; the server holds only the public half.
	pub, priv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 32)))
	clock := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }

	// The worker signs its request.
	body := []byte(`{"status":"idle"}`)
	req, _ := http.NewRequest("POST", "https://cp.example/api/nl/workers/heartbeat", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	signer := replay.NewSigner(priv, &replay.SignerConfig{Now: now, Rand: bytes.NewReader(make([]byte, 16))})
	if err := signer.Sign(req, body); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("Content-Digest:", req.Header.Get("Content-Digest"))
	fmt.Println("Signature-Input:", req.Header.Get("Signature-Input"))

	// The server receives it, under the prefix it mounts the API at.
	in := httptest.NewRequest("POST", "/api/nl/workers/heartbeat", bytes.NewReader(body))
	in.Host = "cp.example"
	in.Header = req.Header.Clone()
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: now})
	vd, err := v.Verify(context.Background(), in, body, "studio-gpu-1", pub)
	fmt.Println("verified:", err == nil, "expires:", vd.Expires)

	// The same request again is a replay.
	_, err = v.Verify(context.Background(), in, body, "studio-gpu-1", pub)
	fmt.Println("again:", errors.Is(err, replay.ErrReplayedNonce))

	// Output:
	// Content-Digest: sha-256=:rc3yEse5YPXVxORMGto/rogUVXL7VVvKd9h52mbsQq4=:
	// Signature-Input: nodelane=("@method" "@authority" "@path" "@query" "content-digest" "content-type");created=1796029200;expires=1796029500;nonce="AAAAAAAAAAAAAAAAAAAAAA";keyid="E545QOZLVJFyIIjZoNdBYo_IJuCUddNBp4Cs3jxLgHA";tag="nodelane-worker/v1"
	// verified: true expires: 2026-11-30 09:05:00 +0000 UTC
	// again: true
}
