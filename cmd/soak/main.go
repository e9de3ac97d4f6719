// Command soak is a fault soak of the example control plane on
// PostgreSQL: jobs flow through two server replicas and a fleet of worker
// processes for a bounded time while it SIGKILLs servers and workers,
// restarts PostgreSQL and skews one replica's clock, and then checks that
// nothing was lost, run twice or forged. It is a manual tool, not part of
// CI.
//
//	go run ./cmd/soak                      # 10 minutes, 16 workers
//	go run ./cmd/soak -duration 3m -seed 7 -server-kill-every 20s
//
// It runs from within the nodelane module: it builds cmd/server and
// cmd/worker with the go command (or takes -server-bin and
// -worker-bin), starts a throwaway PostgreSQL cluster of its own
// (initdb and pg_ctl from -pg-bin, as the postgres user when run as
// root) on a free port of 127.0.0.1 with trust authentication, and starts
// -replicas server replicas on that database, sharing one secrets file,
// and -workers workers, spread over the replicas. It activates the
// runtime and dispatches -rate jobs a second through POST /operator/jobs
// (status_check, embedding_dry_run and short lora_train jobs, mixed),
// while, each at a random time around its interval (-seed fixes them):
//
//   - -server-kill-every: a replica is SIGKILLed and started again on the
//     same database and port;
//   - -worker-kill-every: a worker is SIGKILLed and started again with the
//     same identity;
//   - -pg-restart-every: PostgreSQL is restarted (pg_ctl restart -m
//     immediate, a crash and recovery);
//   - -skew-every: the last replica is restarted with its clock -skew
//     ahead (the server's -clock-skew), or back to the true time.
//
// It passes the server's -heartbeat-interval and -offline-after, and runs
// the clock skew, only when the server has those flags (it reads
// `server -h`); the output names each fault injected or skipped. Every
// -checkpoint-every it reads the latest signed checkpoint, and verifies
// its signature with the receipt verifier key.
//
// After -duration it stops dispatching and injecting, waits at most
// -drain-timeout for every job to end, and checks that:
//
//   - every job on the server, every one dispatched among them, succeeded;
//   - no dispatch queued more jobs than it had attempts that could have:
//     each job's payload carries the soak_seq of its request, and a
//     request answered 429 or 503 is tried again (docs/PROTOCOL.md: such
//     an answer accepted nothing), one with no answer, or a 503 that says
//     its outcome is unknown, is not. A 503 whose
//     job was queued anyway (the commit landed, its answer was lost) fails
//     the run unless -allow-503-queued;
//   - each has exactly one job_completed and one job_charged receipt, and
//     the job's receipt_id is that job_completed receipt;
//   - the receipt log read through GET /operator/receipts is canonical,
//     in index order, and hashes (RFC 6962, golang.org/x/mod/sumdb/tlog)
//     to the root of the latest checkpoint, signed by the verifier key;
//   - every checkpoint recorded during the run is signed, no smaller than
//     any seen before it, and consistent with every other: with each
//     earlier and later one by a proof computed from the log, and with the
//     next by the server's GET /operator/receipts/consistency proof.
//
// It prints the figures (jobs, kills and restarts of each kind, the
// duration) and exits 0 when every check passed, 1 when one failed or
// the run could not be made, 2 for a usage error. It stops and removes
// the cluster and its work directory at the end, on Ctrl-C too; with
// -keep, or when a check failed, it leaves the directory (the server,
// worker and PostgreSQL logs) and prints its path.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var usage errUsage
	switch {
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	case errors.Is(err, errChecksFailed):
		os.Exit(1) // the summary says which
	case err != nil:
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// errUsage is a command-line error.
type errUsage struct{ error }

func (e errUsage) Unwrap() error { return e.error }

// errChecksFailed is returned when the soak ran but a check failed; the
// summary names the failures.
var errChecksFailed = errors.New("soak: a check failed")

// config is the command line.
type config struct {
	duration        time.Duration
	drainTimeout    time.Duration
	workers         int
	replicas        int
	maxJobs         int
	rate            float64
	seed            int64
	serverKillEvery time.Duration
	workerKillEvery time.Duration
	// workerRestartEvery: SIGKILL a worker that holds a job and start it
	// again on the same identity within 2 s (issue 25).
	workerRestartEvery time.Duration
	pgRestartEvery     time.Duration
	skewEvery          time.Duration
	skew               time.Duration
	checkpointEvery    time.Duration
	leaseTTL           time.Duration
	acceptTimeout      time.Duration
	heartbeat          time.Duration
	offlineAfter       time.Duration
	pgBin              string
	serverBin          string
	workerBin          string
	keep               bool
	allow503Queued     bool
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.DurationVar(&c.duration, "duration", 10*time.Minute, "how long jobs flow and faults are injected")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 5*time.Minute, "how long, after -duration, every job has to end")
	fs.IntVar(&c.workers, "workers", 16, "worker processes")
	fs.IntVar(&c.replicas, "replicas", 2, "server replicas on the one database (the last one's clock is skewed)")
	fs.IntVar(&c.maxJobs, "max-jobs", 2, "jobs each worker runs at once")
	fs.Float64Var(&c.rate, "rate", 20, "jobs dispatched a second")
	fs.Int64Var(&c.seed, "seed", 0, "seed of the job mix and the fault times (0: from the clock)")
	fs.DurationVar(&c.serverKillEvery, "server-kill-every", 45*time.Second, "mean interval between server SIGKILLs (0: none)")
	fs.DurationVar(&c.workerKillEvery, "worker-kill-every", 10*time.Second, "mean interval between worker SIGKILLs (0: none)")
	fs.DurationVar(&c.workerRestartEvery, "worker-restart-every", 20*time.Second, "mean interval between SIGKILLs of a worker that holds a job, started again on the same identity within 2 s (0: none)")
	fs.DurationVar(&c.pgRestartEvery, "pg-restart-every", 90*time.Second, "mean interval between PostgreSQL restarts (0: none)")
	fs.DurationVar(&c.skewEvery, "skew-every", time.Minute, "mean interval between turns of the last replica's clock skew on and off (0: none)")
	fs.DurationVar(&c.skew, "skew", 5*time.Second, "the clock skew of the skewed replica (server -clock-skew)")
	fs.DurationVar(&c.checkpointEvery, "checkpoint-every", 2*time.Second, "how often the latest checkpoint is read and recorded")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 20*time.Second, "server -lease-ttl: how soon a killed worker's accepted jobs come back")
	fs.DurationVar(&c.acceptTimeout, "accept-timeout", 5*time.Second, "server -accept-timeout: how soon a killed worker's unaccepted jobs come back")
	fs.DurationVar(&c.heartbeat, "heartbeat-interval", 2*time.Second, "server -heartbeat-interval, when the server has it")
	fs.DurationVar(&c.offlineAfter, "offline-after", 8*time.Second, "server -offline-after, when the server has it")
	fs.StringVar(&c.pgBin, "pg-bin", "/usr/lib/postgresql/15/bin", "directory of initdb, pg_ctl and postgres")
	fs.StringVar(&c.serverBin, "server-bin", "", "cmd/server binary (default: built with go build)")
	fs.StringVar(&c.workerBin, "worker-bin", "", "cmd/worker binary (default: built with go build)")
	fs.BoolVar(&c.allow503Queued, "allow-503-queued", false, "report a job queued by a dispatch answered 503 (an ambiguous commit) as a warning, not a failure")
	fs.BoolVar(&c.keep, "keep", false, "keep the work directory (logs, database) after a passing run")
	if err := fs.Parse(args); err != nil {
		return nil, errUsage{err}
	}
	switch {
	case fs.NArg() > 0:
		return nil, errUsage{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	case c.duration <= 0 || c.drainTimeout <= 0 || c.checkpointEvery <= 0:
		return nil, errUsage{errors.New("-duration, -drain-timeout and -checkpoint-every must be positive")}
	case c.workers < 1 || c.replicas < 1 || c.maxJobs < 1:
		return nil, errUsage{errors.New("-workers, -replicas and -max-jobs must be at least 1")}
	case c.rate <= 0 || c.rate > 1000:
		return nil, errUsage{errors.New("-rate must be above 0 and at most 1000")}
	case c.serverKillEvery < 0 || c.workerKillEvery < 0 || c.workerRestartEvery < 0 || c.pgRestartEvery < 0 || c.skewEvery < 0:
		return nil, errUsage{errors.New("fault intervals must not be negative")}
	}
	if c.seed == 0 {
		c.seed = time.Now().UnixNano()
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	s, err := newSoak(ctx, cfg, stdout)
	if err != nil {
		return err
	}
	err = s.run(ctx)
	failed := err != nil
	if errors.Is(err, errChecksFailed) || (err != nil && ctx.Err() == nil) {
		s.keep = true
	}
	if cerr := s.close(); cerr != nil && !failed {
		err = cerr
	}
	if err != nil && ctx.Err() != nil {
		err = errors.New("interrupted: the processes and the cluster are stopped")
	}
	return err
}
