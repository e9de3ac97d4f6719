// Command loadgen drives a nodelane control plane as a fleet of worker
// nodes and an operator would, and reports how fast and how correctly it
// answers. It works against any server that serves the worker and
// operator routes of docs/PROTOCOL.md: cmd/server, or a host
// application.
//
// Run mode (-mode run, the default) registers -nodes nodes, each with its
// own Ed25519 key generated in memory, so every worker request is signed
// and nonce-checked. It dispatches -jobs jobs of -job-type through POST
// /operator/jobs (-dispatchers at once; with -dispatch-batch N over 1,
// N jobs a request through POST /operator/jobs/batch; with -rate R, R jobs
// a second, evenly) while the nodes lease them (up to
// -max-jobs per lease request, long-polling -wait-seconds) and run them
// in one of two flows. -flow v02, the default and the seed's contract:
// lease, then accept and complete per job, -job-concurrency jobs of a node
// at once (all it leased, by default). -flow batched: lease with accept:
// true, then complete every job of the lease answer with one POST
// /workers/jobs/complete (accepting alone any grant the lease left
// leased). It prints:
//
//   - jobs/s end to end, from the first dispatch sent to the last
//     completion answered;
//   - p50, p99 and max per route (register, heartbeat, dispatch, lease,
//     accept, complete, and "complete (batch)": one call per lease answer),
//     and the dispatch→lease latency: from a job's
//     dispatch answer to the lease answer that carried it. A call's time
//     includes the client's retries; "lease" is the lease answers that
//     carried jobs, their long-poll wait included, and "lease (no job)"
//     the others;
//   - the HTTP requests per job, and the answers that were retried;
//   - CPU time per job: of the server, with -server-pid (a comma-separated
//     list sums several processes; /proc/PID/stat, all threads); of the
//     PostgreSQL backends of the server's database, with -pg (each
//     backend pg_stat_activity lists for it, sampled every 200 ms from
//     /proc/PID/stat: PostgreSQL must run on this machine; its shared
//     processes, WAL writer and checkpointer, are not counted, and every
//     backend of the database is, so give the server a database of its
//     own); and of loadgen itself. Measured from the end of registration to the last
//     answer; with the load average;
//   - the server's resident memory, with -server-pid (Linux);
//   - PostgreSQL commits per job (pg_stat_database.xact_commit), and
//     statements per job when pg_stat_statements is loaded
//     (shared_preload_libraries) and created in the database, with -pg
//     (the DSN of the server's database). loadgen's own queries are not
//     counted among them: its CPU sampler queries inside one read-only
//     transaction that it rolls back (one of the rollbacks reported).
//
// Then it checks that every dispatched job ended succeeded, completed
// exactly once (counted on the nodes' side, and its state and receipt id
// read back through GET /operator/jobs), and that both receipts of every
// completion verify: the inclusion proof against a checkpoint signed by
// the server's receipt key (the proofs of the complete answer, or of GET
// /operator/receipts/{id} when the answer had none), the canonical body
// naming the job, the worker and the lease, and every checkpoint seen
// proven consistent with the latest (GET /operator/receipts/consistency).
//
// Fleet mode (-mode fleet) registers -nodes nodes that heartbeat every
// -heartbeat-interval, spread evenly over it, while -long-polls of them
// keep an idle lease long-poll open, begun evenly over one -wait-seconds,
// for -duration. Give the server room for a connection per node
// (cmd/server -max-conns) and a provisioning token that registers them
// all (cmd/server -provisioning-registrations). It reports the
// heartbeat latency (p50, p99), the long-polls answered and the server's
// resident memory.
//
//	go run ./cmd/server -db sqlite:/tmp/lg/nodelane.db \
//	    -secrets-file /tmp/lg/secrets.json -tokens-file /tmp/lg/tokens.json \
//	    -provisioning-registrations 20000 -max-conns 20000 &
//	go run ./cmd/loadgen -tokens-file /tmp/lg/tokens.json -server-pid $!
//	go run ./cmd/loadgen -tokens-file /tmp/lg/tokens.json -mode fleet \
//	    -nodes 10000 -long-polls 1000 -duration 5m
//
// The operator token (run mode) and the provisioning token come from
// -operator-token-file and -provisioning-token-file, else from the
// -tokens-file JSON the example server writes, else from the environment
// variables NODELANE_OPERATOR_TOKEN and NODELANE_PROVISIONING_TOKEN, never
// from the command line. The receipt verifier key, which the server does
// not serve, comes from -receipt-key or the tokens file's
// receipt_public_key; -check-receipts=false runs without it.
//
// The exit status is 0 when every check passed, 1 when one failed or the
// run could not finish, and 2 for a usage error.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var usage errUsage
	switch {
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	case errors.Is(err, errChecksFailed):
		os.Exit(1) // the report says which
	case err != nil:
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// errUsage is a command-line error: a bad flag, or a token missing.
type errUsage struct{ error }

func (e errUsage) Unwrap() error { return e.error }

// errChecksFailed is returned when the run finished but a check failed;
// the report names the failures.
var errChecksFailed = errors.New("loadgen: a check failed")

// The environment variables a token may be given in.
const (
	operatorEnv     = "NODELANE_OPERATOR_TOKEN"
	provisioningEnv = "NODELANE_PROVISIONING_TOKEN"
)

// config is the command line.
type config struct {
	server     string
	roots      *x509.CertPool // -ca-file's, or nil: the system's
	mode       string
	flow       string // run: flowV02 or flowBatched
	nodes      int
	jobs       int
	jobType    string
	maxJobs    int
	perNode    int // accept and complete calls of one node in flight
	wait       int // lease wait_seconds
	dispatch   int // dispatch requests in flight
	batch      int // jobs per dispatch request
	rate       int // jobs dispatched a second, 0 for as fast as the dispatchers go
	registerN  int // register requests in flight
	timeout    time.Duration
	interval   time.Duration // heartbeat interval
	longPolls  int
	duration   time.Duration
	pgDSN      string
	pgSettle   time.Duration
	serverPIDs []int
	checkRcpts bool
	// waitProofs is each completion's wait_for_proofs.
	waitProofs bool
	origin     string
	verbose    bool
	cpuProfile string

	tokens tokens
}

// tokens are the credentials and the key loadgen needs.
type tokens struct {
	operator     string
	provisioning string
	// receiptKey is the note verifier key of the server's receipt log.
	receiptKey string
}

// parseFlags reads the command line and the tokens. Every error is an
// errUsage.
func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &config{}
	var tokensFile, opFile, provFile, receiptKey string
	fs.StringVar(&cfg.server, "server", "http://127.0.0.1:8080", "control plane base URL")
	caFile := fs.String("ca-file", "", "PEM file of the certificate authorities to trust for an https -server, instead of the system's")
	fs.StringVar(&cfg.mode, "mode", "run", "run (dispatch and run jobs) or fleet (heartbeats and idle long-polls)")
	fs.StringVar(&cfg.flow, "flow", flowV02, "run: "+flowV02+" (lease, then accept and complete per job) or "+flowBatched+" (lease with accept: true, then one batch complete per lease answer)")
	fs.IntVar(&cfg.nodes, "nodes", 32, "worker nodes to register, each with its own key")
	fs.IntVar(&cfg.jobs, "jobs", 3000, "run: jobs to dispatch and run")
	fs.StringVar(&cfg.jobType, "job-type", "status_check", "the job type dispatched, and the one the nodes register")
	fs.IntVar(&cfg.maxJobs, "max-jobs", 10, "run: max_jobs of a lease request, and each node's governor max_jobs (1 to 32)")
	fs.IntVar(&cfg.perNode, "job-concurrency", 0, "run: jobs each node accepts and completes at once (default: -max-jobs)")
	fs.IntVar(&cfg.wait, "wait-seconds", client.DefaultWaitSeconds, "wait_seconds of a lease long-poll (0 to 60)")
	fs.IntVar(&cfg.dispatch, "dispatchers", 16, "run: dispatch requests in flight")
	fs.IntVar(&cfg.rate, "rate", 0, "run: jobs dispatched a second, evenly (0: as fast as the dispatchers go); below the server's capacity the latencies are the server's, not a backlog's")
	fs.IntVar(&cfg.batch, "dispatch-batch", 1, "run: jobs per dispatch request: 1 sends POST /operator/jobs, more POST /operator/jobs/batch (at most 100)")
	fs.IntVar(&cfg.registerN, "register-concurrency", 16, "register requests in flight")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "run: how long the jobs may take to complete")
	fs.DurationVar(&cfg.interval, "heartbeat-interval", 30*time.Second, "each node's heartbeat interval")
	fs.IntVar(&cfg.longPolls, "long-polls", 100, "fleet: nodes that keep an idle lease long-poll open (at most -nodes)")
	fs.DurationVar(&cfg.duration, "duration", 2*time.Minute, "fleet: how long the fleet heartbeats")
	fs.StringVar(&cfg.pgDSN, "pg", "", "DSN of the server's PostgreSQL database, to count commits (and statements, with pg_stat_statements) per job")
	fs.DurationVar(&cfg.pgSettle, "pg-settle", 11*time.Second, "with -pg: wait this long before each read of the counters (PostgreSQL reports an idle session's counts up to 10 s late)")
	fs.Func("server-pid", "process id of the server, to read its resident memory and CPU time (/proc/PID/status and stat); a comma-separated list sums several processes", func(s string) error {
		pids, err := parsePIDs(s)
		cfg.serverPIDs = pids
		return err
	})
	fs.BoolVar(&cfg.waitProofs, "wait-for-proofs", false, "run: completions ask to wait for their receipts' proofs (wait_for_proofs); without it they are answered at once and -check-receipts reads the proofs from GET /operator/receipts/{id}")
	fs.BoolVar(&cfg.checkRcpts, "check-receipts", true, "run: verify every completion's receipts (needs the receipt verifier key)")
	fs.StringVar(&cfg.origin, "origin", receipts.DefaultOrigin, "the receipt log's checkpoint origin")
	fs.BoolVar(&cfg.verbose, "v", false, "log the clients' retries to standard error")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write loadgen's own CPU profile (go tool pprof) to this file, to see what the load costs the client")
	fs.StringVar(&tokensFile, "tokens-file", "", "JSON file with operator_token, provisioning_token and receipt_public_key, as cmd/server -tokens-file writes it")
	fs.StringVar(&opFile, "operator-token-file", "", "file holding the operator token (default: -tokens-file, else $"+operatorEnv+")")
	fs.StringVar(&provFile, "provisioning-token-file", "", "file holding the provisioning (node:register) token (default: -tokens-file, else $"+provisioningEnv+")")
	fs.StringVar(&receiptKey, "receipt-key", "", "the receipt log's note verifier key (default: the tokens file's receipt_public_key)")
	if err := fs.Parse(args); err != nil {
		return nil, errUsage{err}
	}
	if fs.NArg() > 0 {
		return nil, errUsage{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	if err := cfg.check(); err != nil {
		return nil, errUsage{err}
	}
	if *caFile != "" {
		b, err := os.ReadFile(*caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca-file: %w", err)
		}
		cfg.roots = x509.NewCertPool()
		if !cfg.roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("-ca-file %s holds no PEM certificate", *caFile)
		}
	}
	toks, err := loadTokens(tokensFile, opFile, provFile, receiptKey)
	if err != nil {
		return nil, errUsage{err}
	}
	cfg.tokens = toks
	switch {
	case toks.provisioning == "":
		return nil, errUsage{fmt.Errorf("no provisioning token: give -provisioning-token-file, -tokens-file or $%s", provisioningEnv)}
	case cfg.mode == "run" && toks.operator == "":
		return nil, errUsage{fmt.Errorf("no operator token: give -operator-token-file, -tokens-file or $%s", operatorEnv)}
	case cfg.mode == "run" && cfg.checkRcpts && toks.receiptKey == "":
		return nil, errUsage{errors.New("no receipt verifier key: give -receipt-key or a -tokens-file with receipt_public_key (or -check-receipts=false)")}
	}
	return cfg, nil
}

// check refuses settings out of range.
func (c *config) check() error {
	u, err := url.Parse(c.server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-server %q is not an http(s) URL", c.server)
	}
	c.server = strings.TrimRight(c.server, "/")
	switch {
	case c.mode != "run" && c.mode != "fleet":
		return fmt.Errorf("-mode is run or fleet, not %q", c.mode)
	case c.flow != flowV02 && c.flow != flowBatched:
		return fmt.Errorf("-flow is %s or %s, not %q", flowV02, flowBatched, c.flow)
	case c.nodes < 1:
		return errors.New("-nodes must be at least 1")
	case c.mode == "run" && c.jobs < 1:
		return errors.New("-jobs must be at least 1")
	case c.jobType == "":
		return errors.New("-job-type is empty")
	case c.maxJobs < 1 || c.maxJobs > wire.MaxJobsPerLease:
		return fmt.Errorf("-max-jobs is 1 to %d", wire.MaxJobsPerLease)
	case c.perNode < 0:
		return errors.New("-job-concurrency must not be negative")
	case c.wait < 0 || c.wait > wire.MaxWaitSeconds:
		return fmt.Errorf("-wait-seconds is 0 to %d", wire.MaxWaitSeconds)
	case c.rate < 0:
		return errors.New("-rate must not be negative")
	case c.batch < 1 || c.batch > wire.MaxBatchDispatch:
		return fmt.Errorf("-dispatch-batch must be 1 to %d", wire.MaxBatchDispatch)
	case c.dispatch < 1:
		return errors.New("-dispatchers must be at least 1")
	case c.registerN < 1:
		return errors.New("-register-concurrency must be at least 1")
	case c.timeout <= 0:
		return errors.New("-timeout must be positive")
	case c.interval <= 0:
		return errors.New("-heartbeat-interval must be positive")
	case c.longPolls < 0:
		return errors.New("-long-polls must not be negative")
	case c.mode == "fleet" && c.longPolls > 0 && c.wait == 0:
		return errors.New("-wait-seconds 0 makes no long-poll: give 1 to 60, or -long-polls 0")
	case c.duration <= 0:
		return errors.New("-duration must be positive")
	case c.pgSettle < 0:
		return errors.New("-pg-settle must not be negative")
	}
	c.longPolls = min(c.longPolls, c.nodes)
	if c.perNode == 0 || c.perNode > c.maxJobs {
		c.perNode = c.maxJobs
	}
	return nil
}

// The flows of run mode (-flow).
const (
	// flowV02 is the seed's contract: lease, then accept and complete
	// each job with a request of its own.
	flowV02 = "v02"
	// flowBatched leases with accept: true and completes the jobs of a
	// lease answer with one POST /workers/jobs/complete.
	flowBatched = "batched"
)

// parsePIDs parses -server-pid: process ids, separated by commas.
func parsePIDs(s string) ([]int, error) {
	var pids []int
	for f := range strings.SplitSeq(s, ",") {
		pid, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || pid < 1 {
			return nil, fmt.Errorf("%q is not a process id", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// maxTokenFile bounds what is read of a token or tokens file.
const maxTokenFile = 64 << 10

// loadTokens finds the tokens: each from its own file if given, else
// from the tokens file, else from its environment variable (which is
// then removed from the environment).
func loadTokens(tokensFile, opFile, provFile, receiptKey string) (tokens, error) {
	var t tokens
	if tokensFile != "" {
		b, err := readSmall(tokensFile)
		if err != nil {
			return t, fmt.Errorf("-tokens-file: %w", err)
		}
		var f struct {
			OperatorToken     string `json:"operator_token"`
			ProvisioningToken string `json:"provisioning_token"`
			ReceiptPublicKey  string `json:"receipt_public_key"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return t, fmt.Errorf("-tokens-file %s is not a tokens JSON object: %w", tokensFile, err)
		}
		t = tokens{operator: f.OperatorToken, provisioning: f.ProvisioningToken, receiptKey: f.ReceiptPublicKey}
	}
	opEnv, provEnv := strings.TrimSpace(os.Getenv(operatorEnv)), strings.TrimSpace(os.Getenv(provisioningEnv))
	_ = os.Unsetenv(operatorEnv)
	_ = os.Unsetenv(provisioningEnv)
	for _, x := range []struct {
		flag, file, env string
		dst             *string
	}{
		{"-operator-token-file", opFile, opEnv, &t.operator},
		{"-provisioning-token-file", provFile, provEnv, &t.provisioning},
	} {
		switch {
		case x.file != "":
			tok, err := readToken(x.file)
			if err != nil {
				return t, fmt.Errorf("%s: %w", x.flag, err)
			}
			*x.dst = tok
		case *x.dst == "":
			*x.dst = x.env
		}
	}
	if receiptKey != "" {
		t.receiptKey = receiptKey
	}
	return t, nil
}

// readSmall reads a file of at most maxTokenFile bytes.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTokenFile {
		return nil, fmt.Errorf("%s is over %d bytes", path, maxTokenFile)
	}
	return b, nil
}

// readToken reads a file that holds one token.
func readToken(path string) (string, error) {
	b, err := readSmall(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("%s is empty", path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", fmt.Errorf("%s holds more than one word: it should hold one token", path)
	}
	return tok, nil
}

// run parses args and runs the mode they name, writing the report to
// stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if cfg.verbose {
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.mode == "fleet" {
		return runFleet(ctx, cfg, log, stdout)
	}
	l, err := newLoad(cfg, log)
	if err != nil {
		return err
	}
	return l.run(ctx, stdout)
}

// httpClient returns a client for conns requests in flight to one host,
// counting its exchanges in ct. It has no overall timeout: the workers'
// client bounds each attempt, long-polls included.
func httpClient(cfg *config, conns int, ct *countingTransport) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: cfg.roots, MinVersion: tls.VersionTLS12}
	tr.MaxIdleConns = conns
	tr.MaxIdleConnsPerHost = conns // the default, 2, would open a connection per request
	ct.next = tr
	return &http.Client{Transport: ct}
}
