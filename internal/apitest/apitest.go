// Package apitest runs a nodelane control plane for tests: a
// workerapi.Server over bunstore on a fresh test database (SQLite or
// PostgreSQL, see internal/testdb), served over real HTTP by
// httptest.NewServer, with an operator credential, a provisioning
// credential, a settable clock, and worker nodes that sign their requests
// as the protocol requires.
//
//	env := apitest.New(t, "sqlite")
//	node := env.NewNode(t, "gpu-1")
//	node.Register(t, workerapi.RegisterRequest{Capabilities: ...})
//	resp, body := node.Do(t, "POST", "/workers/heartbeat", workerapi.HeartbeatRequest{Status: "idle"})
//
// Everything an Env opens is closed when the test ends.
package apitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
)

// Principal ids the Env creates.
const (
	OperatorID    = "apitest-operator"
	ProvisionerID = "apitest-provisioner"
)

// Env is one control plane replica under test.
type Env struct {
	// Server is the replica's Server; URL is where it is served.
	Server *workerapi.Server
	URL    string
	// DB is the replica's storage handle; Dialect is "sqlite" or
	// "postgres"; DSN opens the same database again (see Replica).
	DB      *bunstore.DB
	Dialect string
	DSN     string
	// Config is the Server's configuration as given to workerapi.New
	// (before its defaults), shared by replicas.
	Config workerapi.Config
	// Notifier is the Server's Notifier.
	Notifier workerapi.Notifier
	// OperatorToken carries every operator scope; ProvisioningToken
	// carries node:register. Both live 24 h from the Env's creation.
	OperatorToken     string
	ProvisioningToken string
	// Clock is the Server's clock (shared by replicas).
	Clock *testclock.Clock

	opts *options
	// client sends every request; it follows no redirects.
	client *http.Client
}

// Option changes how New builds an Env.
type Option func(*options)

type options struct {
	stores   func(workerapi.Stores) workerapi.Stores
	config   []func(*workerapi.Config)
	notifier func(t testing.TB, db *bunstore.DB) workerapi.Notifier
	local    *workerapi.LocalNotifier
	start    bool
	db       *bunstore.Config
}

// Started starts the Server's background work (Server.Start: the
// maintainer and hook delivery) and stops it when the test ends.
func Started() Option {
	return func(o *options) { o.start = true }
}

// WithConfig lets f change the workerapi.Config before the Server is
// built (Prices, ProofWait, MaxWait, Hooks, ...). Its clock, pepper and
// receipt signer are set already; f may replace them.
func WithConfig(f func(*workerapi.Config)) Option {
	return func(o *options) { o.config = append(o.config, f) }
}

// WithNotifier makes each replica's Notifier with f (for example a
// bunstore Notifier on db). By default all replicas of an Env share one
// workerapi.LocalNotifier, which wakes long-polls in this process only.
func WithNotifier(f func(t testing.TB, db *bunstore.DB) workerapi.Notifier) Option {
	return func(o *options) { o.notifier = f }
}

// WithDBConfig opens each replica's database with cfg.
func WithDBConfig(cfg *bunstore.Config) Option {
	return func(o *options) { o.db = cfg }
}

// WithStores lets f wrap the stores a replica's Server runs on (for
// example to inject faults).
func WithStores(f func(workerapi.Stores) workerapi.Stores) Option {
	return func(o *options) { o.stores = f }
}

// New opens a fresh database of dialect ("sqlite", a copy of a migrated
// one, see SQLite; or "postgres": a PostgreSQL test skips when no server
// answers, see testdb), builds a Server on it and serves Server.Handler.
// It may be called from parallel tests: each Env has its own database,
// Server, clock and notifier.
func New(t testing.TB, dialect string, opts ...Option) *Env {
	t.Helper()
	var db testdb.DB
	switch dialect {
	case "sqlite":
		db = SQLite(t)
	case "postgres":
		db = testdb.Postgres(t)
	default:
		t.Fatalf("apitest: unknown dialect %q", dialect)
	}
	o := &options{local: workerapi.NewLocalNotifier()}
	for _, f := range opts {
		f(o)
	}
	pepper := make([]byte, 32)
	if _, err := rand.Read(pepper); err != nil {
		t.Fatal(err)
	}
	signer, _, err := receiptsKey()
	if err != nil {
		t.Fatalf("apitest: receipt key: %v", err)
	}
	clock := testclock.Real()
	cfg := workerapi.Config{
		Peppers:       map[int][]byte{1: pepper},
		PepperVersion: 1,
		ReceiptSigner: signer,
		Origin:        keyName,
		Now:           clock.Now,
	}
	for _, f := range o.config {
		f(&cfg)
	}
	env := start(t, db.Dialect, db.DSN, cfg, clock, o)

	// The operator and provisioning credentials.
	ctx := context.Background()
	is := env.Server.Issuer()
	for _, p := range []struct {
		id     string
		scopes []credential.Scope
		token  *string
	}{
		{OperatorID, []credential.Scope{credential.ScopeOperatorJobs, credential.ScopeOperatorWorkers,
			credential.ScopeOperatorCredentials, credential.ScopeOperatorEnvelope, credential.ScopeOperatorReceipts}, &env.OperatorToken},
		{ProvisionerID, []credential.Scope{credential.ScopeNodeRegister}, &env.ProvisioningToken},
	} {
		if _, err := is.CreatePrincipal(ctx, credential.Principal{ID: p.id, Kind: credential.KindOperator, Name: p.id}); err != nil {
			t.Fatalf("apitest: principal %s: %v", p.id, err)
		}
		tok, _, err := is.Mint(ctx, p.id, p.scopes, 24*time.Hour)
		if err != nil {
			t.Fatalf("apitest: credential of %s: %v", p.id, err)
		}
		*p.token = tok
	}
	return env
}

// start opens dsn, builds a Server with cfg and serves it.
func start(t testing.TB, dialect, dsn string, cfg workerapi.Config, clock *testclock.Clock, o *options) *Env {
	t.Helper()
	ctx := context.Background()
	db, err := bunstore.Open(ctx, dsn, o.db)
	if err != nil {
		t.Fatalf("apitest: open %s database: %v", dialect, err)
	}
	t.Cleanup(func() { db.Close() })
	var n workerapi.Notifier = o.local
	if o.notifier != nil {
		n = o.notifier(t, db)
	}
	st := workerapi.Stores{
		Tx:           db,
		Notifier:     n,
		Leases:       db.LeaseStore(),
		Credentials:  db.CredentialStore(),
		Nonces:       db.NonceStore(nil),
		Envelope:     db.EnvelopeStore(),
		Receipts:     db.ReceiptStore(),
		Fingerprints: db.FingerprintStore(),
	}
	if o.stores != nil {
		st = o.stores(st)
	}
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatalf("apitest: workerapi.New: %v", err)
	}
	if o.start {
		if err := srv.Start(ctx); err != nil {
			t.Fatalf("apitest: Server.Start: %v", err)
		}
		t.Cleanup(func() {
			if err := srv.Stop(ctx); err != nil {
				t.Errorf("apitest: Server.Stop: %v", err)
			}
		})
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close) // runs before Stop and db.Close
	return &Env{
		Server: srv, URL: hs.URL, DB: db, Dialect: dialect, DSN: dsn, Config: cfg, Notifier: n, Clock: clock,
		opts: o,
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
	}
}

// Replica starts a second Server, with the same Config and clock, on a
// handle of its own to the same database, as another replica would. It
// shares the Env's tokens.
func (e *Env) Replica(t testing.TB) *Env {
	t.Helper()
	r := start(t, e.Dialect, e.DSN, e.Config, e.Clock, e.opts)
	r.OperatorToken, r.ProvisioningToken = e.OperatorToken, e.ProvisioningToken
	return r
}

// Operator sends an operator request with the operator token: body is
// sent as JSON (nil: no body; []byte, json.RawMessage or string: as is).
// It returns the status and the response body.
func (e *Env) Operator(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	return e.Bearer(t, e.OperatorToken, method, path, body)
}

// Bearer is Operator with another bearer token ("" for none).
func (e *Env) Bearer(t testing.TB, token, method, path string, body any) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.URL+path, bytes.NewReader(Body(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, b := e.Raw(t, req)
	return resp.StatusCode, b
}

// Raw sends req as it is and returns the response with its body read.
// It sends a clone, so the same request can be sent again (a replay).
func (e *Env) Raw(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	c := req.Clone(req.Context())
	if req.GetBody != nil {
		b, err := req.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		c.Body = b
	}
	resp, err := e.client.Do(c)
	if err != nil {
		t.Fatalf("apitest: %s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("apitest: reading the answer to %s %s: %v", req.Method, req.URL.Path, err)
	}
	return resp, b
}

// Enqueue adds a job through the Server's lease.Manager and wakes
// long-polls, as the operator's dispatch would.
func (e *Env) Enqueue(t testing.TB, nj lease.NewJob) *lease.Job {
	t.Helper()
	ctx := context.Background()
	j, err := e.Server.Leases().Enqueue(ctx, nj)
	if err != nil {
		t.Fatalf("apitest: enqueue: %v", err)
	}
	if err := e.Notifier.Notify(ctx); err != nil {
		t.Fatalf("apitest: notify: %v", err)
	}
	return j
}

// AwaitLongPolls waits until exactly n long-polls wait on the Env's
// Server (workerapi.Server.LongPolls), failing the test after
// waitfor.Deadline. A test that starts a long-poll in a goroutine calls
// it before it dispatches what should wake the long-poll, rather than
// sleep and hope the long-poll is parked by then.
func (e *Env) AwaitLongPolls(t testing.TB, n int) {
	t.Helper()
	waitfor.Until(t, fmt.Sprintf("%d long-polls waiting on %s", n, e.URL), func() bool {
		return e.Server.LongPolls() == n
	})
}

// Job returns a job as stored.
func (e *Env) Job(t testing.TB, id string) *lease.Job {
	t.Helper()
	j, err := e.Server.Leases().Get(context.Background(), id)
	if err != nil {
		t.Fatalf("apitest: job %s: %v", id, err)
	}
	return j
}

// Receipts counts the minted receipts, sequenced or not.
func (e *Env) Receipts(t testing.TB) int {
	t.Helper()
	n, err := e.DB.Bun().NewSelect().Table("nodelane_receipts").Count(context.Background())
	if err != nil {
		t.Fatalf("apitest: counting receipts: %v", err)
	}
	return int(n)
}

// Body encodes a request body as Operator and Node.Do do: nil is no
// body; []byte, json.RawMessage and string are sent as they are; anything
// else is marshalled to JSON.
func Body(t testing.TB, body any) []byte {
	t.Helper()
	switch b := body.(type) {
	case nil:
		return nil
	case []byte:
		return b
	case json.RawMessage:
		return b
	case string:
		return []byte(b)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatalf("apitest: marshal body: %v", err)
	}
	return b
}
