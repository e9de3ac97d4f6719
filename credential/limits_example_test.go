package credential_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/credential"
)

// A provisioning credential limited to two registrations, and a ban that
// follows a node's key.
func ExampleIssuer_Use() {
	ctx := context.Background()
	pepper := make([]byte, 32)
	rand.Read(pepper)
	is, err := credential.NewIssuer(credential.NewMemoryStore(), &credential.Config{Peppers: map[int][]byte{1: pepper}})
	if err != nil {
		panic(err)
	}
	is.CreatePrincipal(ctx, credential.Principal{ID: "provisioner", Kind: credential.KindOperator})
	token, c, _ := is.MintWith(ctx, "provisioner", []credential.Scope{credential.ScopeNodeRegister},
		credential.MintOptions{TTL: 24 * time.Hour, MaxUses: 2})
	for i := 1; i <= 3; i++ {
		// In the transaction of each registration.
		_, err := is.Use(ctx, c.ID)
		fmt.Printf("registration %d refused: %v\n", i, err != nil)
	}
	_, _, err = is.Verify(ctx, token, credential.ScopeNodeRegister)
	fmt.Println("verify:", err)

	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	is.CreatePrincipal(ctx, credential.Principal{ID: "wrk_1", Kind: credential.KindNode, PublicKey: pub})
	is.Ban(ctx, "wrk_1", "stolen")
	b, _ := is.KeyBan(ctx, pub) // the same key, whatever node id it comes under
	fmt.Println("key banned by:", b.ID)
	// Output:
	// registration 1 refused: false
	// registration 2 refused: false
	// registration 3 refused: true
	// verify: credential: token exhausted
	// key banned by: wrk_1
}
