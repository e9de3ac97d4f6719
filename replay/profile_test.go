package replay_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/replay"
)

func TestNodelaneVectors(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	f := readVectors(t, "testdata/nodelane-signature-v1.txt")
	if got, want := replay.KeyID(pub), f.find(t, "KEYID"); got != want {
		t.Errorf("KeyID = %q, vector %q", got, want)
	}
	if got, want := base64.RawURLEncoding.EncodeToString(pub), f.find(t, "PUBLIC_KEY"); got != want {
		t.Errorf("public_key = %q, vector %q", got, want)
	}
	nonce, err := base64.RawURLEncoding.DecodeString(f.find(t, "NONCE"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.cases) != 3 {
		t.Fatalf("%d cases in the vector file, want 2", len(f.cases)-1)
	}
	for _, c := range f.cases[1:] {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			vr, body := parseRequest(t, c.get(t, "REQUEST"))
			want := func(name string) string {
				t.Helper()
				if len(vr.Header.Values(name)) != 1 {
					t.Fatalf("vector request has %d %s lines", len(vr.Header.Values(name)), name)
				}
				return vr.Header.Get(name)
			}
			sig, err := replay.ParseSignature(vr.Header, replay.Label)
			if err != nil {
				t.Fatalf("ParseSignature(vector): %v", err)
			}
			v, _ := sig.Params.Get("created")
			created := time.Unix(v.(int64), 0)
			if v, _ := sig.Params.Get("nonce"); v != f.find(t, "NONCE") {
				t.Errorf("vector nonce %v is not NONCE", v)
			}

			// A worker's client request, signed at the vector's created
			// with its nonce, carries the vector's fields byte for byte.
			cr, err := http.NewRequest(vr.Method, "http://"+vr.Host+vr.RequestURI, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			cr.Header.Set("Content-Type", want("Content-Type"))
			if err := replay.NewSigner(priv, nil).SignAt(cr, body, created, nonce); err != nil {
				t.Fatalf("SignAt: %v", err)
			}
			for _, name := range []string{"Content-Digest", "Signature-Input", "Signature"} {
				if got, want := cr.Header.Get(name), want(name); got != want {
					t.Errorf("%s:\n got %s\nwant %s", name, got, want)
				}
			}
			for _, r := range []*http.Request{cr, vr} {
				base, err := replay.SignatureBase(r, sig.Params)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(c.get(t, "SIGNATURE_BASE"), string(base)); diff != "" {
					t.Errorf("signature base of the request as sent by a client=%t (-vector +got):\n%s", r == cr, diff)
				}
			}

			// A server whose clock reads created accepts it once.
			v2 := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return created }})
			got, err := v2.Verify(context.Background(), vr, body, "studio-gpu-1", pub)
			if err != nil {
				t.Fatalf("Verify(vector) = %v", err)
			}
			wantV := &replay.Verified{
				KeyID:   f.find(t, "KEYID"),
				Nonce:   f.find(t, "NONCE"),
				Created: created.UTC(),
				Expires: created.Add(300 * time.Second).UTC(),
			}
			if diff := cmp.Diff(wantV, got); diff != "" {
				t.Errorf("Verified (-want +got):\n%s", diff)
			}
			if _, err := v2.Verify(context.Background(), vr, body, "studio-gpu-1", pub); !errors.Is(err, replay.ErrReplayedNonce) {
				t.Errorf("Verify(vector) again = %v, want ErrReplayedNonce", err)
			}
		})
	}
}

// now is the verifier's clock in the profile tests.
var now = time.Unix(1767225600, 0).UTC()

// testNonce is 16 bytes 00..0f, as in the vectors.
var testNonce = []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// signCase describes how to sign one request of TestVerify.
type signCase struct {
	// created defaults to now.
	created time.Time
	// params, when set, edits the parameters after the Signer signed, and
	// the request is signed again with them (through the generic layer).
	params func(p *replay.SignatureParams)
	// before, when set, edits the request after the Signer signed; the
	// request is then signed again.
	before func(r *http.Request)
	// label, when set, is the label of the signature signed again.
	label string
	// after edits the signed request.
	after func(r *http.Request)
	// key signs instead of the node's key.
	key ed25519.PrivateKey
}

// signedRequest returns a request as a server receives it, signed as sc says.
func signedRequest(t *testing.T, priv ed25519.PrivateKey, body []byte, sc signCase) *http.Request {
	t.Helper()
	r := httptest.NewRequest("POST", "/workers/heartbeat", bytes.NewReader(body))
	r.Host = "127.0.0.1:8080"
	r.Header.Set("Content-Type", "application/json")
	key := priv
	if sc.key != nil {
		key = sc.key
	}
	created := sc.created
	if created.IsZero() {
		created = now
	}
	if err := replay.NewSigner(key, nil).SignAt(r, body, created, testNonce); err != nil {
		t.Fatalf("SignAt: %v", err)
	}
	if sc.params != nil || sc.before != nil || sc.label != "" {
		sig, err := replay.ParseSignature(r.Header, replay.Label)
		if err != nil {
			t.Fatal(err)
		}
		if sc.params != nil {
			sc.params(sig.Params)
		}
		if sc.before != nil {
			sc.before(r)
		}
		label := replay.Label
		if sc.label != "" {
			label = sc.label
		}
		if err := replay.SignRequest(r, label, sig.Params, key); err != nil {
			t.Fatalf("SignRequest: %v", err)
		}
	}
	if sc.after != nil {
		sc.after(r)
	}
	return r
}

func setParam(name string, v any) func(p *replay.SignatureParams) {
	return func(p *replay.SignatureParams) {
		for i := range p.Params {
			if p.Params[i].Name == name {
				p.Params[i].Value = v
				return
			}
		}
		panic("no parameter " + name)
	}
}

func deleteParam(name string) func(p *replay.SignatureParams) {
	return func(p *replay.SignatureParams) {
		for i := range p.Params {
			if p.Params[i].Name == name {
				p.Params = append(p.Params[:i], p.Params[i+1:]...)
				return
			}
		}
		panic("no parameter " + name)
	}
}

func addParam(name string, v any) func(p *replay.SignatureParams) {
	return func(p *replay.SignatureParams) { p.Params = append(p.Params, replay.Param{Name: name, Value: v}) }
}

func setComponents(c ...string) func(p *replay.SignatureParams) {
	return func(p *replay.SignatureParams) { p.Components = c }
}

// times sets created and expires, in seconds from now.
func times(created, expires int64) func(p *replay.SignatureParams) {
	return func(p *replay.SignatureParams) {
		setParam("created", now.Unix()+created)(p)
		setParam("expires", now.Unix()+expires)(p)
	}
}

// editField replaces old with new in the signed request's field name.
func editField(name, old, new string) func(r *http.Request) {
	return func(r *http.Request) {
		v := r.Header.Get(name)
		if !strings.Contains(v, old) {
			panic(fmt.Sprintf("%s %q has no %q", name, v, old))
		}
		r.Header.Set(name, strings.Replace(v, old, new, 1))
	}
}

func setField(name, value string) func(r *http.Request) {
	return func(r *http.Request) { r.Header.Set(name, value) }
}

func nonceOf(n int) string { return base64.RawURLEncoding.EncodeToString(make([]byte, n)) }

func TestVerify(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	_, otherPriv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 32)))
	otherPub := otherPriv.Public().(ed25519.PublicKey)
	body := []byte(`{"status":"idle","current_jobs":[],"metrics":{}}`)
	changed := []byte(`{"status":"busy","current_jobs":[],"metrics":{}}`)
	digest := func(b []byte) string { d, _ := replay.ContentDigest(replay.DigestSHA256, b); return d }
	created := strconv.FormatInt(now.Unix(), 10)

	tests := []struct {
		name string
		sign signCase
		// verifyBody defaults to body.
		verifyBody []byte
		want       error
	}{
		{name: "valid", want: nil},

		// The window.
		{name: "created now-301", sign: signCase{created: now.Add(-301 * time.Second)}, want: replay.ErrStaleTimestamp},
		{name: "created now+301", sign: signCase{created: now.Add(301 * time.Second)}, want: replay.ErrStaleTimestamp},
		{name: "created now-299", sign: signCase{created: now.Add(-299 * time.Second)}, want: nil},
		{name: "created now+299", sign: signCase{created: now.Add(299 * time.Second)}, want: nil},
		{name: "created now+300", sign: signCase{created: now.Add(300 * time.Second)}, want: nil},
		{name: "created missing", sign: signCase{params: deleteParam("created")}, want: replay.ErrMalformedSignature},
		{name: "created a string", sign: signCase{params: setParam("created", created)}, want: replay.ErrMalformedSignature},
		{name: "created a decimal", sign: signCase{after: editField("Signature-Input", "created="+created, "created="+created+".5")}, want: replay.ErrMalformedSignature},
		{name: "created a token", sign: signCase{after: editField("Signature-Input", "created="+created, "created=t"+created)}, want: replay.ErrMalformedSignature},
		{name: "expires past", sign: signCase{params: times(-200, -100)}, want: replay.ErrStaleTimestamp},
		{name: "expires now", sign: signCase{params: times(-300, 0)}, want: replay.ErrStaleTimestamp},
		{name: "expires now+1", sign: signCase{params: times(-299, 1)}, want: nil},
		{name: "expires equal to created", sign: signCase{params: times(0, 0)}, want: replay.ErrStaleTimestamp},
		{name: "expires before created", sign: signCase{params: times(0, -1)}, want: replay.ErrStaleTimestamp},
		{name: "expires created+301", sign: signCase{params: times(0, 301)}, want: replay.ErrStaleTimestamp},
		{name: "expires created+1", sign: signCase{params: times(0, 1)}, want: nil},
		{name: "expires missing", sign: signCase{params: deleteParam("expires")}, want: replay.ErrMalformedSignature},
		{name: "created negative", sign: signCase{params: times(-now.Unix()-10, -now.Unix()+100)}, want: replay.ErrStaleTimestamp},

		// The nonce.
		{name: "nonce 16 bytes", sign: signCase{params: setParam("nonce", nonceOf(16))}, want: nil},
		{name: "nonce 64 bytes", sign: signCase{params: setParam("nonce", nonceOf(64))}, want: nil},
		{name: "nonce too short", sign: signCase{params: setParam("nonce", nonceOf(15))}, want: replay.ErrMalformedSignature},
		{name: "nonce too long", sign: signCase{params: setParam("nonce", nonceOf(65))}, want: replay.ErrMalformedSignature},
		{name: "nonce padded", sign: signCase{params: setParam("nonce", base64.URLEncoding.EncodeToString(testNonce))}, want: replay.ErrMalformedSignature},
		{name: "nonce standard base64", sign: signCase{params: setParam("nonce", "AAECAwQFBgcICQoLDA0O+/")}, want: replay.ErrMalformedSignature},
		{name: "nonce not base64", sign: signCase{params: setParam("nonce", "AAECAwQFBgcICQoLDA0O.!")}, want: replay.ErrMalformedSignature},
		{name: "nonce not canonical", sign: signCase{params: setParam("nonce", "AAECAwQFBgcICQoLDA0ODx")}, want: replay.ErrMalformedSignature},
		{name: "nonce impossible length", sign: signCase{params: setParam("nonce", nonceOf(16)+"AAA")}, want: replay.ErrMalformedSignature},
		{name: "nonce missing", sign: signCase{params: deleteParam("nonce")}, want: replay.ErrMalformedSignature},

		// The body and Content-Digest.
		{name: "body changed", verifyBody: changed, want: replay.ErrBadDigest},
		{name: "body empty", verifyBody: []byte{}, want: replay.ErrBadDigest},
		{name: "content-digest missing", sign: signCase{after: func(r *http.Request) { r.Header.Del("Content-Digest") }}, want: replay.ErrMissingSignature},
		{name: "content-digest on two lines", sign: signCase{after: func(r *http.Request) { r.Header.Add("Content-Digest", r.Header.Get("Content-Digest")) }}, want: replay.ErrMalformedSignature},
		{name: "content-digest member twice", sign: signCase{before: setField("Content-Digest", digest(body)+", "+digest(body))}, want: replay.ErrMalformedSignature},
		{name: "content-digest md5", sign: signCase{before: setField("Content-Digest", "md5=:ZajifYh5KDgxtmS9i38K1A==:")}, want: replay.ErrBadDigest},
		{name: "content-digest md5 and sha-256", sign: signCase{before: setField("Content-Digest", digest(body)+", md5=:ZajifYh5KDgxtmS9i38K1A==:")}, want: replay.ErrBadDigest},
		{name: "content-digest sha-512", sign: signCase{before: func(r *http.Request) {
			d, _ := replay.ContentDigest(replay.DigestSHA512, body)
			r.Header.Set("Content-Digest", d)
		}}, want: nil},
		{name: "content-digest does not parse", sign: signCase{before: setField("Content-Digest", "sha-256=:abc")}, want: replay.ErrMalformedSignature},
		{name: "digest of changed body, not signed again", sign: signCase{after: setField("Content-Digest", digest(changed))}, verifyBody: changed, want: replay.ErrBadSignature},

		// Covered components changed after signing.
		{name: "method changed", sign: signCase{after: func(r *http.Request) { r.Method = "PUT" }}, want: replay.ErrBadSignature},
		{name: "path changed", sign: signCase{after: func(r *http.Request) { r.RequestURI = "/workers/heartbeaT" }}, want: replay.ErrBadSignature},
		{name: "query added", sign: signCase{after: func(r *http.Request) { r.RequestURI += "?trace=1" }}, want: replay.ErrBadSignature},
		{name: "empty query added", sign: signCase{after: func(r *http.Request) { r.RequestURI += "?" }}, want: nil},
		{name: "authority changed", sign: signCase{after: func(r *http.Request) { r.Host = "127.0.0.1:8081" }}, want: replay.ErrBadSignature},
		{name: "content-type changed", sign: signCase{after: setField("Content-Type", "application/jsonx")}, want: replay.ErrBadSignature},
		{name: "content-type missing", sign: signCase{after: func(r *http.Request) { r.Header.Del("Content-Type") }}, want: replay.ErrMalformedSignature},
		{name: "router rewrote r.URL", sign: signCase{after: func(r *http.Request) { r.URL.Path = "/heartbeat" }}, want: nil},
		{name: "signature changed", sign: signCase{after: func(r *http.Request) {
			v := r.Header.Get("Signature")
			i := strings.Index(v, ":") + 5
			b := []byte(v)
			b[i] ^= 'A' ^ 'B' // stays base64
			if b[i] == v[i] {
				panic("unchanged")
			}
			r.Header.Set("Signature", string(b))
		}}, want: replay.ErrBadSignature},

		// Parameters.
		{name: "parameters in another order", sign: signCase{params: func(p *replay.SignatureParams) {
			for i, j := 0, len(p.Params)-1; i < j; i, j = i+1, j-1 {
				p.Params[i], p.Params[j] = p.Params[j], p.Params[i]
			}
		}}, want: nil},
		{name: "created twice", sign: signCase{after: editField("Signature-Input", ";tag=", ";created="+created+";tag=")}, want: replay.ErrMalformedSignature},
		{name: "nonce twice, other value", sign: signCase{after: editField("Signature-Input", ";tag=", `;nonce="`+nonceOf(20)+`";tag=`)}, want: replay.ErrMalformedSignature},
		{name: "tag twice", sign: signCase{after: editField("Signature-Input", ";tag=", `;tag="x";tag=`)}, want: replay.ErrMalformedSignature},
		{name: "keyid missing", sign: signCase{params: deleteParam("keyid")}, want: replay.ErrMalformedSignature},
		{name: "tag missing", sign: signCase{params: deleteParam("tag")}, want: replay.ErrMalformedSignature},
		{name: "alg ed25519", sign: signCase{params: addParam("alg", "ed25519")}, want: replay.ErrMalformedSignature},
		{name: "unknown parameter", sign: signCase{params: addParam("foo", int64(1))}, want: replay.ErrMalformedSignature},
		{name: "keyid an integer", sign: signCase{params: setParam("keyid", int64(7))}, want: replay.ErrMalformedSignature},

		// Label, tag, components.
		{name: "wrong label", sign: signCase{label: "sig1"}, want: replay.ErrMalformedSignature},
		{name: "another label beside ours", sign: signCase{after: func(r *http.Request) {
			r.Header.Add("Signature-Input", `proxy=("@method");created=1`)
			r.Header.Add("Signature", `proxy=:AAAA:`)
		}}, want: nil},
		{name: "our label on two lines", sign: signCase{after: func(r *http.Request) {
			r.Header.Add("Signature-Input", r.Header.Get("Signature-Input"))
		}}, want: replay.ErrMalformedSignature},
		{name: "our signature on two lines", sign: signCase{after: func(r *http.Request) {
			r.Header.Add("Signature", r.Header.Get("Signature"))
		}}, want: replay.ErrMalformedSignature},
		{name: "wrong tag", sign: signCase{params: setParam("tag", "nodelane-worker/v2")}, want: replay.ErrMalformedSignature},
		{name: "tag a token", sign: signCase{after: editField("Signature-Input", `tag="nodelane-worker/v1"`, `tag=nodelane-worker/v1`)}, want: replay.ErrMalformedSignature},
		{name: "component missing", sign: signCase{params: setComponents("@method", "@authority", "@path", "@query", "content-digest")}, want: replay.ErrMalformedSignature},
		{name: "components reordered", sign: signCase{params: setComponents("@authority", "@method", "@path", "@query", "content-digest", "content-type")}, want: replay.ErrMalformedSignature},
		{name: "component added", sign: signCase{params: setComponents("@method", "@authority", "@path", "@query", "content-digest", "content-type", "@target-uri")}, want: replay.ErrMalformedSignature},
		{name: "component with a parameter", sign: signCase{after: editField("Signature-Input", `"@query"`, `"@query";req`)}, want: replay.ErrMalformedSignature},
		{name: "@request-target for @path and @query", sign: signCase{params: setComponents("@method", "@authority", "@request-target", "content-digest", "content-type")}, want: replay.ErrMalformedSignature},

		// Keys.
		{name: "keyid of another node", sign: signCase{params: setParam("keyid", replay.KeyID(otherPub))}, want: replay.ErrBadSignature},
		{name: "signed by another node", sign: signCase{key: otherPriv}, want: replay.ErrBadSignature},
		{name: "signed by another key, our keyid", sign: signCase{key: otherPriv, params: setParam("keyid", replay.KeyID(pub))}, want: replay.ErrBadSignature},

		// Presence.
		{name: "signature missing", sign: signCase{after: func(r *http.Request) { r.Header.Del("Signature") }}, want: replay.ErrMissingSignature},
		{name: "signature-input missing", sign: signCase{after: func(r *http.Request) { r.Header.Del("Signature-Input") }}, want: replay.ErrMissingSignature},
		{name: "all missing", sign: signCase{after: func(r *http.Request) {
			r.Header.Del("Signature")
			r.Header.Del("Signature-Input")
			r.Header.Del("Content-Digest")
		}}, want: replay.ErrMissingSignature},
		{name: "signature-input does not parse", sign: signCase{after: setField("Signature-Input", `nodelane=("@method"`)}, want: replay.ErrMalformedSignature},
		{name: "signature empty", sign: signCase{after: setField("Signature", ``)}, want: replay.ErrMalformedSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := signedRequest(t, priv, body, tc.sign)
			vb := body
			if tc.verifyBody != nil {
				vb = tc.verifyBody
			}
			v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return now }})
			_, err := v.Verify(context.Background(), r, vb, "node-1", pub)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v\nSignature-Input: %s", err, tc.want, r.Header.Get("Signature-Input"))
			}
			if err != nil {
				return
			}
			// Each accepted request is accepted once.
			if _, err := v.Verify(context.Background(), r, vb, "node-1", pub); !errors.Is(err, replay.ErrReplayedNonce) {
				t.Errorf("Verify again = %v, want ErrReplayedNonce", err)
			}
		})
	}
}

// TestVerifyErrorsAreDistinct checks that the sentinels are distinct, so
// that the HTTP layer can map each to its own code.
func TestVerifyErrorsAreDistinct(t *testing.T) {
	t.Parallel()
	errs := []error{
		replay.ErrMissingSignature, replay.ErrMalformedSignature, replay.ErrBadDigest, replay.ErrBadSignature,
		replay.ErrStaleTimestamp, replay.ErrReplayedNonce, replay.ErrQuota, replay.ErrUnavailable,
	}
	for i, a := range errs {
		for j, b := range errs {
			if (i == j) != errors.Is(a, b) {
				t.Errorf("errors.Is(%v, %v) = %t", a, b, errors.Is(a, b))
			}
		}
	}
}

// failingStore answers every Insert with err.
type failingStore struct{ err error }

func (s failingStore) Insert(context.Context, string, string, time.Time, time.Time) error {
	return s.err
}
func (s failingStore) Collect(context.Context, time.Time) (int, error) { return 0, s.err }

func TestVerifyStoreErrors(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{}`)
	down := errors.New("connection refused")
	tests := []struct {
		name     string
		storeErr error
		want     []error
	}{
		{"replayed", fmt.Errorf("bunstore: %w", replay.ErrReplayedNonce), []error{replay.ErrReplayedNonce}},
		{"quota", replay.ErrQuota, []error{replay.ErrQuota}},
		{"down", down, []error{replay.ErrUnavailable, down}},
		{"canceled", context.Canceled, []error{replay.ErrUnavailable, context.Canceled}},
		{"already unavailable", fmt.Errorf("x: %w", replay.ErrUnavailable), []error{replay.ErrUnavailable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := replay.NewVerifier(failingStore{tc.storeErr}, &replay.VerifierConfig{Now: func() time.Time { return now }})
			r := signedRequest(t, priv, body, signCase{})
			vd, err := v.Verify(context.Background(), r, body, "node-1", pub)
			if vd != nil {
				t.Errorf("Verify returned %+v with error %v", vd, err)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("Verify = %v, want it to match %v", err, w)
				}
			}
			if _, err := v.Collect(context.Background()); !errors.Is(err, replay.ErrUnavailable) {
				t.Errorf("Collect = %v, want ErrUnavailable", err)
			}
		})
	}
}

// recordingStore records the Inserts it gets and the context they carry.
type recordingStore struct {
	replay.Store
	ctxValues []any
	inserts   []string
}

type ctxKey struct{}

func (s *recordingStore) Insert(ctx context.Context, node, nonce string, expires, now time.Time) error {
	s.ctxValues = append(s.ctxValues, ctx.Value(ctxKey{}))
	s.inserts = append(s.inserts, fmt.Sprintf("%s %s %s %s", node, nonce, expires.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano)))
	return s.Store.Insert(ctx, node, nonce, expires, now)
}

func TestCheckThenConsume(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{}`)
	store := &recordingStore{Store: replay.NewMemoryStore(nil)}
	clock := now.Add(1234567 * time.Nanosecond)
	v := replay.NewVerifier(store, &replay.VerifierConfig{Now: func() time.Time { return clock }})
	r := signedRequest(t, priv, body, signCase{})

	vd, err := v.Check(r, body, pub)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	// Check consumes nothing: it passes again.
	if _, err := v.Check(r, body, pub); err != nil {
		t.Fatalf("Check again: %v", err)
	}
	if len(store.inserts) != 0 {
		t.Fatalf("Check inserted %q", store.inserts)
	}
	ctx := context.WithValue(context.Background(), ctxKey{}, "tx-1")
	if err := v.Consume(ctx, "node-1", vd.Nonce, vd.Expires); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if err := v.Consume(ctx, "node-1", vd.Nonce, vd.Expires); !errors.Is(err, replay.ErrReplayedNonce) {
		t.Fatalf("Consume again = %v, want ErrReplayedNonce", err)
	}
	if _, err := v.Verify(ctx, r, body, "node-1", pub); !errors.Is(err, replay.ErrReplayedNonce) {
		t.Fatalf("Verify after Consume = %v, want ErrReplayedNonce", err)
	}
	// The store got the request's context, the signature's expiry and the
	// clock in UTC, truncated to microseconds.
	want := "node-1 AAECAwQFBgcICQoLDA0ODw 2026-01-01T00:05:00Z 2026-01-01T00:00:00.001234Z"
	if diff := cmp.Diff([]string{want, want, want}, store.inserts); diff != "" {
		t.Errorf("inserts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]any{"tx-1", "tx-1", "tx-1"}, store.ctxValues); diff != "" {
		t.Errorf("context values seen by the store (-want +got):\n%s", diff)
	}
}

func TestVerifierCollect(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{}`)
	store := replay.NewMemoryStore(nil)
	clock := now
	v := replay.NewVerifier(store, &replay.VerifierConfig{Now: func() time.Time { return clock }})
	if _, err := v.Verify(context.Background(), signedRequest(t, priv, body, signCase{}), body, "node-1", pub); err != nil {
		t.Fatal(err)
	}
	// The nonce expires at now+300 s and is kept one window longer.
	for _, tc := range []struct {
		at   time.Duration
		want int
	}{{300 * time.Second, 0}, {600*time.Second - time.Microsecond, 0}, {600 * time.Second, 1}} {
		clock = now.Add(tc.at)
		if n, err := v.Collect(context.Background()); n != tc.want || err != nil {
			t.Errorf("at now+%s: Collect = %d, %v; want %d", tc.at, n, err, tc.want)
		}
	}
}

func TestVerifyWindowConfig(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{}`)
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Window: 60 * time.Second, Now: func() time.Time { return now }})
	for _, tc := range []struct {
		name string
		sign signCase
		want error
	}{
		{"created now-59", signCase{params: times(-59, 1)}, nil},
		{"created now+60", signCase{params: times(60, 61)}, nil},
		{"created now+61", signCase{params: times(61, 62)}, replay.ErrStaleTimestamp},
		{"lifetime 60", signCase{params: times(0, 60)}, nil},
		{"lifetime 61", signCase{params: times(0, 61)}, replay.ErrStaleTimestamp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := v.Verify(context.Background(), signedRequest(t, priv, body, tc.sign), body, tc.name, pub)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifyBadPublicKey(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{}`)
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return now }})
	for _, k := range []ed25519.PublicKey{nil, pub[:31], append(pub[:32:32], 0)} {
		if _, err := v.Check(signedRequest(t, priv, body, signCase{}), body, k); !errors.Is(err, replay.ErrBadSignature) {
			t.Errorf("Check with a %d-byte key = %v, want ErrBadSignature", len(k), err)
		}
	}
}

func TestSigner(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	body := []byte(`{"a":1}`)
	clock := now.Add(700 * time.Millisecond)
	rnd := bytes.NewReader(bytes.Repeat([]byte{0xab}, 1000))
	s := replay.NewSigner(priv, &replay.SignerConfig{Lifetime: 60 * time.Second, NonceSize: 32, Now: func() time.Time { return clock }, Rand: rnd})
	if s.KeyID() != replay.KeyID(pub) {
		t.Errorf("Signer.KeyID = %q, want %q", s.KeyID(), replay.KeyID(pub))
	}
	r, _ := http.NewRequest("POST", "https://cp.example:443/api/nl/workers/heartbeat", bytes.NewReader(body))
	if err := s.Sign(r, body); err == nil {
		t.Error("Sign without Content-Type succeeded")
	}
	r.Header.Set("Content-Type", "application/json")
	if err := s.Sign(r, body); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{0xab}, 32))
	want := `nodelane=("@method" "@authority" "@path" "@query" "content-digest" "content-type");created=1767225600;expires=1767225660;nonce="` +
		nonce + `";keyid="` + replay.KeyID(pub) + `";tag="nodelane-worker/v1"`
	if got := r.Header.Get("Signature-Input"); got != want {
		t.Errorf("Signature-Input:\n got %s\nwant %s", got, want)
	}
	// The server sees the request line the client wrote.
	sr := httptest.NewRequest("POST", "/api/nl/workers/heartbeat", bytes.NewReader(body))
	sr.Host = "cp.example"
	sr.Header = r.Header.Clone()
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return clock }})
	if _, err := v.Verify(context.Background(), sr, body, "n", pub); err != nil {
		t.Errorf("Verify: %v", err)
	}

	for _, tc := range []struct {
		name   string
		signer *replay.Signer
		nonce  []byte
	}{
		{"nonce 15 bytes", s, make([]byte, 15)},
		{"nonce 65 bytes", s, make([]byte, 65)},
		{"short key", replay.NewSigner(priv[:32], nil), testNonce},
	} {
		if err := tc.signer.SignAt(r, body, now, tc.nonce); err == nil {
			t.Errorf("%s: SignAt succeeded", tc.name)
		}
	}
	if err := replay.NewSigner(priv, &replay.SignerConfig{Rand: bytes.NewReader(nil)}).Sign(r, body); err == nil {
		t.Error("Sign with an empty Rand succeeded")
	}
}

// TestHTTPServer signs requests with a real client and verifies them in a
// handler mounted under http.StripPrefix: the signature covers the
// request-target as sent, which the prefix does not change.
func TestHTTPServer(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	v := replay.NewVerifier(replay.NewMemoryStore(nil), nil)
	var paths []string
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		paths = append(paths, r.URL.Path)
		if _, err := v.Verify(r.Context(), r, body, "node-1", pub); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux := http.NewServeMux()
	mux.Handle("/api/nl/", http.StripPrefix("/api/nl", api))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	signer := replay.NewSigner(priv, nil)
	send := func(target string, body []byte, edit func(*http.Request)) (int, string) {
		t.Helper()
		r, err := http.NewRequest("POST", srv.URL+target, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		if err := signer.Sign(r, body); err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(r)
		}
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(msg))
	}
	body := []byte(`{"supported_job_types":["status_check"]}`)
	for _, tc := range []struct {
		name, target string
		edit         func(*http.Request)
		want         int
	}{
		{"plain", "/api/nl/workers/jobs/lease", nil, http.StatusNoContent},
		{"query", "/api/nl/workers/jobs/lease?trace=1&x=a%20b", nil, http.StatusNoContent},
		{"escaped path", "/api/nl/workers/jobs/a%2Fb%20c/accept", nil, http.StatusNoContent},
		{"empty query", "/api/nl/workers/heartbeat?", nil, http.StatusNoContent},
		{"path changed after signing", "/api/nl/workers/jobs/lease", func(r *http.Request) { r.URL.Path = "/api/nl/workers/jobs/leasE" }, http.StatusUnauthorized},
		{"query changed after signing", "/api/nl/workers/jobs/lease?trace=1", func(r *http.Request) { r.URL.RawQuery = "trace=2" }, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, msg := send(tc.target, body, tc.edit); code != tc.want {
				t.Errorf("status %d (%s), want %d", code, msg, tc.want)
			}
		})
	}
	if len(paths) == 0 || strings.HasPrefix(paths[0], "/api/nl") {
		t.Errorf("handler saw paths %q: the prefix was not stripped", paths)
	}
}
