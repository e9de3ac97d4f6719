package bunstore_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
)

// newIssuer returns an Issuer over db's credential store with a random
// pepper, which it also returns.
func newIssuer(t testing.TB, db *bunstore.DB) (*credential.Issuer, []byte) {
	t.Helper()
	pepper := make([]byte, 32)
	rand.Read(pepper)
	is, err := credential.NewIssuer(db.CredentialStore(), &credential.Config{Peppers: map[int][]byte{1: pepper}})
	if err != nil {
		t.Fatal(err)
	}
	return is, pepper
}

// The columns hold what the migration comments say: raw key and digest
// bytes, scopes as one space-separated string, times in microseconds.
func TestCredentialRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			db := open(t, tdb)
			is, _ := newIssuer(t, db)
			pub, _, _ := ed25519.GenerateKey(rand.Reader)
			p, err := is.CreatePrincipal(ctx, credential.Principal{ID: "node-1", Kind: credential.KindNode, PublicKey: pub})
			if err != nil {
				t.Fatal(err)
			}
			op, err := is.CreatePrincipal(ctx, credential.Principal{ID: "op-1", Kind: credential.KindOperator})
			if err != nil {
				t.Fatal(err)
			}
			_, c, err := is.Mint(ctx, p.ID, []credential.Scope{credential.ScopeNodePoll, credential.ScopeNodeHeartbeat}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			var pr struct {
				PublicKey []byte `bun:"public_key"`
				KeyID     string `bun:"key_id"`
				CreatedAt int64  `bun:"created_at"`
			}
			raw := tdb.Bun(t)
			if err := raw.NewSelect().TableExpr("nodelane_principals").Column("public_key", "key_id", "created_at").
				Where("id = ?", p.ID).Scan(ctx, &pr); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pr.PublicKey, pub) || pr.KeyID != p.KeyID || pr.CreatedAt != p.CreatedAt.UnixMicro() {
				t.Errorf("principal row = %x %q %d, want %x %q %d", pr.PublicKey, pr.KeyID, pr.CreatedAt, []byte(pub), p.KeyID, p.CreatedAt.UnixMicro())
			}
			var keyIsNull bool
			if err := raw.NewSelect().TableExpr("nodelane_principals").ColumnExpr("public_key IS NULL").
				Where("id = ?", op.ID).Scan(ctx, &keyIsNull); err != nil || !keyIsNull {
				t.Errorf("operator's public_key IS NULL = %v, %v; want true", keyIsNull, err)
			}
			var cr struct {
				Scopes    string `bun:"scopes"`
				Digest    []byte `bun:"digest"`
				ExpiresAt int64  `bun:"expires_at"`
			}
			if err := raw.NewSelect().TableExpr("nodelane_credentials").Column("scopes", "digest", "expires_at").
				Where("id = ?", c.ID).Scan(ctx, &cr); err != nil {
				t.Fatal(err)
			}
			if cr.Scopes != "node:heartbeat node:poll" || !bytes.Equal(cr.Digest, c.Digest) || len(cr.Digest) != 32 || cr.ExpiresAt != c.ExpiresAt.UnixMicro() {
				t.Errorf("credential row = %q %x %d", cr.Scopes, cr.Digest, cr.ExpiresAt)
			}
		})
	}
}

// Store errors leave a PostgreSQL transaction usable, and scopes that a
// space-separated column cannot hold are refused rather than mangled.
func TestCredentialStoreInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			s := db.CredentialStore()
			now := time.Now().UTC().Truncate(time.Microsecond)
			c := &credential.Credential{ID: strings.Repeat("ab", 16), PrincipalID: "p", Scopes: []credential.Scope{credential.ScopeNodePoll},
				Digest: bytes.Repeat([]byte{7}, 32), PepperVersion: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Rev: 1}
			err := db.InTx(ctx, func(ctx context.Context) error {
				if err := s.CreatePrincipal(ctx, &credential.Principal{ID: "p", Kind: credential.KindNode, CreatedAt: now, Rev: 1}); err != nil {
					return err
				}
				if err := s.CreateCredential(ctx, c); err != nil {
					return err
				}
				if err := s.CreateCredential(ctx, c); !errors.Is(err, credential.ErrConflict) {
					t.Errorf("CreateCredential with a taken id = %v, want ErrConflict", err)
				}
				if err := s.CreatePrincipal(ctx, &credential.Principal{ID: "p", CreatedAt: now, Rev: 1}); !errors.Is(err, credential.ErrConflict) {
					t.Errorf("CreatePrincipal with a taken id = %v, want ErrConflict", err)
				}
				if err := s.UpdateCredential(ctx, c, 7); !errors.Is(err, credential.ErrConflict) {
					t.Errorf("UpdateCredential at a stale revision = %v, want ErrConflict", err)
				}
				bad := *c
				bad.ID, bad.Scopes = strings.Repeat("cd", 16), []credential.Scope{"node:poll node:register"}
				if err := s.CreateCredential(ctx, &bad); !errors.Is(err, credential.ErrInvalidArgument) {
					t.Errorf("CreateCredential with a scope holding a space = %v, want ErrInvalidArgument", err)
				}
				// The transaction still works after every refusal.
				c2 := *c
				c2.Rev = 2
				return s.UpdateCredential(ctx, &c2, 1)
			})
			if err != nil {
				t.Fatalf("InTx: %v", err)
			}
			got, err := s.GetCredential(ctx, c.ID)
			if err != nil || got.Rev != 2 {
				t.Fatalf("GetCredential after the transaction = %+v, %v; want revision 2", got, err)
			}
		})
	}
}

// BenchmarkCredentialVerify measures credential.Issuer.Verify of one
// token on each database: a parse, two indexed reads (credential, then
// principal), one HMAC and a constant-time compare.
func BenchmarkCredentialVerify(b *testing.B) {
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		b.Run(d.Name, func(b *testing.B) {
			db := open(b, d.New(b))
			is, _ := newIssuer(b, db)
			p, err := is.CreatePrincipal(ctx, credential.Principal{Kind: credential.KindNode})
			if err != nil {
				b.Fatal(err)
			}
			tok, _, err := is.Mint(ctx, p.ID, []credential.Scope{credential.ScopeNodePoll, credential.ScopeNodeHeartbeat}, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := is.Verify(ctx, tok, credential.ScopeNodeHeartbeat); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
