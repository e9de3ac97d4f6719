package replay_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/replay"
)

// The tests in this file sign requests through the generic RFC 9421 layer
// with every profile parameter right but one thing wrong, so that each
// fails only if the profile checks that one thing. Each is named after the
// mutation of the profile code it catches.

// genericRequest returns a request as a server receives it, with a query,
// Content-Type and the Content-Digest of body, signed with priv through
// SignRequest over components, with valid profile parameters (created
// now, expires 300 s later, a 16-byte nonce, the key's keyid and the tag).
func genericRequest(t *testing.T, priv ed25519.PrivateKey, body []byte, components []string) *http.Request {
	t.Helper()
	r := httptest.NewRequest("POST", "/workers/jobs/lease?wait=30", bytes.NewReader(body))
	r.Host = "127.0.0.1:8080"
	r.Header.Set("Content-Type", "application/json")
	cd, err := replay.ContentDigest(replay.DigestSHA256, body)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Digest", cd)
	p := &replay.SignatureParams{
		Components: components,
		Params: []replay.Param{
			{Name: "created", Value: now.Unix()},
			{Name: "expires", Value: now.Add(replay.MaxWindow).Unix()},
			{Name: "nonce", Value: base64.RawURLEncoding.EncodeToString(testNonce)},
			{Name: "keyid", Value: replay.KeyID(priv.Public().(ed25519.PublicKey))},
			{Name: "tag", Value: replay.Tag},
		},
	}
	if err := replay.SignRequest(r, replay.Label, p, priv); err != nil {
		t.Fatalf("SignRequest(%q): %v", components, err)
	}
	return r
}

// without returns the profile's components but c, in order.
func without(c string) []string {
	return slices.DeleteFunc(replay.Components(), func(x string) bool { return x == c })
}

// verifyAt verifies r with body for pub on a fresh Verifier whose clock
// reads now.
func verifyAt(r *http.Request, body []byte, pub ed25519.PublicKey) error {
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return now }})
	_, err := v.Verify(context.Background(), r, body, "node-1", pub)
	return err
}

// signatureHolds checks that r's signature is sound for the generic layer,
// so that whatever the profile refuses is the profile's doing.
func signatureHolds(t *testing.T, r *http.Request, pub ed25519.PublicKey) {
	t.Helper()
	sig, err := replay.ParseSignature(r.Header, replay.Label)
	if err != nil {
		t.Fatalf("ParseSignature: %v", err)
	}
	if err := replay.VerifyRequest(r, sig, pub); err != nil {
		t.Fatalf("VerifyRequest: the generic layer refuses the signature: %v", err)
	}
}

// TestProfileRequiresEveryComponent checks that a signature that covers every profile
// component but one is malformed, whichever one it leaves out. (Mutation
// caught: the profile check lets any one component go uncovered.)
func TestProfileRequiresEveryComponent(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{"max_jobs":1}`)

	// The same request covering them all verifies: the only defect of
	// each case below is the component it leaves out.
	full := genericRequest(t, priv, body, replay.Components())
	signatureHolds(t, full, pub)
	if err := verifyAt(full, body, pub); err != nil {
		t.Fatalf("Verify with every component covered = %v, want nil", err)
	}

	tests := []struct {
		name    string
		missing string
	}{
		{"@method", replay.ComponentMethod},
		{"@authority", replay.ComponentAuthority},
		{"@path", replay.ComponentPath},
		{"@query", replay.ComponentQuery},
		{"content-digest", "content-digest"},
		{"content-type", "content-type"},
	}
	if len(tests) != len(replay.Components()) {
		t.Fatalf("%d cases for the %d profile components %q", len(tests), len(replay.Components()), replay.Components())
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			covered := without(tc.missing)
			if len(covered) != len(replay.Components())-1 {
				t.Fatalf("%q is not a profile component", tc.missing)
			}
			r := genericRequest(t, priv, body, covered)
			signatureHolds(t, r, pub)
			if err := verifyAt(r, body, pub); !errors.Is(err, replay.ErrMalformedSignature) {
				t.Fatalf("Verify of a signature covering %q = %v, want ErrMalformedSignature", covered, err)
			}
		})
	}
}

// TestBodySwapUnderUncoveredDigest checks that a body and its Content-Digest replaced
// together, under a signature that does not cover content-digest, are
// refused, though the new digest is right and the signature still holds.
// (Mutation caught: the profile lets content-digest go uncovered.)
func TestBodySwapUnderUncoveredDigest(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	signed := []byte(`{"max_jobs":1}`)
	swapped := []byte(`{"max_jobs":64}`)
	swappedDigest, err := replay.ContentDigest(replay.DigestSHA256, swapped)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		components []string
		// holds says whether the signature still verifies for the generic
		// layer after the swap.
		holds bool
		want  error
	}{
		{"content-digest not covered", without("content-digest"), true, replay.ErrMalformedSignature},
		{"content-digest covered", replay.Components(), false, replay.ErrBadSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := genericRequest(t, priv, signed, tc.components)
			r.Header.Set("Content-Digest", swappedDigest)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(swapped)), int64(len(swapped))
			if tc.holds {
				signatureHolds(t, r, pub)
			}
			if err := replay.CheckContentDigest(r.Header.Get("Content-Digest"), swapped); err != nil {
				t.Fatalf("the swapped digest is not the swapped body's: %v", err)
			}
			if err := verifyAt(r, swapped, pub); !errors.Is(err, tc.want) {
				t.Fatalf("Verify of the swapped body = %v, want %v", err, tc.want)
			}
		})
	}
}
