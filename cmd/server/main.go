// Command server is a runnable nodelane control plane: the
// worker and operator routes on one address, over SQLite by default or
// PostgreSQL, with the maintainer running.
//
//	go run ./cmd/server -addr 127.0.0.1:8080 -db sqlite:nodelane.db
//
// It binds its address first, so that a busy port stops it before it
// touches the database. Then, on a database with no operator yet, it
// mints an operator credential and a provisioning (node:register)
// credential and shows them once on the terminal (never in the logs);
// with -tokens-file it also writes them as JSON. A replica whose secrets
// file differs from the one the database was first used with refuses to
// start, naming the secret that differs.
//
// An operator who lost every operator token gets a new one with the
// break-glass subcommand, run where the database and the secrets file
// are (a running server may go on running):
//
//	go run ./cmd/server mint-operator -db sqlite:nodelane.db -secrets-file nodelane-secrets.json
//
// It prints the token once on stdout and records its credential_minted
// receipt.
//
// A deployment that hands the secrets file to the server read-only
// (systemd's LoadCredential, cmd/deploy) creates it first:
//
//	server init-secrets -secrets-file /etc/nodelane/secrets.json
//
// GET /healthz answers 200 while the process serves; GET /metrics
// serves Prometheus metrics (workerapi/prommetrics, with the Go runtime's
// and the process's) to a bearer credential with operator:receipts
// (MetricsScope). -metrics-addr serves /metrics, /healthz and /readyz,
// without a credential, on an address of their own, which must be a
// private one. -log-level (debug, info, warn, error) and
// -log-format (text, json) shape the logs on stderr.
//
// GET /readyz answers 200 {"ready":true} while the server should get
// traffic, and 503 {"ready":false,"reason":"..."} while it should not:
// until its clock has been measured against the database's, and while the
// two are more than 2 s apart (workerapi.Server.Ready). -clock-skew
// DURATION offsets the server's own clock, for fault testing only.
//
// The web console (package console) is served at /console/: sign in with
// an operator token.
//
// It serves plain HTTP unless told to serve TLS (TLS 1.2 at least;
// docs/TLS.md). With -tls-cert and -tls-key it serves that certificate,
// reloaded on SIGHUP and when the files change, and logs its public-key
// pin (pin_sha256) for the workers' -pin-sha256. With -acme-domain NAME
// (repeatable) it obtains certificates through ACME (Let's Encrypt unless
// -acme-directory-url; -acme-ca-file for a private ACME server's roots),
// cached in -acme-dir:
//
//	go run ./cmd/server -addr :443 -http-addr :80 -acme-domain cp.example.com -acme-email ops@example.com
//
// -http-addr adds a plain HTTP listener that answers ACME HTTP-01
// challenges and redirects everything else to https.
//
// Artifact bytes go to -artifact-store (package blobstore: file:///dir or
// a directory path, s3://, gs://, azblob://, mem://, or off); by default,
// on SQLite, the directory "artifacts" beside the database, created 0700,
// and on PostgreSQL none (its replicas need a store they share: the log
// says so). -max-artifact-bytes (default 10 GiB) bounds one artifact;
// -artifact-no-presign keeps a presigning bucket's URLs from the workers.
// -read-timeout and -write-timeout bound a stall, not the whole transfer,
// on the routes that move artifact bytes.
//
// Behind a reverse proxy that rewrites Host or strips a path prefix,
// -public-url names the URL the workers use (https://cp.example.com/nodelane):
// signatures are verified against it, and the console's links and cookie
// follow it. -trusted-proxy CIDR|IP (repeatable) lets the request log's
// client_addr, and the console's per-client sign-in limit, follow
// X-Forwarded-For from those proxies only (docs/PROXY.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/cmd/internal/tlsserve"
	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "mint-operator" {
		return mintOperator(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "init-secrets" {
		return initSecrets(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addr          = fs.String("addr", "127.0.0.1:8080", "listen address")
		dsn           = fs.String("db", "sqlite:nodelane.db", "database: sqlite:PATH or postgres://...")
		dbMaxConns    = fs.Int("db-max-conns", 0, "the database connections this server holds at most (0: 20 on PostgreSQL, where the replicas' together must stay under its max_connections; no limit on SQLite); a request waiting for one is served in no particular order, so a pool too small for the load shows as a long tail of latency")
		leaseTTL      = fs.Duration("lease-ttl", workerapi.DefaultLeaseTTL, "lease lifetime without an extension")
		acceptTimeout = fs.Duration("accept-timeout", workerapi.DefaultAcceptTimeout, "time a worker has to accept a lease")
		secretsFile   = fs.String("secrets-file", "nodelane-secrets.json", "pepper and receipt signing key, created 0600 on first start; replicas share it")
		tokensFile    = fs.String("tokens-file", "", "on first start, write the operator and provisioning tokens here (JSON, 0600)")
		approveNodes  = fs.Bool("approve-nodes", false, "new nodes register pending and lease nothing until an operator approves them (POST /operator/workers/{id}/approve)")
		provTTL       = fs.Duration("provisioning-token-ttl", workerapi.DefaultProvisioningTokenTTL, "lifetime of the provisioning token a new database's bootstrap mints (renew: POST /operator/credentials)")
		provRegs      = fs.Int64("provisioning-registrations", workerapi.DefaultProvisioningRegistrations, "node registrations the bootstrap's provisioning token may authorise (1 to 1000000)")
		auditQuota    = fs.Int64("audit-receipts-per-hour", workerapi.DefaultAuditReceiptsPerHour, "node_audit receipts one node may mint an hour (at least 100); past it POST /workers/audit answers 429")
		maxLeases     = fs.Int("max-leases-per-worker", workerapi.DefaultMaxLeasesPerWorker, "the live leases any one worker may hold; a node's governor max_jobs may lower it, never raise it")
		cancelGrace   = fs.Duration("cancel-grace", workerapi.DefaultCancelGrace, "how long a canceled job's lease lives on before it is revoked")
		maxRuntime    = fs.Duration("max-runtime", workerapi.DefaultMaxRuntime, "the runtime of a job that sets no requirements.max_runtime_seconds, after which its lease is revoked and it fails max_runtime_exceeded")
		retryBase     = fs.Duration("retry-base", workerapi.DefaultRetryBase, "the backoff before a failed attempt's job runs again; each further attempt doubles it (jitter takes off up to half), up to an hour")
		retention     = fs.Duration("retention", 0, "delete ended jobs, with their events, logs and artifact records, this long after they ended (0 keeps every job; receipts are never deleted)")
		hbInterval    = fs.Duration("heartbeat-interval", workerapi.DefaultHeartbeatInterval, "how often workers are told to heartbeat (next_heartbeat_seconds)")
		offlineAfter  = fs.Duration("offline-after", 0, "how long a silent worker stays before it is offline and its leases end (0: 3 × the heartbeat interval)")
		seqInterval   = fs.Duration("sequence-interval", workerapi.DefaultSequenceInterval, "how often the receipt sequencer looks for receipts when no completion woke it")
		seqBatch      = fs.Int("sequence-batch", workerapi.DefaultSequenceBatch, "the receipts one sequencing transaction integrates under one signed checkpoint")
		clockSkew     = fs.Duration("clock-skew", 0, "for fault testing only: offset this server's clock (its Now) by this much, as a host whose clock is wrong would be")
		logLevel      = fs.String("log-level", "info", "the least level logged: debug (every request), info (job lifecycle, refused requests), warn or error")
		logFormat     = fs.String("log-format", "text", "the logs' format on stderr: text (logfmt) or json (one object a line)")
		hl            = httpLimitFlags(fs)
		prices        receipts.Prices
		publicURL     = fs.String("public-url", "", "the URL workers use, when a proxy in front rewrites Host or strips a path prefix (https://cp.example.com/nodelane): signatures are verified against it (docs/PROXY.md)")
		proxies       []netip.Prefix
		safeTypes     []string
		pprofAddr     = fs.String("pprof-addr", "", "serve Go's profiles (net/http/pprof, /debug/pprof/) on this address, say 127.0.0.1:6060, for measuring; never on a public one: they show the process's internals (empty: off)")
		metricsAddr   = fs.String("metrics-addr", "", "also serve /metrics, /healthz and /readyz, without a credential and over plain HTTP, on this address, say 127.0.0.1:9090; only on a private one: anyone who reaches it reads the metrics (empty: off; on -addr /metrics needs operator:receipts)")
	)
	fs.Var(&prices, "price", "SKU=MICRO_USD_PER_GPU_HOUR (repeatable; default=N sets the price of unlisted SKUs)")
	fs.Func("trusted-proxy", "CIDR or IP of a proxy in front whose X-Forwarded-For the request log's client_addr believes (repeatable; for the log and the console's sign-in limit only)", func(s string) error {
		p, err := controlplane.ParseTrustedProxy(s)
		if err != nil {
			return err
		}
		proxies = append(proxies, p)
		return nil
	})
	fs.Func("safe-type", "a job type that always runs, without an activation of the runtime (repeatable): your own type, not a canonical blocked one such as raw_training or model_file_write, which is refused; operators change these at run time with POST /operator/envelope/safe-types", func(s string) error {
		safeTypes = append(safeTypes, s)
		return nil
	})
	tlsFlags := tlsserve.RegisterFlags(fs) // -tls-*, -acme-*, -http-addr
	artifacts := artifactFlagsOn(fs)       // -artifact-store, -max-artifact-bytes, -artifact-no-presign
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := hl.check(); err != nil {
		return err
	}
	if err := artifacts.check(); err != nil {
		return err
	}
	if *publicURL != "" {
		// Checked here, not by the flag package, which would repeat a
		// password the URL may hold.
		if err := controlplane.CheckPublicURL(*publicURL); err != nil {
			return fmt.Errorf("-public-url: %w", err)
		}
	}
	if err := tlsFlags.Check(); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	met, err := newMetrics()
	if err != nil {
		return err
	}
	var now func() time.Time
	if *clockSkew != 0 {
		skew := *clockSkew
		now = func() time.Time { return time.Now().Add(skew) }
		log.Warn("fault testing: this server's clock is offset", "clock_skew", skew)
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Before the listeners, so that a bad certificate file stops the
	// server before it binds or bootstraps.
	tlsSrv, err := startTLS(ctx, tlsFlags, *publicURL, log)
	if err != nil {
		return err
	}

	// Bound before anything else: a busy port must stop the server before
	// it bootstraps, or the tokens it mints would be shown to no one.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	var httpLn net.Listener
	if tlsFlags.HTTPAddr != "" {
		if httpLn, err = net.Listen("tcp", tlsFlags.HTTPAddr); err != nil {
			return fmt.Errorf("-http-addr: %w", err)
		}
		defer httpLn.Close()
	}

	var metricsLn net.Listener
	if *metricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", *metricsAddr); err != nil {
			return fmt.Errorf("-metrics-addr: %w", err)
		}
		defer metricsLn.Close()
	}
	if *pprofAddr != "" {
		pln, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return fmt.Errorf("-pprof-addr: %w", err)
		}
		ps := &http.Server{Handler: pprofHandler(), ReadHeaderTimeout: 10 * time.Second}
		go ps.Serve(pln)
		defer ps.Close()
		log.Info("serving profiles", "pprof_addr", pln.Addr().String())
	}

	artCfg, artStore, err := artifacts.open(ctx, *dsn, log)
	if err != nil {
		return err
	}
	defer artStore.Close()

	cp, err := controlplane.Open(ctx, controlplane.Options{
		DB: *dsn, DBMaxConns: *dbMaxConns, SecretsFile: *secretsFile, LeaseTTL: *leaseTTL, AcceptTimeout: *acceptTimeout,
		Prices: prices, ApproveNodes: *approveNodes, MaxLeasesPerWorker: *maxLeases,
		ProvisioningTokenTTL: *provTTL, ProvisioningRegistrations: *provRegs, AuditReceiptsPerHour: *auditQuota,
		CancelGrace: *cancelGrace, MaxRuntime: *maxRuntime, RetryBase: *retryBase, Retention: *retention,
		HeartbeatInterval: *hbInterval, OfflineAfter: *offlineAfter,
		SequenceInterval: *seqInterval, SequenceBatch: *seqBatch, Logger: log, Metrics: met.m, Now: now,
		PublicOrigin: *publicURL, TrustedProxies: proxies, Artifacts: artCfg,
		Shares: hl.shares(), SafeTypes: safeTypes,
	})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := cp.Close(sctx); err != nil {
			log.Warn("closing the control plane", "err", err)
		}
	}()

	// Bootstrap first checks that the secrets are the database's.
	boot, err := cp.Server.Bootstrap(ctx)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if boot.Created {
		// Shown once, on the terminal only: never through the logger.
		fmt.Fprintf(stdout, "operator token:     %s\nprovisioning token: %s\nreceipt public key: %s\n",
			boot.OperatorToken, boot.ProvisioningToken, cp.Server.ReceiptVerifierKey())
		if *tokensFile != "" {
			if err := controlplane.WriteFileAtomic(*tokensFile, controlplane.Tokens{
				OperatorToken:     boot.OperatorToken,
				ProvisioningToken: boot.ProvisioningToken,
				ReceiptPublicKey:  cp.Server.ReceiptVerifierKey(),
			}); err != nil {
				return fmt.Errorf("tokens file: %w", err)
			}
		}
	}

	if err := cp.Server.Start(ctx); err != nil {
		return err
	}

	// Requests do not end with the signal: one canceled as it commits
	// would be answered 503 although it committed. Shutdown lets those in
	// flight finish; after ShutdownGrace the rest (long-polls, that may
	// wait a minute) are canceled.
	base, endRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer endRequests()

	// Not a ServeMux: it would redirect paths that are not clean, which
	// the Handler answers 404 in JSON.
	met.reg.MustRegister(collectors.NewDBStatsCollector(cp.DB.Bun().DB, "nodelane"))
	ops, api := opsHandlers(cp.Server, met, log), cp.Server.Handler()
	if metricsLn != nil {
		ms := &http.Server{Handler: opsOnly(ops)}
		hl.apply(ms)
		go ms.Serve(metricsLn)
		defer ms.Close()
		log.Info("serving metrics and probes", "metrics_addr", metricsLn.Addr().String())
	}
	ops = guardMetrics(cp.Server, ops)
	ccfg := console.Config{API: cp.Server.OperatorHandler(), VerifierKey: cp.Server.ReceiptVerifierKey()}
	ccfg.ClientAddr = cp.Server.ClientAddr // sign-ins are limited per client, past the trusted proxies
	if *publicURL != "" {
		ccfg.PublicURL = strings.TrimRight(*publicURL, "/") + "/console"
	}
	con, err := console.New(ccfg)
	if err != nil {
		return err
	}
	web := http.StripPrefix("/console", con)
	srv := &http.Server{
		Handler: streamDeadlines(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if h, ok := ops[r.URL.Path]; ok {
				h.ServeHTTP(w, r)
				return
			}
			switch {
			case r.URL.Path == "/console":
				http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
				return
			case strings.HasPrefix(r.URL.Path, "/console/"):
				web.ServeHTTP(w, r)
				return
			}
			api.ServeHTTP(w, r)
		}), hl.readTimeout, hl.writeTimeout),
		BaseContext: func(net.Listener) context.Context { return base },
	}
	hl.apply(srv)
	served := make(chan error, 2)
	consoleURL := "http://" + ln.Addr().String() + "/console/"
	var redirects *http.Server
	if tlsSrv == nil {
		go func() { served <- srv.Serve(limitListener(ln, hl.maxConns)) }()
	} else {
		redirects = tlsSrv.serve(srv, ln, httpLn, hl, log, served)
		consoleURL = tlsSrv.URL(ln.Addr(), "/console/")
	}
	log.Info("serving", "addr", ln.Addr().String(), "db", dbKind(*dsn), "console", consoleURL)
	if tlsSrv != nil {
		tlsSrv.Start(ctx)
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	grace := time.AfterFunc(ShutdownGrace, endRequests)
	defer grace.Stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if redirects != nil {
		if err := redirects.Shutdown(sctx); err != nil {
			log.Warn("shutting down -http-addr", "err", err)
		}
	}
	err = srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// ShutdownGrace is how long requests in flight when the server is told
// to stop may go on before they are canceled.
const ShutdownGrace = 5 * time.Second

// DefaultMintTTL is the lifetime of a token mint-operator mints: enough
// to mint lasting credentials through the operator routes
// (POST /operator/credentials) and revoke the lost ones.
const DefaultMintTTL = 24 * time.Hour

// mintOperator is the break-glass subcommand: it mints an operator token
// from the database and the secrets file (which must exist and be the
// database's), with its receipt, and prints the token once on stdout.
func mintOperator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("server mint-operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dsn         = fs.String("db", "sqlite:nodelane.db", "database: sqlite:PATH or postgres://...")
		secretsFile = fs.String("secrets-file", "nodelane-secrets.json", "the secrets file the servers on this database use (it is never created)")
		ttl         = fs.Duration("ttl", DefaultMintTTL, "the token's lifetime (at most a year)")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: server mint-operator -db DSN -secrets-file PATH [-ttl D]\n\n"+
			"Mints a new operator token (every scope) with a credential_minted receipt and prints it once on stdout.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("mint-operator: unexpected argument %q", fs.Arg(0))
	}
	if *ttl <= 0 || *ttl > workerapi.BootstrapTTL {
		return fmt.Errorf("mint-operator: -ttl %v is not in (0, %v]", *ttl, workerapi.BootstrapTTL)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cp, err := controlplane.Open(ctx, controlplane.Options{
		DB: *dsn, SecretsFile: *secretsFile, ExistingSecrets: true, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("mint-operator: %w", err)
	}
	defer cp.Close(context.WithoutCancel(ctx))
	tok, err := cp.Server.MintOperatorToken(ctx, *ttl)
	if err != nil {
		return fmt.Errorf("mint-operator: %w", err)
	}
	// Shown once, on the terminal only: never through the logger.
	if _, err := fmt.Fprintf(stdout, "operator token: %s\n", tok.Token); err != nil {
		return err
	}
	log.Info("minted an operator token", "principal_id", workerapi.OperatorPrincipal,
		"credential_id", tok.CredentialID, "receipt_id", tok.ReceiptID, "expires_at", tok.ExpiresAt)
	return nil
}

// dbKind names the database without its DSN, which may hold a password.
func dbKind(dsn string) string {
	for i := 0; i < len(dsn); i++ {
		if dsn[i] == ':' {
			return dsn[:i]
		}
	}
	return "?"
}
