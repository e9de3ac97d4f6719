package credential

import (
	"testing"
	"time"
)

// BenchmarkVerify measures Verify on the MemoryStore: a good token, and
// the two refusals that must cost the same.
func BenchmarkVerify(b *testing.B) {
	e := newEnv(b)
	p := e.principal(b, "n")
	tok, _ := e.mint(b, p.ID, time.Hour, ScopeNodePoll, ScopeNodeHeartbeat)
	id, secret, _ := parseToken(tok)
	otherID, otherSecret := id, secret
	otherID[0] ^= 1
	otherSecret[0] ^= 1
	cases := []struct {
		name  string
		token string
		ok    bool
	}{
		{"valid", tok, true},
		{"unknown-id", formatToken(&otherID, &secret), false},
		{"wrong-secret", formatToken(&id, &otherSecret), false},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, err := e.is.Verify(e.ctx, bc.token, ScopeNodePoll)
				if (err == nil) != bc.ok {
					b.Fatal(err)
				}
			}
		})
	}
}
