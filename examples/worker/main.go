// Command worker is a runnable nodelane worker node built on
// workerapi/client's Runner: it registers on first start, heartbeats, leases jobs
// with long-polls, and runs the example handlers (status_check,
// embedding_dry_run and a simulated lora_train, see examples/internal/jobs).
//
//	go run ./examples/worker -server http://127.0.0.1:8080 \
//	    -provisioning-token-file /etc/nodelane/provisioning-token -gpu rtx-4090:24576
//
// The node's Ed25519 key and, once registered, its worker token live in
// the -identity file (0600). The provisioning token is read from the file
// -provisioning-token-file names, or else from the environment variable
// NODELANE_PROVISIONING_TOKEN, never from the command line, where every
// local user could read it (ps, /proc). It is needed only while the
// identity has no worker token (the first start), or to register again
// if that token expired or was revoked: the worker renews its token itself
// (POST /workers/token, signed by its key), so the provisioning token may
// be deleted once the worker has registered. SIGTERM or SIGINT drains the
// worker: it leases nothing more, lets running jobs finish within
// -drain-timeout, and releases the rest.
//
// Its GPUs are those nvidia-smi lists (examples/internal/gpu), each
// registered under a short SKU made from its name ("NVIDIA GeForce RTX
// 4090" is rtx-4090, "NVIDIA H100 80GB HBM3" h100) with its memory as
// vram_mb, unless -gpu SKU:VRAM_MB names them (repeatable). -nvidia-smi
// names the program (default: "nvidia-smi" on PATH); "off" turns it off.
// Without an nvidia-smi (none on PATH, or off) and without -gpu, the
// worker registers one simulated rtx-4090 of 24576 MiB, so the example
// jobs run anywhere. An nvidia-smi that -nvidia-smi names but that is
// absent stops the worker at start, and so, without -gpu, does one that
// fails or answers what it was not asked; one that lists no GPU makes a
// CPU-only worker. While there is
// an nvidia-smi, each heartbeat's metrics carry every GPU's utilisation,
// memory and temperature, sampled every 10 s (docs/PROTOCOL.md §5.2).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodelane/nodelane/examples/internal/jobs"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stderr)
	var usage errUsage
	switch {
	case errors.As(err, &usage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// errUsage is a command-line error the flag package has reported.
type errUsage struct{ error }

// gpuFlags is the repeatable -gpu flag.
type gpuFlags []wire.GPU

func (g *gpuFlags) String() string {
	var s []string
	for _, x := range *g {
		s = append(s, fmt.Sprintf("%s:%d", x.SKU, x.VRAMMB))
	}
	return strings.Join(s, ",")
}

func (g *gpuFlags) Set(v string) error {
	x, err := jobs.ParseGPU(v)
	if err != nil {
		return err
	}
	*g = append(*g, x)
	return nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		server       = fs.String("server", "http://127.0.0.1:8080", "control plane base URL")
		identityPath = fs.String("identity", "nodelane-worker.json", "identity file: the node key and worker token (0600)")
		provFile     = fs.String("provisioning-token-file", "", "file holding the node:register token, needed only until the worker has registered (default: $"+provisioningEnv+"); never put the token itself on the command line")
		nodeID       = fs.String("node-id", "", "node id to register (default: the identity's, else the host name)")
		name         = fs.String("name", "", "display name (default: the node id)")
		maxJobs      = fs.Int("max-jobs", 1, "jobs run at once")
		workdir      = fs.String("workdir", "nodelane-work", "directory for job outputs (lora_train checkpoints)")
		drainTimeout = fs.Duration("drain-timeout", client.DefaultDrainTimeout, "on SIGTERM/SIGINT, how long running jobs may take to finish before they are released")
		waitSeconds  = fs.Int("wait-seconds", client.DefaultWaitSeconds, "lease long-poll, in seconds (max 60)")
		verbose      = fs.Bool("v", false, "debug logging")
		nvidiaSMI    = fs.String("nvidia-smi", "", `nvidia-smi to run for GPU discovery and heartbeat metrics (default: "nvidia-smi" on PATH; "off": neither)`)
		gpus         gpuFlags
	)
	fs.Var(&gpus, "gpu", "GPU as SKU:VRAM_MB (repeatable; default: the GPUs nvidia-smi lists, else rtx-4090:24576)")
	if err := fs.Parse(args); err != nil {
		return errUsage{err} // the flag package has said why
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	provToken, err := provisioningToken(*provFile)
	if err != nil {
		return err
	}
	if *maxJobs < 1 {
		return errors.New("-max-jobs must be at least 1")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	id, err := client.LoadOrCreateIdentity(*identityPath)
	if err != nil {
		return err
	}
	node := *nodeID
	if node == "" {
		node = id.NodeID()
	}
	if node == "" {
		if node, err = os.Hostname(); err != nil || node == "" {
			return errors.New("no -node-id and no host name")
		}
	}
	if id.Token() == "" && provToken == "" {
		return fmt.Errorf("%s holds no worker token: give -provisioning-token-file (or %s) to register", *identityPath, provisioningEnv)
	}
	if *provFile != "" {
		warnIfShared(log, *provFile)
	}
	// gs.devices are the GPUs nvidia-smi listed (none with -gpu or
	// without nvidia-smi): their indices and UUIDs are what a job's
	// CUDA_VISIBLE_DEVICES may name.
	gs, err := setupGPUs(ctx, log, *nvidiaSMI, gpus)
	if err != nil {
		return err
	}
	gpus = gs.gpus
	var metrics func() any
	if gs.sampler != nil {
		sctx, stopSampler := context.WithCancel(ctx)
		defer stopSampler()
		go gs.sampler.Run(sctx)
		metrics = func() any { return gs.sampler.Metrics() }
	}

	c, err := client.New(*server, &client.Config{Identity: id, Logger: log})
	if err != nil {
		return err
	}
	w, err := client.NewRunner(c, &client.RunnerConfig{
		MaxConcurrent:     *maxJobs,
		ProvisioningToken: provToken,
		Registration:      jobs.Registration(node, *name, gpus, *maxJobs),
		WaitSeconds:       *waitSeconds,
		DrainTimeout:      *drainTimeout,
		Metrics:           metrics,
		Logger:            log,
	})
	if err != nil {
		return err
	}
	jobs.Register(w, *workdir)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("worker starting", "server", *server, "node_id", node, "key_id", id.KeyID(),
		"registered", id.Token() != "", "gpus", gpus.String(), "max_jobs", *maxJobs)
	if err := w.Run(ctx); err != nil {
		return err
	}
	log.Info("worker stopped")
	return nil
}
