package credentialtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/credential"
)

var scopeTests = []test{
	{"EveryScope", testEveryScope},
	{"ExactScopes", testExactScopes},
	{"NoEscalation", testNoEscalation},
	{"NoOutliving", testNoOutliving},
}

func testEveryScope(t *testing.T, f *fixture) {
	all := credential.AllScopes()
	if len(all) != 10 {
		t.Fatalf("AllScopes has %d scopes, want 10", len(all))
	}
	node := f.principal(credential.KindNode, "node")
	op := f.principal(credential.KindOperator, "op")
	for _, s := range all {
		t.Run(string(s), func(t *testing.T) {
			f := f.sub(t)
			if got, err := credential.ParseScope(string(s)); err != nil || got != s {
				t.Fatalf("ParseScope(%q) = %q, %v", s, got, err)
			}
			owner := node
			if strings.HasPrefix(string(s), "operator:") {
				owner = op
			}
			tok, c := f.mint(owner.ID, 0, s)
			if d := cmp.Diff([]credential.Scope{s}, c.Scopes); d != "" {
				t.Fatalf("scopes (-want +got):\n%s", d)
			}
			p, vc := f.verify(f.is, "own scope", tok, s)
			if p.ID != owner.ID || vc.ID != c.ID {
				t.Fatalf("Verify = principal %s credential %s, want %s %s", p.ID, vc.ID, owner.ID, c.ID)
			}
			for _, other := range all {
				if other != s {
					f.refuse(f.is, "other scope", tok, other, credential.ErrInsufficientScope)
				}
			}
		})
	}
	// Several scopes, given out of order and repeated, are stored distinct and in order.
	tok, c := f.mint(node.ID, 0, credential.ScopeNodePoll, credential.ScopeNodeHeartbeat, credential.ScopeNodePoll)
	if d := cmp.Diff([]credential.Scope{credential.ScopeNodeHeartbeat, credential.ScopeNodePoll}, c.Scopes); d != "" {
		t.Fatalf("scopes (-want +got):\n%s", d)
	}
	f.stored(c)
	f.verify(f.is, "first of two", tok, credential.ScopeNodeHeartbeat)
	f.verify(f.is, "second of two", tok, credential.ScopeNodePoll)
	f.refuse(f.is, "third", tok, credential.ScopeNodeRegister, credential.ErrInsufficientScope)
}

func testExactScopes(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, _ := f.mint(p.ID, 0, credential.ScopeNodePoll, credential.ScopeNodeResultSubmit)
	opTok, _ := f.mint(f.principal(credential.KindOperator, "op").ID, 0, credential.ScopeOperatorJobs)
	nearMisses := []string{
		"", "node", "node:", "node:*", "*", "node:result", "node:result:*", "node:result:submit:x",
		"NODE:POLL", "Node:Poll", "node:poll ", " node:poll", "node:poll\n", "node:poll\x00", "node:polls", "node:pol",
		"node/poll", "node.poll", "operator:*", "operator",
	}
	for _, s := range nearMisses {
		t.Run(fmt.Sprintf("%q", s), func(t *testing.T) {
			f := f.sub(t)
			f.refuse(f.is, "node token", tok, credential.Scope(s), credential.ErrInsufficientScope)
			f.refuse(f.is, "operator token", opTok, credential.Scope(s), credential.ErrInsufficientScope)
			if _, err := credential.ParseScope(s); !errors.Is(err, credential.ErrInvalidArgument) {
				t.Fatalf("ParseScope(%q) err = %v, want ErrInvalidArgument", s, err)
			}
			_, _, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{credential.Scope(s)}, 0)
			wantErr(t, "mint", err, credential.ErrInvalidArgument)
		})
	}
}
