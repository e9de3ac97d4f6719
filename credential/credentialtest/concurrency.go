package credentialtest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
)

var concurrencyTests = []test{
	{"ConcurrentMints", testConcurrentMints},
	{"ConcurrentRotations", testConcurrentRotations},
	{"ConcurrentRevokeRotate", testConcurrentRevokeRotate},
	{"ConcurrentBanSetKey", testConcurrentBanSetKey},
}

func testConcurrentMints(t *testing.T, f *fixture) {
	const goroutines, each = 16, 25
	p := f.principal(credential.KindNode, "n")
	var (
		mu     sync.Mutex
		tokens = map[string]string{} // token -> credential id
		wg     sync.WaitGroup
		errs   = make(chan error, goroutines)
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tok, c, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll}, 0)
				if err != nil {
					errs <- err
					return
				}
				if _, _, err := f.is.Verify(f.ctx, tok, credential.ScopeNodePoll); err != nil {
					errs <- fmt.Errorf("verify a fresh token: %w", err)
					return
				}
				mu.Lock()
				tokens[tok] = c.ID
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, id := range tokens {
		ids[id] = true
	}
	if len(tokens) != goroutines*each || len(ids) != goroutines*each {
		t.Fatalf("%d distinct tokens and %d distinct ids, want %d", len(tokens), len(ids), goroutines*each)
	}
	list, err := f.is.Credentials(f.ctx, p.ID)
	if err != nil || len(list) != goroutines*each {
		t.Fatalf("Credentials = %d, %v; want %d", len(list), err, goroutines*each)
	}
	for _, c := range list {
		if !ids[c.ID] {
			t.Fatalf("listed credential %s was not minted", c.ID)
		}
	}
}

// Two rotations of one credential at once: exactly one wins, and the
// loser leaves no live credential behind.
func testConcurrentRotations(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	for i := range 20 {
		_, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
		var (
			wg   sync.WaitGroup
			toks [2]string
			errs [2]error
		)
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				toks[g], _, errs[g] = f.is.Rotate(f.ctx, c.ID, time.Hour)
			}()
		}
		wg.Wait()
		won := 0
		for g := range 2 {
			if errs[g] == nil {
				won++
				f.verify(f.is, "winner", toks[g], credential.ScopeNodePoll)
			} else if !errors.Is(errs[g], credential.ErrInvalidArgument) {
				t.Fatalf("round %d: losing rotation: %v", i, errs[g])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d rotations succeeded (%v), want 1", i, won, errs)
		}
		f.revoke(c.ID)
	}
	// Each round leaves one live credential: the winner's.
	if live := f.live(p.ID); live != 20 {
		t.Fatalf("%d live credentials after 20 rounds, want 20", live)
	}
}

// A revocation racing a rotation is never lost.
func testConcurrentRevokeRotate(t *testing.T, f *fixture) {
	for i := range 20 {
		p := f.principal(credential.KindNode, fmt.Sprintf("n%d", i))
		tok, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
		var (
			wg        sync.WaitGroup
			revokeErr error
			rotateErr error
			newTok    string
		)
		wg.Add(2)
		go func() { defer wg.Done(); _, revokeErr = f.is.Revoke(f.ctx, c.ID) }()
		go func() { defer wg.Done(); newTok, _, rotateErr = f.is.Rotate(f.ctx, c.ID, time.Hour) }()
		wg.Wait()
		if revokeErr != nil {
			t.Fatalf("round %d: Revoke: %v", i, revokeErr)
		}
		f.refuse(f.is, "revoked while rotating", tok, credential.ScopeNodePoll, credential.ErrRevoked)
		live := f.live(p.ID)
		switch {
		case rotateErr == nil:
			f.verify(f.is, "successor", newTok, credential.ScopeNodePoll)
			if live != 1 {
				t.Fatalf("round %d: %d live credentials after a rotation, want 1", i, live)
			}
		case errors.Is(rotateErr, credential.ErrRevoked):
			if live != 0 {
				t.Fatalf("round %d: a refused rotation left %d live credentials", i, live)
			}
		default:
			t.Fatalf("round %d: Rotate: %v", i, rotateErr)
		}
	}
}

// A ban racing a key change is never lost, nor is the key.
func testConcurrentBanSetKey(t *testing.T, f *fixture) {
	for i := range 20 {
		p := f.principal(credential.KindNode, fmt.Sprintf("n%d", i))
		key := newKey(t)
		var wg sync.WaitGroup
		var banErr, keyErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, banErr = f.is.Ban(f.ctx, p.ID, "race") }()
		go func() { defer wg.Done(); _, keyErr = f.is.SetNodeKey(f.ctx, p.ID, key) }()
		wg.Wait()
		if banErr != nil || keyErr != nil {
			t.Fatalf("round %d: Ban: %v, SetNodeKey: %v", i, banErr, keyErr)
		}
		got := f.getPrincipal(p.ID)
		if !got.Banned || !key.Equal(got.PublicKey) {
			t.Fatalf("round %d: lost an update: banned %v, key set %v", i, got.Banned, key.Equal(got.PublicKey))
		}
	}
}
