// Command demo runs nodelane end to end in one process, on an embedded
// SQLite database in a temporary directory, and says what it does at each
// step:
//
//	go run ./cmd/demo [-addr HOST:PORT] [-dir DIR] [-serve=false] [-v]
//
// It starts the control plane (the same wiring as cmd/server) on -addr
// (by default a free loopback port, so that the demo never collides with
// a server already running; -addr 127.0.0.1:8081 gives the console a
// stable URL), starts a worker node with the example handlers (the same
// as cmd/worker), registers it, dispatches a safe job (status_check)
// and waits for it, dispatches lora_train and shows the envelope holding
// it, activates the runtime, waits for lora_train to succeed, prints its
// cost from its job_charged receipt, and finally exports the receipt log
// and verifies every receipt offline with nothing but the verifier key.
//
// The control plane also serves the web console (package console) at
// /console/, whose URL the demo prints: sign in with the operator token of
// nodelane-tokens.json in the demo's directory. After its last step the
// demo keeps the control plane, the worker and the console running until
// it is interrupted, so that the console can be opened on what the demo
// did; with -serve=false it stops there.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/cmd/internal/jobs"
	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	var usage errUsage
	if errors.As(err, &usage) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// listen binds the demo's -addr, which must be a loopback address: the
// demo serves the operator API and the console over plain HTTP with
// credentials it keeps in a file, which is no service for a network.
func listen(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-addr %q: the demo serves plain HTTP, on a loopback address only (127.0.0.1:PORT, [::1]:PORT or localhost:PORT)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-addr: %w", err)
	}
	return ln, nil
}

// errUsage is a command-line error the flag package has reported.
type errUsage struct{ error }

// price is what the demo charges for an rtx-4090 hour: $1.80.
const price = "rtx-4090=1800000"

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stdout)
	addr := fs.String("addr", "127.0.0.1:0", "address for the control plane and the web console (port 0: a free port, printed)")
	dir := fs.String("dir", "", "directory for the database, secrets, identity and outputs (default: a temporary directory, removed at the end)")
	verbose := fs.Bool("v", false, "show the control plane's and the worker's logs on stderr")
	timeout := fs.Duration("timeout", 50*time.Second, "give up after this long")
	serveOn := fs.Bool("serve", true, "after the last step, keep serving the web console (and the control plane and the worker) until interrupted; false: stop")
	if err := fs.Parse(args); err != nil {
		return errUsage{err} // the flag package has said why
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	say := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "nodelane-demo-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	} else if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}

	// The address is bound before anything is created, so that a busy
	// port stops the demo before it bootstraps a -dir database.
	ln, err := listen(*addr)
	if err != nil {
		return err
	}
	defer ln.Close() // after Serve has taken it, a second Close is harmless

	// 1. The control plane.
	var prices receipts.Prices
	if err := prices.Set(price); err != nil {
		return err
	}
	dbPath := filepath.Join(*dir, "nodelane.db")
	say("1. Starting the control plane on SQLite (%s)", dbPath)
	cp, err := controlplane.Open(ctx, controlplane.Options{
		DB: "sqlite:" + dbPath, SecretsFile: filepath.Join(*dir, "nodelane-secrets.json"),
		LeaseTTL: 60 * time.Second, AcceptTimeout: 20 * time.Second, MaintainInterval: 250 * time.Millisecond, Prices: prices, Logger: logger.With("component", "control-plane"),
	})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := cp.Close(sctx); err != nil {
			say("   closing the control plane: %v", err)
		}
	}()
	tokens, err := bootstrap(ctx, cp, filepath.Join(*dir, "nodelane-tokens.json"))
	if err != nil {
		return err
	}
	con, err := console.New(console.Config{API: cp.Server.OperatorHandler(), VerifierKey: cp.Server.ReceiptVerifierKey()})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", con))
	mux.Handle("/", cp.Server.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if err := cp.Server.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	base := "http://" + ln.Addr().String()
	tokensPath := filepath.Join(*dir, "nodelane-tokens.json")
	say("   listening on %s; operator and provisioning credentials minted (kept in %s, not printed)", base, filepath.Base(tokensPath))
	say("   web console: %s/console/ (sign in with operator_token from %s)", base, tokensPath)
	api, err := operator.New(base, tokens.OperatorToken, &operator.Config{HTTPClient: &http.Client{Timeout: 30 * time.Second}})
	if err != nil {
		return err
	}

	// 2. The worker node.
	say("2. Registering a worker node (Ed25519 key, signed requests)")
	id, err := client.LoadOrCreateIdentity(filepath.Join(*dir, "nodelane-worker.json"))
	if err != nil {
		return err
	}
	c, err := client.New(base, &client.Config{Identity: id, Logger: logger.With("component", "worker")})
	if err != nil {
		return err
	}
	reg := jobs.Registration("demo-gpu-1", "Demo GPU node", []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, 1)
	if id.Token() == "" {
		out, err := c.Register(ctx, tokens.ProvisioningToken, *reg)
		if err != nil {
			return fmt.Errorf("register: %w", err)
		}
		say("   registered node %s as worker %s (policy version %d)", reg.NodeID, out.WorkerID, out.PolicyVersion)
	} else {
		say("   node %s is already registered as worker %s", id.NodeID(), id.WorkerID())
	}
	w, err := client.NewRunner(c, &client.RunnerConfig{
		ProvisioningToken: tokens.ProvisioningToken, Registration: reg,
		WaitSeconds: 5, LogFlushInterval: 200 * time.Millisecond, DrainTimeout: 5 * time.Second,
		Logger: logger.With("component", "worker"),
	})
	if err != nil {
		return err
	}
	jobs.Register(w, filepath.Join(*dir, "work"))
	wctx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	defer func() {
		stopWorker()
		if werr := <-workerDone; werr != nil && err == nil {
			err = fmt.Errorf("worker: %w", werr)
		}
	}()

	// 3. A safe job.
	say("3. Dispatching a safe job (status_check) through POST /operator/jobs")
	d, err := dispatch(ctx, api, jobs.StatusCheck, nil)
	if err != nil {
		return err
	}
	say("   job %s queued, leasable=%t", d.Job.ID, d.Leasable)
	job, err := waitDone(ctx, api, d.Job.ID)
	if err != nil {
		return err
	}
	if job.Job.State != "succeeded" {
		return fmt.Errorf("status_check ended %s", job.Job.State)
	}
	say("   status_check succeeded on worker %s", deref(job.Job.WorkerID))

	// 4. A blocked job.
	say("4. Dispatching lora_train, a type the envelope blocks until an operator activates the runtime")
	d, err = dispatch(ctx, api, jobs.LoraTrain, map[string]any{"steps": 8, "step_ms": 50})
	if err != nil {
		return err
	}
	loraID := d.Job.ID
	say("   job %s queued, leasable=%t, reason: %s", loraID, d.Leasable, d.Reason)
	if d.Leasable {
		return errors.New("the envelope did not hold lora_train")
	}
	// Give the worker a chance to (not) take it.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	if job, err = api.Job(ctx, loraID, 0); err != nil {
		return err
	}
	say("   one second later it is still %s: held by the envelope (leasable=%t)", job.Job.State, job.Leasable)
	if job.Job.State != "queued" {
		return fmt.Errorf("lora_train is %s before activation", job.Job.State)
	}

	// 5. Activate.
	say("5. Activating the runtime through POST /operator/envelope/activate")
	env, err := api.ActivateEnvelope(ctx, wire.ActivateRequest{Reason: "demo: allow lora_train"})
	if err != nil {
		return err
	}
	say("   runtime active=%t, policy version %d (receipt %s)", env.Active, env.PolicyVersion, env.ReceiptID)

	// 6. lora_train runs.
	say("6. Waiting for lora_train to run and succeed")
	if job, err = waitDone(ctx, api, loraID); err != nil {
		return err
	}
	if job.Job.State != "succeeded" {
		return fmt.Errorf("lora_train ended %s", job.Job.State)
	}
	progress := 0
	for _, e := range job.Events {
		if e.EventType != nil && *e.EventType == "progress" {
			progress++
		}
	}
	say("   lora_train succeeded: %d progress events, %d artifact(s)", progress, len(job.Artifacts))
	for _, a := range job.Artifacts {
		sum := deref(a.ChecksumSHA256)
		say("   artifact %s %s, %d bytes, sha256 %s", a.ArtifactType, a.URI, a.SizeBytes, sum)
	}
	if job.Result != nil && len(job.Result.Metrics) > 0 {
		say("   metrics %s", job.Result.Metrics)
	}

	// 7. Cost.
	say("7. The cost, from the job's job_charged receipt (GET /operator/receipts)")
	charge, err := findCharge(ctx, api, loraID)
	if err != nil {
		return err
	}
	say("   actual_ms=%d actual_hours=%s actual_cost_usd=%s (rate %s USD per GPU-hour on %s)",
		charge.ActualMS, receipts.Hours(charge.ActualMS), receipts.FormatMicros(charge.CostMicros),
		receipts.FormatMicros(charge.RateMicros), charge.GPUSKU)

	// 8. Export and verify offline.
	say("8. Exporting the receipt log and verifying it offline with only the verifier key")
	if _, err := cp.Server.Sequence(ctx); err != nil {
		return fmt.Errorf("sequencing: %w", err)
	}
	var export bytes.Buffer
	ckpt, err := receipts.NewLog(cp.DB.ReceiptStore(), nil).Export(ctx, &export)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	exportPath := filepath.Join(*dir, "receipts.jsonl")
	if err := os.WriteFile(exportPath, export.Bytes(), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*dir, "checkpoint.note"), ckpt.Note, 0o600); err != nil {
		return err
	}
	n, err := verifyExport(export.Bytes(), ckpt.Note, tokens.ReceiptPublicKey, receipts.DefaultOrigin)
	if err != nil {
		return fmt.Errorf("offline verification: %w", err)
	}
	say("   %d receipts verified against the signed checkpoint of tree size %d (key %s)", n, ckpt.Size, keyName(tokens.ReceiptPublicKey))

	if *serveOn {
		say("Done. The web console stays open at %s/console/ (operator_token in %s); press Ctrl-C to stop.", base, tokensPath)
		<-outer.Done()
		return nil
	}
	say("Done: the worker drains and the control plane stops.")
	return nil
}

// bootstrap mints the first credentials, or reads them back from a
// previous run in the same directory.
func bootstrap(ctx context.Context, cp *controlplane.ControlPlane, path string) (*controlplane.Tokens, error) {
	boot, err := cp.Server.Bootstrap(ctx)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if boot.Created {
		t := &controlplane.Tokens{OperatorToken: boot.OperatorToken, ProvisioningToken: boot.ProvisioningToken,
			ReceiptPublicKey: cp.Server.ReceiptVerifierKey()}
		return t, controlplane.WriteFileAtomic(path, t)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the database is bootstrapped already and its tokens file is unreadable: %w", err)
	}
	var t controlplane.Tokens
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &t, nil
}

// verifyExport checks an export as cmd/verify-receipts does: every
// receipt verifies against the signed checkpoint with its inclusion proof,
// and the receipts are exactly the log's indices 0 to size-1.
func verifyExport(export, checkpoint []byte, key, origin string) (int64, error) {
	cp, err := receipts.OpenCheckpoint(checkpoint, key, origin)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	var n int64
	for line := range bytes.Lines(export) {
		var l receipts.ExportLine
		if err := json.Unmarshal(line, &l); err != nil {
			return n, fmt.Errorf("line %d: %w", n+1, err)
		}
		if l.Index == nil || *l.Index != n || l.Proof == nil {
			return n, fmt.Errorf("receipt %s: not at index %d, or no proof", l.ID, n)
		}
		r, err := receipts.Verify(key, origin, l.Body, *l.Proof, checkpoint)
		if err != nil {
			return n, fmt.Errorf("receipt %s: %w", l.ID, err)
		}
		if r.ID != l.ID || r.Kind != l.Kind {
			return n, fmt.Errorf("receipt %s: the body is %s %s", l.ID, r.Kind, r.ID)
		}
		n++
	}
	if n != cp.Size {
		return n, fmt.Errorf("the export has %d receipts, the checkpoint %d", n, cp.Size)
	}
	return n, nil
}

// keyName is the name part of a note verifier key.
func keyName(k string) string {
	name, _, _ := strings.Cut(k, "+")
	return name
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// dispatch queues a job of jobType on one rtx-4090 with payload ({} when
// nil).
func dispatch(ctx context.Context, api *operator.Client, jobType string, payload any) (*wire.DispatchResponse, error) {
	p := json.RawMessage(`{}`)
	if payload != nil {
		b, err := json.Marshal(payload)
		if err != nil {
			return nil, err
		}
		p = b
	}
	return api.Dispatch(ctx, wire.DispatchRequest{JobType: jobType, Payload: p,
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 1}, MaxAttempts: 3})
}

// waitDone polls the job until it has ended.
func waitDone(ctx context.Context, api *operator.Client, id string) (*wire.JobDetailResponse, error) {
	for {
		d, err := api.Job(ctx, id, 0)
		if err != nil {
			return nil, err
		}
		switch d.Job.State {
		case "succeeded", "failed", "canceled":
			return d, nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("waiting for job %s (%s): %w", id, d.Job.State, err)
		}
	}
}

// findCharge reads the sequenced job_charged receipts until it finds the
// job's (it may take a moment to be sequenced).
func findCharge(ctx context.Context, api *operator.Client, jobID string) (*receipts.Receipt, error) {
	for {
		for w, err := range api.Receipts(ctx, operator.ReceiptQuery{Kind: receipts.KindJobCharged, Limit: 1000}) {
			if err != nil {
				return nil, err
			}
			if w.Kind != receipts.KindJobCharged {
				continue
			}
			r, err := receipts.Decode(w.Body)
			if err != nil {
				return nil, fmt.Errorf("receipt %s: %w", w.ID, err)
			}
			if r.JobID == jobID {
				return r, nil
			}
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("waiting for the job_charged receipt of %s: %w", jobID, err)
		}
	}
}
