package replay_test

import (
	"crypto/tls"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/replay"
)

// ComponentValue gives each component the value its line of the
// signature base has.
func TestComponentValue(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("POST", "/api/workers/heartbeat?a=%20b", strings.NewReader("{}"))
	r.Host = "CP.example.com:443"
	r.TLS = &tls.ConnectionState{}
	r.URL.Path = "/workers/heartbeat" // a StripPrefix: the values are as received
	r.Header.Set("Content-Type", " application/json\t")
	p := &replay.SignatureParams{Components: []string{"@authority", "@path", "@query", "content-type"}}
	base, err := replay.SignatureBase(r, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Components {
		v, err := replay.ComponentValue(r, c)
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if line := `"` + c + `": ` + v + "\n"; !strings.Contains(string(base), line) {
			t.Errorf("%s: %q is not a line of the signature base\n%s", c, line, base)
		}
	}
	if v, _ := replay.ComponentValue(r, "@authority"); v != "cp.example.com" {
		t.Errorf("@authority %q, want cp.example.com", v)
	}
	if _, err := replay.ComponentValue(r, "content-digest"); err == nil {
		t.Error("an absent header has a value")
	}
	if _, err := replay.ComponentValue(r, "@nope"); err == nil {
		t.Error("an unknown derived component has a value")
	}
}
