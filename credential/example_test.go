package credential_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"time"

	"github.com/nodelane/nodelane/credential"
)

func Example() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	pepper := make([]byte, 32)
	rand.Read(pepper) // in production: a secret kept outside the database
	is, err := credential.NewIssuer(credential.NewMemoryStore(), &credential.Config{
		Peppers: map[int][]byte{1: pepper},
		Now:     func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}

	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	node, _ := is.CreatePrincipal(ctx, credential.Principal{ID: "studio-gpu-1", Kind: credential.KindNode, PublicKey: pub})
	token, c, _ := is.Mint(ctx, node.ID, []credential.Scope{credential.ScopeNodeHeartbeat, credential.ScopeNodePoll}, 0)
	fmt.Println("scopes:", c.Scopes, "expires:", c.ExpiresAt.Format(time.RFC3339))

	// A worker request carries the token as a bearer credential.
	h := http.Header{"Authorization": {"Bearer " + token}}
	bearer, _ := credential.BearerToken(h)
	p, _, err := is.Verify(ctx, bearer, credential.ScopeNodePoll)
	fmt.Println("poll:", p.ID, err)
	_, _, err = is.Verify(ctx, bearer, credential.ScopeNodeResultSubmit)
	fmt.Println("submit:", err)

	is.Ban(ctx, node.ID, "maintenance")
	_, _, err = is.Verify(ctx, bearer, credential.ScopeNodePoll)
	fmt.Println("banned:", err)
	is.Unban(ctx, node.ID)

	newToken, _, _ := is.Rotate(ctx, c.ID, 0)
	_, _, err = is.Verify(ctx, token, credential.ScopeNodePoll)
	fmt.Println("old token:", err)
	_, _, err = is.Verify(ctx, newToken, credential.ScopeNodePoll)
	fmt.Println("new token:", err)
	// Output:
	// scopes: [node:heartbeat node:poll] expires: 2026-12-30T09:00:00Z
	// poll: studio-gpu-1 <nil>
	// submit: credential: insufficient scope: "node:result:submit"
	// banned: credential: principal banned
	// old token: credential: token expired
	// new token: <nil>
}

// A secret scanner finds tokens with TokenPattern and keeps only those
// whose checksum holds.
func ExampleParseToken() {
	text := `worker_token = "nlc_000RxY9kz6ouWMJLgFtBDiYDMREKtrwCJfLBML0eaQHzOzSDhgW39sPXcZ1SIERix0BQRXB"
not_a_token = "nlc_000RxY9kz6ouWMJLgFtBDiYDMREKtrwCJfLBML0eaQHzOzSDhgW39sPXcZ1SIERix0BQRXC"`
	for _, m := range credential.TokenPattern.FindAllString(text, -1) {
		if id, err := credential.ParseToken(m); err != nil {
			fmt.Println("look-alike:", err)
		} else {
			fmt.Println("credential", id)
		}
	}
	// Output:
	// credential 000102030405060708090a0b0c0d0e0f
	// look-alike: credential: invalid token: bad checksum
}
