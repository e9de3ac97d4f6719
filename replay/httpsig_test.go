package replay_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/replay"
)

// b26 is RFC 9421 Appendix B.2.6, read from testdata.
type b26 struct {
	request, base, sigInput, sig string
	label                        string
}

func readB26(t *testing.T) b26 {
	t.Helper()
	v := readVectors(t, "testdata/rfc9421-b26-ed25519.txt").cases[0]
	b := b26{
		request:  v.get(t, "REQUEST"),
		base:     v.get(t, "SIGNATURE_BASE"),
		sigInput: headerValue(t, v.get(t, "SIGNATURE_INPUT_HEADER"), "Signature-Input"),
		sig:      headerValue(t, v.get(t, "SIGNATURE_HEADER"), "Signature"),
	}
	b.label, _, _ = strings.Cut(b.sigInput, "=")
	return b
}

// signedB26 returns the vector's request with its signature, and the
// signature as parsed.
func signedB26(t *testing.T, b b26) (*http.Request, *replay.Signature) {
	t.Helper()
	r, _ := parseRequest(t, b.request)
	r.Header.Set("Signature-Input", b.sigInput)
	r.Header.Set("Signature", b.sig)
	sig, err := replay.ParseSignature(r.Header, b.label)
	if err != nil {
		t.Fatalf("ParseSignature: %v", err)
	}
	return r, sig
}

func TestRFC9421B26(t *testing.T) {
	t.Parallel()
	priv, pub := testKeys(t)
	b := readB26(t)
	r, sig := signedB26(t, b)

	base, err := replay.SignatureBase(r, sig.Params)
	if err != nil {
		t.Fatalf("SignatureBase: %v", err)
	}
	if diff := cmp.Diff(b.base, string(base)); diff != "" {
		t.Errorf("signature base (-vector +got):\n%s", diff)
	}

	// Signing the unsigned request with the vector's parameters gives the
	// vector's fields byte for byte.
	fresh, _ := parseRequest(t, b.request)
	if err := replay.SignRequest(fresh, b.label, sig.Params, priv); err != nil {
		t.Fatalf("SignRequest: %v", err)
	}
	got := []string{fresh.Header.Get("Signature-Input"), fresh.Header.Get("Signature")}
	if diff := cmp.Diff([]string{b.sigInput, b.sig}, got); diff != "" {
		t.Errorf("Signature-Input, Signature (-vector +got):\n%s", diff)
	}

	if err := replay.VerifyRequest(r, sig, pub); err != nil {
		t.Errorf("VerifyRequest(vector) = %v", err)
	}
}

func TestRFC9421B26ContentDigest(t *testing.T) {
	t.Parallel()
	b := readB26(t)
	r, body := parseRequest(t, b.request)
	want := r.Header.Get("Content-Digest")
	got, err := replay.ContentDigest(replay.DigestSHA512, body)
	if err != nil || got != want {
		t.Errorf("ContentDigest(sha-512) = %q, %v; want %q", got, err, want)
	}
	if err := replay.CheckContentDigest(want, body); err != nil {
		t.Errorf("CheckContentDigest(vector) = %v", err)
	}
	changed := append([]byte(nil), body...)
	changed[len(changed)-2]++
	if err := replay.CheckContentDigest(want, changed); !errors.Is(err, replay.ErrBadDigest) {
		t.Errorf("CheckContentDigest(changed body) = %v, want ErrBadDigest", err)
	}
}

// bump changes the byte at i of s to the next byte value.
func bump(s string, i int) string {
	b := []byte(s)
	b[i]++
	return string(b)
}

// TestRFC9421B26OneByte changes one byte of each covered component, of
// the signature parameters and of the signature: each change must be
// rejected, and changes to what is not covered must not be.
func TestRFC9421B26OneByte(t *testing.T) {
	t.Parallel()
	_, pub := testKeys(t)
	b := readB26(t)
	setHeader := func(name string, i int) func(*http.Request, *replay.Signature) {
		return func(r *http.Request, _ *replay.Signature) { r.Header.Set(name, bump(r.Header.Get(name), i)) }
	}
	tests := []struct {
		name   string
		change func(*http.Request, *replay.Signature)
		want   error
	}{
		{"unchanged", func(*http.Request, *replay.Signature) {}, nil},
		{"date", setHeader("Date", 5), replay.ErrBadSignature},
		{"date last byte", setHeader("Date", 28), replay.ErrBadSignature},
		{"method", func(r *http.Request, _ *replay.Signature) { r.Method = bump(r.Method, 3) }, replay.ErrBadSignature},
		{"path", func(r *http.Request, _ *replay.Signature) { r.RequestURI = bump(r.RequestURI, 3) }, replay.ErrBadSignature},
		{"authority", func(r *http.Request, _ *replay.Signature) { r.Host = bump(r.Host, 0) }, replay.ErrBadSignature},
		{"content-type", setHeader("Content-Type", 15), replay.ErrBadSignature},
		{"content-length", setHeader("Content-Length", 1), replay.ErrBadSignature},
		{"created", func(_ *http.Request, s *replay.Signature) {
			s.Params.Params[0].Value = s.Params.Params[0].Value.(int64) + 1
		}, replay.ErrBadSignature},
		{"keyid", func(_ *http.Request, s *replay.Signature) {
			s.Params.Params[1].Value = bump(s.Params.Params[1].Value.(string), 0)
		}, replay.ErrBadSignature},
		{"component order", func(_ *http.Request, s *replay.Signature) {
			c := s.Params.Components
			c[0], c[1] = c[1], c[0]
		}, replay.ErrBadSignature},
		{"covered header absent", func(r *http.Request, _ *replay.Signature) { r.Header.Del("Date") }, replay.ErrMalformedSignature},
		{"alg other than ed25519", func(_ *http.Request, s *replay.Signature) {
			s.Params.Params = append(s.Params.Params, replay.Param{Name: "alg", Value: "rsa-pss-sha512"})
		}, replay.ErrBadSignature},
		// Not covered by this signature, so not protected by it.
		{"query (not covered)", func(r *http.Request, _ *replay.Signature) { r.RequestURI = bump(r.RequestURI, 12) }, nil},
		{"content-digest (not covered)", setHeader("Content-Digest", 10), nil},
		{"host port :80 (normalised)", func(r *http.Request, _ *replay.Signature) { r.Host += ":80" }, nil},
		{"host case (normalised)", func(r *http.Request, _ *replay.Signature) { r.Host = strings.ToUpper(r.Host) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, sig := signedB26(t, b)
			tc.change(r, sig)
			if err := replay.VerifyRequest(r, sig, pub); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("VerifyRequest = %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("signature", func(t *testing.T) {
		t.Parallel()
		r, sig := signedB26(t, b)
		for i := range sig.Value {
			for _, bit := range []byte{0x01, 0x80} {
				s := *sig
				s.Value = append([]byte(nil), sig.Value...)
				s.Value[i] ^= bit
				if err := replay.VerifyRequest(r, &s, pub); !errors.Is(err, replay.ErrBadSignature) {
					t.Errorf("byte %d ^ %#x: VerifyRequest = %v, want ErrBadSignature", i, bit, err)
				}
			}
		}
		s := *sig
		s.Value = sig.Value[:63]
		if err := replay.VerifyRequest(r, &s, pub); !errors.Is(err, replay.ErrBadSignature) {
			t.Errorf("63-byte signature: VerifyRequest = %v, want ErrBadSignature", err)
		}
	})
}

func TestSignatureBaseComponents(t *testing.T) {
	t.Parallel()
	p := func(c ...string) *replay.SignatureParams {
		return &replay.SignatureParams{Components: c, Params: []replay.Param{{Name: "created", Value: int64(1)}}}
	}
	server := func(target string) func() *http.Request {
		return func() *http.Request {
			r, _ := http.ReadRequest(bufioReader("GET " + target + " HTTP/1.1\r\nHost: Example.COM:443\r\nX-A: one \r\nX-A:\ttwo\r\n\r\n"))
			return r
		}
	}
	client := func(url string) func() *http.Request {
		return func() *http.Request {
			r, _ := http.NewRequest("", url, nil)
			return r
		}
	}
	all := []string{"@method", "@authority", "@scheme", "@target-uri", "@request-target", "@path", "@query"}
	tests := []struct {
		name    string
		request func() *http.Request
		params  *replay.SignatureParams
		want    string // without the @signature-params line
		wantErr bool
	}{
		{
			name:    "server, origin-form",
			request: server("/a%2Fb/c?x=1&y=%20"),
			params:  p(all...),
			want: `"@method": GET
"@authority": example.com:443
"@scheme": http
"@target-uri": http://example.com:443/a%2Fb/c?x=1&y=%20
"@request-target": /a%2Fb/c?x=1&y=%20
"@path": /a%2Fb/c
"@query": ?x=1&y=%20
`,
		},
		{
			name:    "server, absolute-form",
			request: server("https://proxy.example/p?"),
			params:  p("@path", "@query", "@request-target"),
			want: `"@path": /p
"@query": ?
"@request-target": https://proxy.example/p?
`,
		},
		{
			name:    "client, default port, empty path",
			request: client("https://Example.com:443?q"),
			params:  p(all...),
			want: `"@method": GET
"@authority": example.com
"@scheme": https
"@target-uri": https://example.com/?q
"@request-target": /?q
"@path": /
"@query": ?q
`,
		},
		{
			name:    "header lines combined",
			request: server("/"),
			params:  p("x-a"),
			want:    "\"x-a\": one, two\n",
		},
		{name: "header absent", request: server("/"), params: p("x-b"), wantErr: true},
		{name: "header name not lowercase", request: server("/"), params: p("X-A"), wantErr: true},
		{name: "component twice", request: server("/"), params: p("@path", "@path"), wantErr: true},
		{name: "unknown derived component", request: server("/"), params: p("@status"), wantErr: true},
		{name: "signature-params as a component", request: server("/"), params: p("@signature-params"), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, err := replay.SignatureBase(tc.request(), tc.params)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("SignatureBase = %q, want an error", base)
				}
				return
			}
			if err != nil {
				t.Fatalf("SignatureBase: %v", err)
			}
			sp, _ := tc.params.Serialize()
			if diff := cmp.Diff(tc.want+`"@signature-params": `+sp, string(base)); diff != "" {
				t.Errorf("signature base (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSignatureBaseControlCharacters(t *testing.T) {
	t.Parallel()
	r, _ := http.NewRequest("POST", "http://example.com/", nil)
	r.Header.Set("X-A", "a\nb")
	p := &replay.SignatureParams{Components: []string{"x-a"}}
	if base, err := replay.SignatureBase(r, p); err == nil {
		t.Errorf("SignatureBase with a LF in a header = %q, want an error", base)
	}
}

func TestSerialize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		params  replay.SignatureParams
		want    string
		wantErr bool
	}{
		{"empty", replay.SignatureParams{}, "()", false},
		{"escapes", replay.SignatureParams{
			Components: []string{`a"b\c`},
			Params:     []replay.Param{{Name: "n", Value: `x"y`}, {Name: "i", Value: int64(-5)}},
		}, `("a\"b\\c");n="x\"y";i=-5`, false},
		{"integer too large", replay.SignatureParams{Params: []replay.Param{{Name: "n", Value: int64(1e15)}}}, "", true},
		{"int, not int64", replay.SignatureParams{Params: []replay.Param{{Name: "n", Value: 1}}}, "", true},
		{"bad key", replay.SignatureParams{Params: []replay.Param{{Name: "Created", Value: int64(1)}}}, "", true},
		{"non-ASCII string", replay.SignatureParams{Params: []replay.Param{{Name: "n", Value: "é"}}}, "", true},
		{"control character in component", replay.SignatureParams{Components: []string{"a\tb"}}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.params.Serialize()
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("Serialize() = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestCheckContentDigest(t *testing.T) {
	t.Parallel()
	body := []byte(`{"status":"idle"}`)
	s256, _ := replay.ContentDigest(replay.DigestSHA256, body)
	s512, _ := replay.ContentDigest(replay.DigestSHA512, body)
	other, _ := replay.ContentDigest(replay.DigestSHA256, []byte("{}"))
	md5 := "md5=:ZajifYh5KDgxtmS9i38K1A==:"
	tests := []struct {
		name, field string
		want        error
	}{
		{"sha-256", s256, nil},
		{"sha-512", s512, nil},
		{"both", s256 + ", " + s512, nil},
		{"other body", other, replay.ErrBadDigest},
		{"one of two wrong", s512 + ", " + other, replay.ErrBadDigest},
		{"md5", md5, replay.ErrBadDigest},
		{"md5 and sha-256", s256 + ", " + md5, replay.ErrBadDigest},
		{"sha-256 truncated", "sha-256=:" + strings.Repeat("A", 40) + ":", replay.ErrBadDigest},
		{"empty", "", replay.ErrBadDigest},
		{"member twice", s256 + ", " + s256, replay.ErrMalformedSignature},
		{"member twice, last wrong", s256 + ", " + other, replay.ErrMalformedSignature},
		{"not a dictionary", "sha-256", replay.ErrMalformedSignature},
		{"string value", `sha-256="abc"`, replay.ErrMalformedSignature},
		{"inner list", "sha-256=(:AAAA:)", replay.ErrMalformedSignature},
		{"parameters", s256 + ";x=1", replay.ErrMalformedSignature},
		{"bad base64", "sha-256=:a*b:", replay.ErrMalformedSignature},
		{"uppercase algorithm", "SHA-256" + s256[7:], replay.ErrMalformedSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := replay.CheckContentDigest(tc.field, body)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("CheckContentDigest(%q) = %v, want %v", tc.field, err, tc.want)
			}
		})
	}
	if _, err := replay.ContentDigest("md5", body); !errors.Is(err, replay.ErrBadDigest) {
		t.Errorf("ContentDigest(md5) = %v, want ErrBadDigest", err)
	}
}

func TestParseSignature(t *testing.T) {
	t.Parallel()
	in := `a=("@method");created=1;keyid="k"`
	sig := `a=:` + strings.Repeat("A", 86) + `==:`
	tests := []struct {
		name     string
		in, sigs []string
		want     error
	}{
		{"ok", []string{in}, []string{sig}, nil},
		{"other labels", []string{`b=();x=1, ` + in}, []string{sig + `, b=:AAAA:`}, nil},
		{"two lines, two labels", []string{in, `b=()`}, []string{sig, `b=:AAAA:`}, nil},
		{"no input", nil, []string{sig}, replay.ErrMissingSignature},
		{"no signature", []string{in}, nil, replay.ErrMissingSignature},
		{"label absent from input", []string{`b=()`}, []string{sig}, replay.ErrMalformedSignature},
		{"label absent from signature", []string{in}, []string{`b=:AAAA:`}, replay.ErrMalformedSignature},
		{"input label twice", []string{in + ", " + in}, []string{sig}, replay.ErrMalformedSignature},
		{"input label on two lines", []string{in, in}, []string{sig}, replay.ErrMalformedSignature},
		{"signature label twice", []string{in}, []string{sig + "," + sig}, replay.ErrMalformedSignature},
		{"signature label on two lines", []string{in}, []string{sig, sig}, replay.ErrMalformedSignature},
		{"parameter twice", []string{in + `;created=1`}, []string{sig}, replay.ErrMalformedSignature},
		{"parameter twice in another label", []string{in + `, b=();x=1;x=2`}, []string{sig}, replay.ErrMalformedSignature},
		{"component parameter twice", []string{`a=("@method";req;req)`}, []string{sig}, replay.ErrMalformedSignature},
		{"component parameter", []string{`a=("@method";req)`}, []string{sig}, replay.ErrMalformedSignature},
		{"component not a string", []string{`a=(method)`}, []string{sig}, replay.ErrMalformedSignature},
		{"input is an item", []string{`a="@method"`}, []string{sig}, replay.ErrMalformedSignature},
		{"decimal parameter", []string{`a=();created=1.5`}, []string{sig}, replay.ErrMalformedSignature},
		{"token parameter", []string{`a=();tag=x`}, []string{sig}, replay.ErrMalformedSignature},
		{"boolean parameter", []string{`a=();tag`}, []string{sig}, replay.ErrMalformedSignature},
		{"signature is a string", []string{in}, []string{`a="abc"`}, replay.ErrMalformedSignature},
		{"signature has parameters", []string{in}, []string{sig + `;x=1`}, replay.ErrMalformedSignature},
		{"input does not parse", []string{`a=("@method"`}, []string{sig}, replay.ErrMalformedSignature},
		{"signature does not parse", []string{in}, []string{`a=:AAAA`}, replay.ErrMalformedSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, v := range tc.in {
				h.Add("Signature-Input", v)
			}
			for _, v := range tc.sigs {
				h.Add("Signature", v)
			}
			s, err := replay.ParseSignature(h, "a")
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("ParseSignature = %v, want %v", err, tc.want)
			}
			if err != nil {
				return
			}
			want := &replay.Signature{
				Label: "a",
				Params: &replay.SignatureParams{
					Components: []string{"@method"},
					Params:     []replay.Param{{Name: "created", Value: int64(1)}, {Name: "keyid", Value: "k"}},
				},
				Value: make([]byte, 64),
			}
			if diff := cmp.Diff(want, s); diff != "" {
				t.Errorf("ParseSignature (-want +got):\n%s", diff)
			}
		})
	}
}
