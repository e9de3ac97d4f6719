package workerapi

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/replay"
)

// The diagnosis tries at most maxDiagnoses pairs: the received and hinted
// values here make 15, and a pair past the eighth is not found.
func TestDiagnosisIsBounded(t *testing.T) {
	t.Parallel()
	o, err := parsePublicOrigin("https://pub.example/root")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{origin: o}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"status":"idle"}`)
	// received builds the request as the Server gets it: through a proxy
	// that sent the hints, then the host's http.StripPrefix("/api").
	received := func(signedURL string) *http.Request {
		c, err := http.NewRequest(http.MethodPost, signedURL, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		c.Header.Set("Content-Type", "application/json")
		if err := replay.NewSigner(key, nil).Sign(c, body); err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/api/workers/heartbeat", bytes.NewReader(body))
		r.Host = "10.0.0.5:8080"
		r.URL.Path = "/workers/heartbeat"
		for _, h := range []string{"Content-Type", "Content-Digest", "Signature", "Signature-Input"} {
			r.Header.Set(h, c.Header.Get(h))
		}
		r.Header.Set("X-Forwarded-Host", "a.example")
		r.Header.Set("Forwarded", "host=b.example")
		r.Header.Set("X-Forwarded-Prefix", "/px")
		return r
	}
	bad := fmt.Errorf("%w: does not verify", replay.ErrBadSignature)
	for _, tc := range []struct {
		signedURL string
		found     bool
	}{
		{"https://b.example/root/workers/heartbeat", true},   // third: a host with the verified path
		{"https://pub.example/px/workers/heartbeat", true},   // sixth: the verified host with a path
		{"http://10.0.0.5:8080/api/workers/heartbeat", true}, // seventh: the request as received
		{"http://10.0.0.5:8080/px/workers/heartbeat", false}, // ninth
		{"https://b.example/px/workers/heartbeat", false},    // fifteenth
		{"https://c.example/root/workers/heartbeat", false},  // never suggested
	} {
		r := received(tc.signedURL)
		err := s.diagnose(r, o.request(r), pub, bad)
		if got := strings.Contains(err.Error(), "it was signed for"); got != tc.found {
			t.Errorf("signed for %s: %v; want found=%t", tc.signedURL, err, tc.found)
		}
		if !errors.Is(err, replay.ErrBadSignature) {
			t.Errorf("signed for %s: %v does not wrap ErrBadSignature", tc.signedURL, err)
		}
	}
}
