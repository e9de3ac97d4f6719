package replay_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/replay"
)

// CheckStream verifies a request's headers before its body is read, and
// its BodyDigest then tells the body that was signed from any other: a
// changed byte, a body cut short, a body with a byte more.
func TestCheckStream(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<12)
	sign := func() *http.Request {
		r, err := http.NewRequest(http.MethodPut, "https://cp.example/workers/jobs/j/uploads/u/parts/1", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/octet-stream")
		if err := replay.NewSigner(priv, nil).Sign(r, body); err != nil {
			t.Fatal(err)
		}
		return r
	}
	v := replay.NewVerifier(replay.NewMemoryStore(nil), nil)
	cut := body[:len(body)-1]
	changed := bytes.Clone(body)
	changed[100] ^= 1
	for _, c := range []struct {
		name string
		sent []byte
		ok   bool
	}{
		{"the body signed", body, true},
		{"a changed byte", changed, false},
		{"cut short", cut, false},
		{"a byte more", append(bytes.Clone(body), 'x'), false},
		{"empty", nil, false},
	} {
		vd, d, err := v.CheckStream(sign(), pub)
		if err != nil {
			t.Fatalf("%s: CheckStream: %v", c.name, err)
		}
		if vd.Nonce == "" {
			t.Fatalf("%s: no nonce", c.name)
		}
		// In pieces, as a stream arrives.
		if _, err := io.CopyBuffer(d, bytes.NewReader(c.sent), make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		err = d.Check()
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, replay.ErrBadDigest)) {
			t.Errorf("%s: Check = %v", c.name, err)
		}
	}

	// What Check refuses before the body, CheckStream refuses too.
	r := sign()
	r.Header.Set("Content-Digest", "md5=:AAAA:")
	if _, _, err := v.CheckStream(r, pub); !errors.Is(err, replay.ErrBadDigest) {
		t.Errorf("md5 digest: %v", err)
	}
	r = sign()
	r.Header.Set("Content-Digest", "sha-256=(1 2)")
	if _, _, err := v.CheckStream(r, pub); !errors.Is(err, replay.ErrMalformedSignature) {
		t.Errorf("inner list digest: %v", err)
	}
	r = sign()
	r.Header.Set("Content-Type", "application/json") // covered by the signature
	if _, _, err := v.CheckStream(r, pub); !errors.Is(err, replay.ErrBadSignature) {
		t.Errorf("changed header: %v", err)
	}
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, _, err := v.CheckStream(sign(), other); !errors.Is(err, replay.ErrBadSignature) {
		t.Errorf("another key: %v", err)
	}
	r = sign()
	r.Header.Del("Content-Digest")
	if _, _, err := v.CheckStream(r, pub); !errors.Is(err, replay.ErrMissingSignature) {
		t.Errorf("no digest: %v", err)
	}
}

// A BodyDigest with both algorithms checks both.
func TestBodyDigestBothAlgorithms(t *testing.T) {
	t.Parallel()
	body := []byte("hello")
	s256, _ := replay.ContentDigest(replay.DigestSHA256, body)
	s512, _ := replay.ContentDigest(replay.DigestSHA512, body)
	d, err := replay.NewBodyDigest(s256 + ", " + s512[:len(s512)-3] + "AA:")
	if err != nil {
		t.Fatal(err)
	}
	d.Write(body)
	if err := d.Check(); !errors.Is(err, replay.ErrBadDigest) {
		t.Errorf("a wrong sha-512 member: %v", err)
	}
	d, err = replay.NewBodyDigest(s256 + ", " + s512)
	if err != nil {
		t.Fatal(err)
	}
	d.Write(body[:2])
	d.Write(body[2:])
	if err := d.Check(); err != nil {
		t.Errorf("both right: %v", err)
	}
}

func TestBodyDigestDeclared(t *testing.T) {
	t.Parallel()
	s256, _ := replay.ContentDigest(replay.DigestSHA256, []byte("x"))
	d, err := replay.NewBodyDigest(s256)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("x"))
	if got := d.Declared(replay.DigestSHA256); !bytes.Equal(got, want[:]) {
		t.Errorf("Declared(sha-256) = %x", got)
	}
	if got := d.Declared(replay.DigestSHA512); got != nil {
		t.Errorf("Declared(sha-512) = %x, want nil", got)
	}
}
