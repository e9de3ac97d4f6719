package replay_test

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// vectorFile is a parsed file of testdata/: named sections, in cases.
type vectorFile struct {
	// cases[0] holds the sections before the first "=== CASE" line.
	cases []vectorCase
}

type vectorCase struct {
	name     string
	sections map[string]string
}

// sectionLine matches a section header: NAME, an optional parenthesised
// note, a colon, and optionally the value on the same line.
var sectionLine = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)(?: \([^)]*\))?:(?: (.*))?$`)

// readVectors parses a vector file. A section's value is its inline value,
// or the lines up to the next section, case or end of file, joined with
// LF, without trailing blank lines. Lines starting with "#" are comments.
func readVectors(t *testing.T, path string) *vectorFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &vectorFile{cases: []vectorCase{{sections: map[string]string{}}}}
	var name string
	var block []string
	flush := func() {
		if name == "" {
			return
		}
		for len(block) > 0 && block[len(block)-1] == "" {
			block = block[:len(block)-1]
		}
		f.cases[len(f.cases)-1].sections[name] = strings.Join(block, "\n")
		name, block = "", nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "=== CASE "):
			flush()
			f.cases = append(f.cases, vectorCase{name: strings.TrimPrefix(line, "=== CASE "), sections: map[string]string{}})
		case sectionLine.MatchString(line):
			flush()
			m := sectionLine.FindStringSubmatch(line)
			if m[2] != "" {
				f.cases[len(f.cases)-1].sections[m[1]] = m[2]
			} else {
				name = m[1]
			}
		case name != "":
			block = append(block, line)
		case line != "":
			t.Fatalf("%s: line outside any section: %q", path, line)
		}
	}
	flush()
	return f
}

// get returns the section name of case c, failing the test if it is absent.
func (c vectorCase) get(t *testing.T, name string) string {
	t.Helper()
	v, ok := c.sections[name]
	if !ok || v == "" {
		t.Fatalf("vector case %q has no section %s", c.name, name)
	}
	return v
}

// find returns the section name from whichever case has it.
func (f *vectorFile) find(t *testing.T, name string) string {
	t.Helper()
	for _, c := range f.cases {
		if v, ok := c.sections[name]; ok {
			return v
		}
	}
	t.Fatalf("no vector case has section %s", name)
	return ""
}

// parseRequest reads a request as a server receives it: head, blank line,
// body. It returns the body separately, and leaves r.Body empty.
func parseRequest(t *testing.T, text string) (*http.Request, []byte) {
	t.Helper()
	head, body, _ := strings.Cut(text, "\n\n")
	wire := strings.ReplaceAll(head, "\n", "\r\n") + "\r\n\r\n"
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(wire)))
	if err != nil {
		t.Fatalf("reading vector request: %v", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(nil))
	return r, []byte(body)
}

// headerValue splits a "Name: value" line and checks the name.
func headerValue(t *testing.T, line, name string) string {
	t.Helper()
	n, v, ok := strings.Cut(line, ": ")
	if !ok || !strings.EqualFold(n, name) {
		t.Fatalf("want a %s header line, got %q", name, line)
	}
	return v
}

// testKeys returns the RFC 9421 B.1.4 key pair of the vector file.
func testKeys(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	v := readVectors(t, "testdata/rfc9421-b26-ed25519.txt").cases[0]
	blk, _ := pem.Decode([]byte(v.get(t, "PRIVATE_KEY_PKCS8_PEM")))
	if blk == nil {
		t.Fatal("no PEM block in PRIVATE_KEY_PKCS8_PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		t.Fatalf("private key is a %T", k)
	}
	blk, _ = pem.Decode([]byte(v.get(t, "PUBLIC_KEY_SPKI_PEM")))
	if blk == nil {
		t.Fatal("no PEM block in PUBLIC_KEY_SPKI_PEM")
	}
	k, err = x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		t.Fatalf("public key is a %T", k)
	}
	if !pub.Equal(priv.Public()) {
		t.Fatal("the vector's public key is not its private key's")
	}
	return priv, pub
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
