// Command worker is a runnable nodelane worker node built on
// workerapi/client's Runner: it registers on first start, heartbeats, leases jobs
// with long-polls, and runs the example handlers (status_check,
// embedding_dry_run and a simulated lora_train, see cmd/internal/jobs).
//
//	go run ./cmd/worker -server http://127.0.0.1:8080 \
//	    -provisioning-token-file /etc/nodelane/provisioning-token -gpu rtx-4090:24576
//
// The node's Ed25519 key and, once registered, its worker token live in
// the -identity file (0600). The provisioning token is read from the file
// -provisioning-token-file names, or else from the environment variable
// NODELANE_PROVISIONING_TOKEN, never from the command line, where every
// local user could read it (ps, /proc). It is needed only while the
// identity has no worker token (the first start), or to register again
// if that token expired or was revoked: the worker renews its token itself
// (POST /workers/token, signed by its key), so once a registration's
// worker token is saved the worker removes the -provisioning-token-file
// (-keep-token-file keeps it, for a file managed elsewhere). SIGTERM or SIGINT drains the
// worker: it leases nothing more, lets running jobs finish within
// -drain-timeout, and releases the rest.
//
// Its GPUs are those nvidia-smi lists (cmd/internal/gpu), each
// registered under a short SKU made from its name ("NVIDIA GeForce RTX
// 4090" is rtx-4090, "NVIDIA H100 80GB HBM3" h100) with its memory as
// vram_mb, unless -gpu SKU:VRAM_MB names them (repeatable). -nvidia-smi
// names the program (default: "nvidia-smi" on PATH); "off" turns it off.
// Without an nvidia-smi (none on PATH, or off) and without -gpu, the
// worker refuses to start, naming -gpu and -simulate-gpu: a real box is
// never registered, and billed, as a GPU it does not have. -simulate-gpu
// registers one simulated rtx-4090 of 24576 MiB (and runs no nvidia-smi),
// so the example jobs run anywhere; the demo and the tests pass it. An nvidia-smi that -nvidia-smi names but that is
// absent stops the worker at start, and so, without -gpu, does one that
// fails or answers what it was not asked; one that lists no GPU makes a
// CPU-only worker. While there is
// an nvidia-smi, each heartbeat's metrics carry every GPU's utilisation,
// memory and temperature, sampled every 10 s (docs/PROTOCOL.md §5.2).
//
// The worker speaks https to a -server that is not this machine: it
// refuses a plain http:// URL to another host, whose bearer tokens would
// cross the network in clear, unless -insecure-http is given. -ca-file
// names the PEM certificate authorities it trusts instead of the
// system's (a private PKI), -pin-sha256 (repeatable) the public keys one
// of which the server's certificate chain must hold (the example server
// logs its own), and -connect HOST:PORT the address it connects to
// instead of the URL's host, which stays the TLS name and the signed
// @authority (as curl --connect-to). A redirect is never followed.
//
// With -config worker.toml the worker runs commands instead of the example
// handlers: each [[job]] table maps a job type to a command line
// (cmd/internal/command, docs/COMMANDS.md), and the worker registers
// those job types only. The GPUs of the -gpu flags are the devices "0",
// "1", ... handed to the commands in CUDA_VISIBLE_DEVICES. The file's
// tags, and the -tag flags, are the worker's registration tags. A
// command's nodelane:artifact files are uploaded to the control plane
// when it stores artifact bytes (reported as metadata only when it
// answers artifact_storage_off, logged once), and a job completes only
// once its uploads are stored; an attempt that resumes from a
// checkpoint gets it downloaded, at NODELANE_RESUME_FROM. With a
// top-level user = "..." in the file the commands run as that user, so
// that they cannot read the identity or the token files; the worker must
// then be root (docs/COMMANDS.md §7), and it refuses to start otherwise.
// Without one it warns that the commands can read whatever its own user
// can. An artifact, or a result.json, that is the identity or the token
// file (a hard link to it) is refused.
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
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/nodelane/nodelane/cmd/internal/command"
	"github.com/nodelane/nodelane/cmd/internal/jobs"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func main() {
	// The worker's executable is also the command shim it starts each
	// job's command through (cmd/internal/command, DESIGN.md §10a).
	if len(os.Args) > 1 && os.Args[1] == command.ShimArg {
		os.Exit(command.ShimMain(os.Args[2:]))
	}
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

// tagFlags is the repeatable -tag flag.
type tagFlags []string

func (t *tagFlags) String() string { return strings.Join(*t, ",") }

func (t *tagFlags) Set(v string) error {
	if err := wire.CheckTag(v); err != nil {
		return fmt.Errorf("tag %q %v", v, err)
	}
	*t = append(*t, v)
	return nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		server       = fs.String("server", "http://127.0.0.1:8080", "control plane base URL")
		identityPath = fs.String("identity", "nodelane-worker.json", "identity file: the node key and worker token (0600)")
		provFile     = fs.String("provisioning-token-file", "", "file holding the node:register token, needed only until the worker has registered, and removed then (default: $"+provisioningEnv+"); never put the token itself on the command line")
		keepToken    = fs.Bool("keep-token-file", false, "keep the -provisioning-token-file after registering (by default it is removed)")
		nodeID       = fs.String("node-id", "", "node id to register (default: the identity's, else the host name)")
		name         = fs.String("name", "", "display name (default: the node id)")
		maxJobs      = fs.Int("max-jobs", 1, "jobs run at once")
		workdir      = fs.String("workdir", "nodelane-work", "directory for job outputs (lora_train checkpoints; with -config, each job's run directory)")
		configPath   = fs.String("config", "", "TOML file mapping job types to commands (docs/COMMANDS.md); the worker then runs only those")
		drainTimeout = fs.Duration("drain-timeout", client.DefaultDrainTimeout, "on SIGTERM/SIGINT, how long running jobs may take to finish before they are released")
		waitSeconds  = fs.Int("wait-seconds", client.DefaultWaitSeconds, "lease long-poll, in seconds (max 60)")
		hbInterval   = fs.Duration("heartbeat-interval", 0, "heartbeat interval (default: the server's next_heartbeat_seconds); cancels, drains, bans and retirements arrive within seconds through the signals long-poll whatever it is")
		verbose      = fs.Bool("v", false, "debug logging")
		nvidiaSMI    = fs.String("nvidia-smi", "", `nvidia-smi to run for GPU discovery and heartbeat metrics (default: "nvidia-smi" on PATH; "off": neither)`)
		insecureHTTP = fs.Bool("insecure-http", false, "allow an http:// -server that is not this machine (its tokens cross the network in clear)")
		caFile       = fs.String("ca-file", "", "PEM file of the certificate authorities to trust for an https -server, instead of the system's (a private PKI)")
		simulateGPU  = fs.Bool("simulate-gpu", false, "register one simulated rtx-4090:24576 instead of real GPUs (tests and demos; exclusive with -gpu)")
		waitProofs   = fs.Bool("wait-for-proofs", false, "completions wait for their receipts' proofs and checkpoint (wait_for_proofs); by default they are answered at once with the receipts alone")
		connect      = fs.String("connect", "", "HOST:PORT to connect to instead of the -server URL's host; TLS and signatures still use the URL's host (as curl --connect-to)")
		gpus         gpuFlags
		tags         tagFlags
		pins         pinFlags
	)
	fs.Var(&gpus, "gpu", "GPU as SKU:VRAM_MB (repeatable; default: the GPUs nvidia-smi lists; without nvidia-smi, -gpu or -simulate-gpu is required)")
	fs.Var(&tags, "tag", "registration tag (repeatable), beside the -config file's tags")
	fs.Var(&pins, "pin-sha256", "base64 SHA-256 of a public key the server's certificate chain must hold (repeatable; see client.PublicKeyPin)")
	if err := fs.Parse(args); err != nil {
		return errUsage{err} // the flag package has said why
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	ccfg := &client.Config{AllowInsecureHTTP: *insecureHTTP, PinnedPublicKeys: pins}
	if err := transportFlags(ccfg, *caFile, *connect); err != nil {
		return err
	}
	provToken, err := provisioningToken(*provFile)
	if err != nil {
		return err
	}
	if *maxJobs < 1 {
		return errors.New("-max-jobs must be at least 1")
	}
	if *hbInterval < 0 {
		return errors.New("-heartbeat-interval must not be negative")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var cmdCfg *command.Config
	if *configPath != "" {
		if cmdCfg, err = command.Load(*configPath); err != nil {
			return err
		}
	}
	// The registration's tags: the example's, or the -config file's, and
	// the -tag flags.
	regTags := []string{"example"}
	if cmdCfg != nil {
		regTags = slices.Clone(cmdCfg.Tags)
	}
	for _, t := range tags {
		if !slices.Contains(regTags, t) {
			regTags = append(regTags, t)
		}
	}
	if len(regTags) > wire.MaxTags {
		return fmt.Errorf("%d tags, at most %d", len(regTags), wire.MaxTags)
	}
	// gs.devices are the GPUs nvidia-smi listed (none with -gpu or
	// without nvidia-smi): their indices and UUIDs are what a job's
	// CUDA_VISIBLE_DEVICES may name.
	gs, err := setupGPUs(ctx, log, *nvidiaSMI, gpus, *simulateGPU)
	if err != nil {
		return err
	}
	gpus = gs.gpus
	// With -config, the commands run on the GPUs nvidia-smi listed, named
	// by their indices (CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them as
	// nvidia-smi does), else on the devices "0", "1", ... of the -gpu flags.
	var cmds *command.Executor
	if cmdCfg != nil {
		ids := make([]string, len(gpus))
		for i := range gpus {
			ids[i] = strconv.Itoa(i)
		}
		for i, d := range gs.devices {
			ids[i] = strconv.Itoa(d.Index)
		}
		devs, err := command.NewDevices(ids)
		if err != nil {
			return err
		}
		shim, err := os.Executable()
		if err != nil {
			return fmt.Errorf("the worker's executable, to run the commands through: %w", err)
		}
		// No artifact is the identity or the token file, whatever its path.
		protected := []string{*identityPath}
		if *provFile != "" {
			protected = append(protected, *provFile)
		}
		if cmds, err = command.NewExecutor(cmdCfg, devs, &command.Options{Workdir: *workdir, Logger: log, Shim: shim, Protected: protected}); err != nil {
			return err
		}
	}
	// What a previous run of this worker left behind (it was killed with
	// its commands' shims) is killed before the worker registers or
	// leases: those jobs are forfeit, and the control plane requeues them.
	left, err := command.KillLeftovers(*workdir, command.DefaultLeftoverTimeout)
	for _, l := range left {
		log.Warn("killed the processes a previous run of the worker left behind", "job", l.JobID, "attempt", l.Attempt,
			"pgid", l.PGID, "pids", fmt.Sprint(l.PIDs), "shim_pid", l.ShimPID)
	}
	if err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	var metrics func() any
	if gs.sampler != nil {
		sctx, stopSampler := context.WithCancel(ctx)
		defer stopSampler()
		go gs.sampler.Run(sctx)
		metrics = func() any { return gs.sampler.Metrics() }
	}

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
	ccfg.Identity, ccfg.Logger = id, log
	c, err := client.New(*server, ccfg)
	if err != nil {
		return err
	}
	reg := jobs.Registration(node, *name, gpus, *maxJobs)
	reg.Tags = regTags
	if cmdCfg != nil {
		reg.Capabilities.JobTypes = cmdCfg.Types()
	}
	var registered func(wire.RegisterResponse)
	if *provFile != "" {
		registered = dropTokenFile(log, *provFile, *keepToken)
	}
	w, err := client.NewRunner(c, &client.RunnerConfig{
		MaxConcurrent:     *maxJobs,
		ProvisioningToken: provToken,
		Registered:        registered,
		Registration:      reg,
		WaitSeconds:       *waitSeconds,
		HeartbeatInterval: *hbInterval,
		DrainTimeout:      *drainTimeout,
		WaitForProofs:     *waitProofs,
		Metrics:           metrics,
		Logger:            log,
	})
	if err != nil {
		return err
	}
	if cmds != nil {
		cmds.Register(w)
	} else {
		jobs.Register(w, *workdir)
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("worker starting", "server", *server, "node_id", node, "key_id", id.KeyID(),
		"registered", id.Token() != "", "gpus", gpus.String(), "max_jobs", *maxJobs, "job_types", reg.Capabilities.JobTypes)
	err = w.Run(ctx)
	if cmds != nil {
		// A job the drain released may still be in its kill_grace: no
		// command outlives the worker.
		cmds.Wait()
	}
	if err != nil {
		return err
	}
	log.Info("worker stopped")
	return nil
}
