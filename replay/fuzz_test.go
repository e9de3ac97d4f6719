package replay

import (
	"encoding/base64"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
)

// FuzzParseSignature drives the parsing of Signature-Input, Signature and
// Content-Digest (each may hold several field lines, separated by LF) and
// the profile's checks. It checks that nothing panics, that every error is
// one of the parse-stage sentinels, that the raw duplicate scanner agrees
// with httpsfv on every field httpsfv accepts, and that whatever the
// profile accepts re-serialises to a field that parses to the same
// signature, and serialises the same again.
func FuzzParseSignature(f *testing.F) {
	const (
		in  = `nodelane=("@method" "@authority" "@path" "@query" "content-digest" "content-type");created=1767225600;expires=1767225900;nonce="AAECAwQFBgcICQoLDA0ODw";keyid="sWwtG-rRJiY5dk_bDuTTd0WZM2vUk0BM2ksRNsWfIGI";tag="nodelane-worker/v1"`
		sig = `nodelane=:CjaO2K3rzHv8FBtKD71iv6Wds/6NisenyXX1zGx01a0BLYobv+eKlwPJ8bmxsTcUrOAsGbZLWOnlS+6fKLpvBQ==:`
		cd  = `sha-256=:woY7f9yQNOCuXNdQFEw5bRHbE/ggIdYECdjbnDkQ4IY=:`
	)
	f.Add(in, sig, cd)
	f.Add(in+";created=1", sig, cd)
	f.Add(in+"\n"+in, sig+", "+sig, cd+", "+cd)
	f.Add(`sig-b26=("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519"`,
		`sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:`, `md5=:AAAA:`)
	f.Add(`a=(b:c "x";p=%"é";q=?1 :YQ==:;r=@-1), nodelane=()`, `a=t:/%, b;c=1.5`, `x=("a";sf)`)
	f.Fuzz(func(t *testing.T, input, signature, digest string) {
		h := http.Header{}
		for name, v := range map[string]string{"Signature-Input": input, "Signature": signature, "Content-Digest": digest} {
			if v == "" {
				continue
			}
			lines := strings.Split(v, "\n")
			for _, l := range lines {
				h.Add(name, l)
			}
			checkScanner(t, strings.Join(lines, ", "))
		}

		if cd := h.Values("Content-Digest"); len(cd) > 0 {
			err := CheckContentDigest(strings.Join(cd, ", "), []byte("body"))
			if err != nil && !errors.Is(err, ErrMalformedSignature) && !errors.Is(err, ErrBadDigest) {
				t.Fatalf("CheckContentDigest: unexpected error %v", err)
			}
		}

		ps, err := parseProfile(h)
		if err != nil {
			if !errors.Is(err, ErrMissingSignature) && !errors.Is(err, ErrMalformedSignature) {
				t.Fatalf("parseProfile: unexpected error %v", err)
			}
			return
		}
		ser, err := ps.sig.Params.Serialize()
		if err != nil {
			t.Fatalf("accepted parameters do not serialise: %v", err)
		}
		// httpsfv serialises the member the same way.
		d, _ := httpsfv.UnmarshalDictionary(h.Values("Signature-Input"))
		m, _ := d.Get(Label)
		if want, err := httpsfv.Marshal(m.(httpsfv.InnerList)); err != nil || want != ser {
			t.Fatalf("Serialize = %q, httpsfv.Marshal = %q, %v", ser, want, err)
		}
		h2 := http.Header{}
		h2.Set("Signature-Input", Label+"="+ser)
		h2.Set("Signature", Label+"=:"+base64.StdEncoding.EncodeToString(ps.sig.Value)+":")
		ps2, err := parseProfile(h2)
		if err != nil {
			t.Fatalf("re-serialised signature %q does not parse: %v", h2, err)
		}
		if !reflect.DeepEqual(ps, ps2) {
			t.Fatalf("re-serialised signature parses differently:\n%+v\n%+v", ps, ps2)
		}
		if ser2, _ := ps2.sig.Params.Serialize(); ser2 != ser {
			t.Fatalf("serialisation not stable: %q then %q", ser, ser2)
		}
		if ps.created == 0 && ps.expires == 0 && ps.nonce == "" {
			t.Fatal("accepted a signature without parameters")
		}
	})
}

// checkScanner checks that on every dictionary httpsfv accepts, the raw
// scanner either reports a duplicate or finds the same member keys and as
// many parameters.
func checkScanner(t *testing.T, field string) {
	t.Helper()
	d, err := httpsfv.UnmarshalDictionary([]string{field})
	if err != nil {
		if _, err := parseDictionary([]string{field}); err == nil {
			t.Fatalf("parseDictionary accepted %q, which httpsfv rejects", field)
		}
		return
	}
	sc := rawScanner{s: field}
	keys, err := sc.dictionary()
	if err != nil {
		if errors.Is(err, errRawSyntax) {
			t.Fatalf("scanner fails on %q, which httpsfv accepts: %v", field, err)
		}
		return // a duplicate
	}
	if !slices.Equal(keys, d.Names()) {
		t.Fatalf("scanner keys %q, httpsfv keys %q, in %q", keys, d.Names(), field)
	}
	n := 0
	count := func(p *httpsfv.Params) {
		if p != nil {
			n += len(p.Names())
		}
	}
	for _, k := range d.Names() {
		switch m, _ := d.Get(k); m := m.(type) {
		case httpsfv.Item:
			count(m.Params)
		case httpsfv.InnerList:
			count(m.Params)
			for _, it := range m.Items {
				count(it.Params)
			}
		}
	}
	if n != sc.nparams {
		t.Fatalf("scanner counts %d parameters, httpsfv %d, in %q", sc.nparams, n, field)
	}
}
