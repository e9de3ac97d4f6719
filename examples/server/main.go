// Command server is a runnable nodelane control plane: the
// worker and operator routes on one address, over SQLite by default or
// PostgreSQL, with the maintainer running.
//
//	go run ./examples/server -addr 127.0.0.1:8080 -db sqlite:nodelane.db
//
// On a database with no operator yet it mints an operator credential and a
// provisioning (node:register) credential and shows them once on the
// terminal (never in the logs); with -tokens-file it also writes them,
// after the listener is bound, as JSON.
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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/examples/internal/controlplane"
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
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addr          = fs.String("addr", "127.0.0.1:8080", "listen address")
		dsn           = fs.String("db", "sqlite:nodelane.db", "database: sqlite:PATH or postgres://...")
		leaseTTL      = fs.Duration("lease-ttl", workerapi.DefaultLeaseTTL, "lease lifetime without an extension")
		acceptTimeout = fs.Duration("accept-timeout", workerapi.DefaultAcceptTimeout, "time a worker has to accept a lease")
		secretsFile   = fs.String("secrets-file", "nodelane-secrets.json", "pepper and receipt signing key, created 0600 on first start; replicas share it")
		tokensFile    = fs.String("tokens-file", "", "on first start, write the operator and provisioning tokens here (JSON, 0600)")
		approveNodes  = fs.Bool("approve-nodes", false, "new nodes register pending and lease nothing until an operator approves them (POST /operator/workers/{id}/approve)")
		maxLeases     = fs.Int("max-leases-per-worker", workerapi.DefaultMaxLeasesPerWorker, "the live leases any one worker may hold; a node's governor max_jobs may lower it, never raise it")
		cancelGrace   = fs.Duration("cancel-grace", workerapi.DefaultCancelGrace, "how long a canceled job's lease lives on before it is revoked")
		maxRuntime    = fs.Duration("max-runtime", workerapi.DefaultMaxRuntime, "the runtime of a job that sets no requirements.max_runtime_seconds, after which its lease is revoked and it fails max_runtime_exceeded")
		hbInterval    = fs.Duration("heartbeat-interval", workerapi.DefaultHeartbeatInterval, "how often workers are told to heartbeat (next_heartbeat_seconds)")
		offlineAfter  = fs.Duration("offline-after", 0, "how long a silent worker stays before it is offline and its leases end (0: 3 × the heartbeat interval)")
		seqInterval   = fs.Duration("sequence-interval", workerapi.DefaultSequenceInterval, "how often the receipt sequencer looks for receipts when no completion woke it")
		seqBatch      = fs.Int("sequence-batch", workerapi.DefaultSequenceBatch, "the receipts one sequencing transaction integrates under one signed checkpoint")
		hl            = httpLimitFlags(fs)
		prices        receipts.Prices
	)
	fs.Var(&prices, "price", "SKU=MICRO_USD_PER_GPU_HOUR (repeatable; default=N sets the price of unlisted SKUs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := hl.check(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	cp, err := controlplane.Open(ctx, controlplane.Options{
		DB: *dsn, SecretsFile: *secretsFile, LeaseTTL: *leaseTTL, AcceptTimeout: *acceptTimeout,
		Prices: prices, ApproveNodes: *approveNodes, MaxLeasesPerWorker: *maxLeases,
		CancelGrace: *cancelGrace, MaxRuntime: *maxRuntime,
		HeartbeatInterval: *hbInterval, OfflineAfter: *offlineAfter,
		SequenceInterval: *seqInterval, SequenceBatch: *seqBatch, Logger: log,
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

	boot, err := cp.Server.Bootstrap(ctx)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
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
				ln.Close()
				return fmt.Errorf("tokens file: %w", err)
			}
		}
	}

	if err := cp.Server.Start(ctx); err != nil {
		ln.Close()
		return err
	}

	srv := &http.Server{
		Handler:     cp.Server.Handler(),
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	hl.apply(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(limitListener(ln, hl.maxConns)) }()
	log.Info("serving", "addr", ln.Addr().String(), "db", dbKind(*dsn))

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
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
