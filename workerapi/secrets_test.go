package workerapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// secrets are one replica's peppers and receipt signing key.
type secrets struct {
	peppers map[int][]byte
	version int
	signer  string
}

func newSecrets(t *testing.T) secrets {
	t.Helper()
	signer, _, err := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	if err != nil {
		t.Fatal(err)
	}
	return secrets{peppers: map[int][]byte{1: randomPepper(t)}, version: 1, signer: signer}
}

func randomPepper(t *testing.T) []byte {
	t.Helper()
	p := make([]byte, 32)
	if _, err := rand.Read(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// replica builds a Server on a handle of its own to the database at dsn,
// as another process would, logging to log when it is not nil.
func replica(t *testing.T, dsn string, sec secrets, log *bytes.Buffer) *workerapi.Server {
	t.Helper()
	db, err := bunstore.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg := workerapi.Config{Peppers: sec.peppers, PepperVersion: sec.version, ReceiptSigner: sec.signer}
	if log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	srv, err := workerapi.New(workerapi.Stores{
		Tx: db, Notifier: workerapi.NewLocalNotifier(), Leases: db.LeaseStore(), Credentials: db.CredentialStore(),
		Nonces: db.NonceStore(nil), Envelope: db.EnvelopeStore(), Receipts: db.ReceiptStore(),
		Fingerprints: db.FingerprintStore(),
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// start starts srv and stops it at the end of the test.
func start(t *testing.T, srv *workerapi.Server) error {
	t.Helper()
	err := srv.Start(context.Background())
	if err == nil {
		t.Cleanup(func() { srv.Stop(context.Background()) })
	}
	return err
}

// mismatch checks that err reports exactly the secrets named (by
// fingerprint.Fingerprint.Name) and shows none of the secrets.
func mismatch(t *testing.T, err error, sec []secrets, names ...string) {
	t.Helper()
	var me *fingerprint.MismatchError
	if !errors.Is(err, fingerprint.ErrMismatch) || !errors.As(err, &me) {
		t.Fatalf("got %v, want a *fingerprint.MismatchError", err)
	}
	var got []string
	for _, m := range me.Mismatches {
		got = append(got, fingerprint.Fingerprint{Kind: m.Kind, ID: m.ID}.Name())
	}
	if strings.Join(got, ", ") != strings.Join(names, ", ") {
		t.Errorf("mismatches %v, want %v", got, names)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("the message %q does not name %q", err, n)
		}
	}
	for _, s := range sec {
		for _, p := range s.peppers {
			if strings.Contains(err.Error(), hex.EncodeToString(p)) {
				t.Errorf("the message %q shows a pepper", err)
			}
		}
		if strings.Contains(err.Error(), s.signer) {
			t.Errorf("the message %q shows a signing key", err)
		}
	}
}

// Replicas with the secrets of the database's first replica start; one
// with another pepper or another receipt signing key refuses, naming it,
// and bootstraps nothing.
func TestReplicasAgreeOnSecrets(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := d.New(t).DSN
			a := newSecrets(t)
			if err := start(t, replica(t, dsn, a, nil)); err != nil {
				t.Fatalf("first replica: %v", err)
			}
			if err := start(t, replica(t, dsn, a, nil)); err != nil {
				t.Fatalf("second replica, same secrets: %v", err)
			}

			otherPepper := a
			otherPepper.peppers = map[int][]byte{1: randomPepper(t)}
			otherKey := newSecrets(t)
			otherKey.peppers = a.peppers
			both := newSecrets(t)
			for _, c := range []struct {
				name  string
				sec   secrets
				names []string
			}{
				{"other pepper", otherPepper, []string{"credential pepper 1"}},
				{"other receipt key", otherKey, []string{"receipt signing key"}},
				{"both", both, []string{"credential pepper 1", "receipt signing key"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					srv := replica(t, dsn, c.sec, nil)
					mismatch(t, start(t, srv), []secrets{a, c.sec}, c.names...)
					_, err := srv.Bootstrap(ctx)
					mismatch(t, err, []secrets{a, c.sec}, c.names...)
					_, err = srv.MintOperatorToken(ctx, time.Hour)
					mismatch(t, err, []secrets{a, c.sec}, c.names...)
					if _, err := srv.Issuer().Principal(ctx, workerapi.OperatorPrincipal); !errors.Is(err, credential.ErrNotFound) {
						t.Errorf("a refused replica bootstrapped: %v", err)
					}
				})
			}
		})
	}
}

// A pepper rotation: a replica with a new pepper version next to the old
// one starts, and so do the old replicas; one that lacks a version the
// database knows starts and logs it; a known version with another value
// is refused.
func TestSecretsPepperRotation(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			dsn := d.New(t).DSN
			a := newSecrets(t)
			if err := start(t, replica(t, dsn, a, nil)); err != nil {
				t.Fatal(err)
			}
			rotated := a
			rotated.peppers = map[int][]byte{1: a.peppers[1], 2: randomPepper(t)}
			rotated.version = 2
			if err := start(t, replica(t, dsn, rotated, nil)); err != nil {
				t.Fatalf("a new pepper version: %v", err)
			}
			var log bytes.Buffer
			if err := start(t, replica(t, dsn, a, &log)); err != nil {
				t.Fatalf("a replica without the new version: %v", err)
			}
			if !strings.Contains(log.String(), `secret="credential pepper 2"`) || strings.Contains(log.String(), hex.EncodeToString(rotated.peppers[2])) {
				t.Errorf("the log does not name the missing pepper 2, or shows it: %s", log.String())
			}
			retired := a
			retired.peppers, retired.version = map[int][]byte{2: rotated.peppers[2]}, 2
			if err := start(t, replica(t, dsn, retired, nil)); err != nil {
				t.Fatalf("pepper 1 retired: %v", err)
			}
			wrong2 := rotated
			wrong2.peppers = map[int][]byte{1: a.peppers[1], 2: randomPepper(t)}
			mismatch(t, start(t, replica(t, dsn, wrong2, nil)), []secrets{a, rotated, wrong2}, "credential pepper 2")
		})
	}
}

// Replicas that start at once on a fresh database agree: with the same
// secrets all start; with different ones exactly one does, and every
// other refuses.
func TestSecretsConcurrentFirstStarts(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			for _, same := range []bool{true, false} {
				dsn := d.New(t).DSN
				const n = 4
				a := newSecrets(t)
				srvs := make([]*workerapi.Server, n)
				for i := range srvs {
					sec := a
					if !same {
						sec = newSecrets(t)
					}
					srvs[i] = replica(t, dsn, sec, nil)
				}
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i, srv := range srvs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[i] = srv.CheckSecrets(context.Background())
					}()
				}
				wg.Wait()
				ok := 0
				for _, err := range errs {
					switch {
					case err == nil:
						ok++
					case !errors.Is(err, fingerprint.ErrMismatch):
						t.Fatalf("same=%v: %v", same, err)
					}
				}
				if want := map[bool]int{true: n, false: 1}[same]; ok != want {
					t.Errorf("same secrets %v: %d replicas started, want %d (%v)", same, ok, want, errs)
				}
			}
		})
	}
}

// MintOperatorToken mints a working operator token with its receipt, on
// a bootstrapped database only.
func TestMintOperatorToken(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := d.New(t).DSN
			sec := newSecrets(t)
			srv := replica(t, dsn, sec, nil)
			if _, err := srv.MintOperatorToken(ctx, time.Hour); !errors.Is(err, workerapi.ErrNotBootstrapped) {
				t.Fatalf("before Bootstrap: %v, want ErrNotBootstrapped", err)
			}
			if _, err := srv.Issuer().Principal(ctx, workerapi.OperatorPrincipal); !errors.Is(err, credential.ErrNotFound) {
				t.Fatalf("MintOperatorToken created the operator: %v", err)
			}
			if _, err := srv.Bootstrap(ctx); err != nil {
				t.Fatal(err)
			}
			for _, ttl := range []time.Duration{0, -time.Second, workerapi.BootstrapTTL + time.Second} {
				if _, err := srv.MintOperatorToken(ctx, ttl); !errors.Is(err, credential.ErrInvalidArgument) {
					t.Errorf("ttl %v: %v, want ErrInvalidArgument", ttl, err)
				}
			}
			before, err := srv.Issuer().Credentials(ctx, workerapi.OperatorPrincipal)
			if err != nil || len(before) != 1 {
				t.Fatalf("operator credentials after the refused mints: %d %v", len(before), err)
			}

			// Another process, as the break-glass command is.
			tok, err := replica(t, dsn, sec, nil).MintOperatorToken(ctx, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(tok.Token, "nlc_") || tok.ReceiptID == "" || tok.CredentialID == "" {
				t.Fatalf("minted %+v", tok.ReceiptID)
			}
			hs := httptest.NewServer(srv.Handler())
			defer hs.Close()
			req, _ := http.NewRequest("GET", hs.URL+"/operator/receipts/"+tok.ReceiptID, nil)
			req.Header.Set("Authorization", "Bearer "+tok.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got struct {
				Receipt struct {
					Body []byte `json:"body"` // the receipt's canonical JSON
				} `json:"receipt"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET its receipt with the token: %d %v", resp.StatusCode, err)
			}
			var r map[string]any
			if err := json.Unmarshal(got.Receipt.Body, &r); err != nil {
				t.Fatal(err)
			}
			if r["kind"] != "credential_minted" || r["credential_id"] != tok.CredentialID || r["principal_id"] != workerapi.OperatorPrincipal || r["actor"] != "system" {
				t.Errorf("receipt %v", r)
			}
		})
	}
}
