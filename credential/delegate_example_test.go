package credential_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/credential"
)

// A credential that may mint credentials gives only what it holds.
func ExampleIssuer_MintAs() {
	ctx := context.Background()
	pepper := make([]byte, 32)
	rand.Read(pepper)
	is, err := credential.NewIssuer(credential.NewMemoryStore(), &credential.Config{Peppers: map[int][]byte{1: pepper}})
	if err != nil {
		panic(err)
	}
	is.CreatePrincipal(ctx, credential.Principal{ID: "helpdesk", Kind: credential.KindOperator})
	is.CreatePrincipal(ctx, credential.Principal{ID: "ci-bot", Kind: credential.KindOperator})
	// The helpdesk may mint credentials, and read receipts, nothing more.
	_, desk, _ := is.Mint(ctx, "helpdesk", []credential.Scope{credential.ScopeOperatorCredentials, credential.ScopeOperatorReceipts}, time.Hour)

	_, _, err = is.MintAs(ctx, desk.ID, "helpdesk", []credential.Scope{credential.ScopeOperatorJobs, credential.ScopeOperatorEnvelope}, credential.MintOptions{})
	var se *credential.ScopeError
	fmt.Println(errors.Is(err, credential.ErrInsufficientScope), errors.As(err, &se) && len(se.Missing) == 2)
	fmt.Println(err)

	_, c, err := is.MintAs(ctx, desk.ID, "ci-bot", []credential.Scope{credential.ScopeOperatorReceipts}, credential.MintOptions{TTL: time.Hour})
	fmt.Println(c.PrincipalID, c.Scopes, err)
	// Output:
	// true true
	// credential: insufficient scope: the minting credential lacks operator:jobs, operator:envelope; a credential mints only scopes it holds
	// ci-bot [operator:receipts] <nil>
}

// Credentials are listed a page at a time, in byte order of their ids.
func ExampleIssuer_ListCredentials() {
	ctx := context.Background()
	pepper := make([]byte, 32)
	rand.Read(pepper)
	is, err := credential.NewIssuer(credential.NewMemoryStore(), &credential.Config{Peppers: map[int][]byte{1: pepper}})
	if err != nil {
		panic(err)
	}
	is.CreatePrincipal(ctx, credential.Principal{ID: "ci-bot", Kind: credential.KindOperator})
	for range 5 {
		is.Mint(ctx, "ci-bot", []credential.Scope{credential.ScopeOperatorJobs}, 0)
	}
	f := credential.CredentialFilter{PrincipalID: "ci-bot", Limit: 2}
	for {
		page, next, err := is.ListCredentials(ctx, f)
		if err != nil {
			panic(err)
		}
		fmt.Println(len(page), next != "")
		if next == "" {
			break
		}
		f.After = next
	}
	// Output:
	// 2 true
	// 2 true
	// 1 false
}
