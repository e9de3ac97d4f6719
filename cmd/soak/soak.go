package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/cmd/internal/jobs"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// soak is one run: the cluster, the processes, what was dispatched and
// seen, and the fault counts.
type soak struct {
	cfg  *config
	out  io.Writer
	dir  string // work directory: binaries, secrets, identities, logs
	keep bool

	pg       *cluster
	servers  []*slot
	addrs    []string // base URLs, by replica
	workers  []*slot
	features features
	tokens   controlplane.Tokens
	ops      []*operator.Client // by replica
	skewed   atomic.Bool        // the last replica runs with -clock-skew

	rngMu sync.Mutex
	rng   *rand.Rand

	mu          sync.Mutex
	requests    map[int64]*request // by soak_seq
	checkpoints []seenCheckpoint
	problems    []string // found during the run

	serverKills, workerKills, pgRestarts, skewTurns atomic.Int64
	// workerRestarts counts the busy workers SIGKILLed and started again;
	// busyMisses the restart faults that found no worker holding a job.
	workerRestarts, busyMisses atomic.Int64
}

// features are the server flags the soak uses when the server has them.
type features struct {
	heartbeat bool // -heartbeat-interval and -offline-after
	clockSkew bool // -clock-skew
}

// seenCheckpoint is a checkpoint read during the run.
type seenCheckpoint struct {
	at   time.Time
	note string
	cp   *receipts.Checkpoint
}

func newSoak(ctx context.Context, cfg *config, out io.Writer) (*soak, error) {
	dir, err := os.MkdirTemp("", "nodelane-soak-")
	if err != nil {
		return nil, err
	}
	s := &soak{cfg: cfg, out: out, dir: dir, keep: cfg.keep, requests: map[int64]*request{},
		rng: rand.New(rand.NewPCG(uint64(cfg.seed), 0x50a6))}
	for _, d := range []string{"bin", "logs", "workers"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	return s, nil
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.out, "%s  %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (s *soak) problem(format string, args ...any) {
	p := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.problems = append(s.problems, p)
	s.mu.Unlock()
	s.logf("PROBLEM: %s", p)
}

func (s *soak) intn(n int) int {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.IntN(n)
}

// jitter is d times a random factor in [0.5, 1.5).
func (s *soak) jitter(d time.Duration) time.Duration {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return time.Duration(float64(d) * (0.5 + s.rng.Float64()))
}

// close stops every process and the cluster, and removes the work
// directory unless it is kept.
func (s *soak) close() error {
	var wg sync.WaitGroup
	for _, w := range s.workers {
		wg.Go(func() { w.stop(syscall.SIGKILL, 5*time.Second) })
	}
	wg.Wait()
	for _, sv := range s.servers {
		wg.Go(func() { sv.stop(syscall.SIGTERM, 10*time.Second) })
	}
	wg.Wait()
	var err error
	if s.pg != nil {
		err = s.pg.stop()
	}
	if s.keep {
		fmt.Fprintf(s.out, "work directory (logs): %s\n", s.dir)
		return err
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// run sets everything up, soaks, drains and checks.
func (s *soak) run(ctx context.Context) error {
	cfg := s.cfg
	start := time.Now()
	if err := s.binaries(ctx); err != nil {
		return err
	}
	s.logf("seed %d; %d workers on %d replicas; %.0f jobs/s for %v", cfg.seed, cfg.workers, cfg.replicas, cfg.rate, cfg.duration)
	pg, err := startCluster(ctx, cfg.pgBin)
	if err != nil {
		return fmt.Errorf("starting PostgreSQL: %w", err)
	}
	s.pg = pg
	s.logf("PostgreSQL on 127.0.0.1:%d (%s)", pg.port, pg.dir)
	if err := s.startServers(ctx); err != nil {
		return err
	}
	if err := s.startWorkers(); err != nil {
		return err
	}
	s.reportFaults()

	soakStart := time.Now()
	soakCtx, stopSoak := context.WithTimeout(ctx, cfg.duration)
	var wg sync.WaitGroup
	wg.Go(func() { s.dispatch(soakCtx, ctx) })
	cpCtx, stopCheckpoints := context.WithCancel(ctx)
	cpDone := make(chan struct{})
	go func() { defer close(cpDone); s.recordCheckpoints(cpCtx) }()
	s.faults(soakCtx, &wg)
	wg.Wait()
	stopSoak()
	if err := ctx.Err(); err != nil {
		stopCheckpoints()
		<-cpDone
		return err
	}
	// A skewed replica goes back to the true time for the drain, so the
	// last checks read the log from replicas that agree on the time.
	if s.skewed.Load() {
		s.turnSkew(false)
	}
	s.logf("soaked for %v: %d jobs dispatched; draining (at most %v)", time.Since(soakStart).Round(time.Second), len(s.snapshot()), cfg.drainTimeout)
	drainErr := s.drain(ctx)
	stopCheckpoints()
	<-cpDone
	if err := ctx.Err(); err != nil {
		return err
	}
	res := s.check(ctx, drainErr)
	s.summary(res, time.Since(start))
	if len(res.problems) > 0 {
		return errChecksFailed
	}
	return nil
}

// binaries builds the server and worker unless given, and reads the
// server's flags.
func (s *soak) binaries(ctx context.Context) error {
	for _, b := range []struct {
		path *string
		pkg  string
	}{
		{&s.cfg.serverBin, "github.com/nodelane/nodelane/cmd/server"},
		{&s.cfg.workerBin, "github.com/nodelane/nodelane/cmd/worker"},
	} {
		if *b.path != "" {
			continue
		}
		out := filepath.Join(s.dir, "bin", filepath.Base(b.pkg))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, b.pkg)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s (run the soak inside the nodelane module, or give -server-bin and -worker-bin): %w\n%s", b.pkg, err, msg)
		}
		*b.path = out
	}
	help, _ := exec.CommandContext(ctx, s.cfg.serverBin, "-h").CombinedOutput()
	has := func(name string) bool {
		return strings.Contains(string(help), "-"+name+" ") || strings.Contains(string(help), "-"+name+"\n")
	}
	s.features = features{
		heartbeat: has("heartbeat-interval") && has("offline-after"),
		clockSkew: has("clock-skew"),
	}
	return nil
}

// reportFaults says which faults run and which are skipped.
func (s *soak) reportFaults() {
	c := s.cfg
	say := func(what string, every time.Duration, skipped string) {
		switch {
		case skipped != "":
			s.logf("fault skipped:  %s (%s)", what, skipped)
		case every == 0:
			s.logf("fault off:      %s (interval 0)", what)
		default:
			s.logf("fault injected: %s, every %v or so", what, every)
		}
	}
	say("SIGKILL a server replica, start it again", c.serverKillEvery, "")
	say("SIGKILL a worker, start it again", c.workerKillEvery, "")
	say("SIGKILL a worker that holds a job, start it again on its identity within 2 s", c.workerRestartEvery, "")
	say("restart PostgreSQL (pg_ctl restart -m immediate)", c.pgRestartEvery, "")
	switch {
	case !s.features.clockSkew:
		say(fmt.Sprintf("skew the last replica's clock by %v", c.skew), c.skewEvery, "the server has no -clock-skew flag")
	case c.replicas < 2:
		say(fmt.Sprintf("skew the last replica's clock by %v", c.skew), c.skewEvery, "-replicas 1: no replica to skew")
	default:
		say(fmt.Sprintf("skew the last replica's clock by %v", c.skew), c.skewEvery, "")
	}
	if s.features.heartbeat {
		s.logf("worker liveness: -heartbeat-interval %v -offline-after %v", c.heartbeat, c.offlineAfter)
	} else {
		s.logf("worker liveness: skipped (the server has no -heartbeat-interval/-offline-after); a killed worker's jobs come back after -accept-timeout %v or -lease-ttl %v", c.acceptTimeout, c.leaseTTL)
	}
}

func (s *soak) startServers(ctx context.Context) error {
	c := s.cfg
	secrets := filepath.Join(s.dir, "secrets.json")
	tokensFile := filepath.Join(s.dir, "tokens.json")
	for i := range c.replicas {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		last := i == c.replicas-1 && i > 0
		sv := &slot{
			name: fmt.Sprintf("server-%d", i), bin: c.serverBin, noStdout: true,
			exited: func(msg string) { s.logf("%s", msg) },
			log:    filepath.Join(s.dir, "logs", fmt.Sprintf("server-%d.log", i)),
			args: func() []string {
				a := []string{"-addr", addr, "-db", s.pg.dsn(), "-secrets-file", secrets,
					"-tokens-file", tokensFile, "-lease-ttl", c.leaseTTL.String(),
					"-accept-timeout", c.acceptTimeout.String(), "-price", "default=1800000"}
				if s.features.heartbeat {
					a = append(a, "-heartbeat-interval", c.heartbeat.String(), "-offline-after", c.offlineAfter.String())
				}
				if last && s.skewed.Load() {
					a = append(a, "-clock-skew", c.skew.String())
				}
				return a
			},
		}
		if err := sv.start(); err != nil {
			return err
		}
		s.servers = append(s.servers, sv)
		s.addrs = append(s.addrs, "http://"+addr)
		if err := waitListening(ctx, addr, sv, time.Minute); err != nil {
			return err
		}
		if i == 0 {
			if err := s.readTokens(ctx, tokensFile, sv); err != nil {
				return err
			}
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, a := range s.addrs {
		op, err := operator.New(a, s.tokens.OperatorToken, &operator.Config{HTTPClient: hc, UserAgent: "nodelane-soak/1"})
		if err != nil {
			return err
		}
		s.ops = append(s.ops, op)
	}
	if _, err := s.ops[0].ActivateEnvelope(ctx, wire.ActivateRequest{Reason: "fault soak: lora_train runs"}); err != nil {
		return fmt.Errorf("activating the runtime: %w", err)
	}
	return nil
}

// readTokens waits for the tokens file the first replica writes once its
// listener is bound, and reads it.
func (s *soak) readTokens(ctx context.Context, path string, sv *slot) error {
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			if err = json.Unmarshal(b, &s.tokens); err == nil && s.tokens.OperatorToken != "" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the first replica wrote no tokens file (%v); see %s", err, sv.log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitListening waits until addr accepts connections.
func waitListening(ctx context.Context, addr string, sv *slot, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(sv.log)
			return fmt.Errorf("%s is not listening on %s after %v:\n%s", sv.name, addr, limit, tail(b, 3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *soak) startWorkers() error {
	c := s.cfg
	prov := filepath.Join(s.dir, "provisioning-token")
	if err := os.WriteFile(prov, []byte(s.tokens.ProvisioningToken+"\n"), 0o600); err != nil {
		return err
	}
	for i := range c.workers {
		wdir := filepath.Join(s.dir, "workers", fmt.Sprintf("w%02d", i))
		if err := os.MkdirAll(wdir, 0o700); err != nil {
			return err
		}
		server := s.addrs[i%len(s.addrs)]
		w := &slot{
			name: fmt.Sprintf("worker-%02d", i), bin: c.workerBin,
			exited: func(msg string) { s.logf("%s", msg) },
			log:    filepath.Join(s.dir, "logs", fmt.Sprintf("worker-%02d.log", i)),
			args: func() []string {
				return []string{"-server", server, "-identity", filepath.Join(wdir, "identity.json"),
					"-provisioning-token-file", prov, "-node-id", fmt.Sprintf("soak-%02d", i),
					"-workdir", filepath.Join(wdir, "work"), "-max-jobs", fmt.Sprint(c.maxJobs), "-simulate-gpu",
					"-wait-seconds", "10"}
			},
		}
		if err := w.start(); err != nil {
			return err
		}
		s.workers = append(s.workers, w)
	}
	return nil
}

// request is one job the soak asked for, under its soak_seq: the job
// type, each attempt's outcome, and the job id of the 201 answer.
type request struct {
	jobType  string
	id       string   // "" without a 201 answer
	attempts []string // "201", "503 unavailable", "refused", "no answer: ..."
	mayQueue int      // the attempts that may have queued a job: the 201 and those not answered
}

// dispatch sends jobs at the configured rate until ctx ends, each to a
// random replica; the requests themselves run under reqCtx, so that the
// end of the soak cuts none short.
func (s *soak) dispatch(ctx, reqCtx context.Context) {
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / s.cfg.rate))
	defer tick.Stop()
	sem := make(chan struct{}, 32)
	seq := int64(0)
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // 32 in flight: the servers are down; skip this tick
		}
		seq++
		n, req := seq, s.nextJob(seq)
		wg.Go(func() {
			defer func() { <-sem }()
			s.dispatchOne(reqCtx, n, req)
		})
	}
}

// nextJob picks the next job: half status_check, a third
// embedding_dry_run, the rest a lora_train of 1 to 8 steps of 100 to
// 400 ms, so that kills find jobs running. Its payload carries
// soak_seq, which ties each job on the server to the request that
// queued it.
func (s *soak) nextJob(seq int64) wire.DispatchRequest {
	req := wire.DispatchRequest{MaxAttempts: 100}
	switch n := s.intn(6); {
	case n < 3:
		req.JobType = jobs.StatusCheck
		req.Payload = json.RawMessage(fmt.Sprintf(`{"soak_seq":%d}`, seq))
	case n < 5:
		req.JobType = jobs.EmbeddingDryRun
		req.Payload = json.RawMessage(fmt.Sprintf(`{"documents":%d,"soak_seq":%d}`, 1+s.intn(1000), seq))
	default:
		req.JobType = jobs.LoraTrain
		req.Payload = json.RawMessage(fmt.Sprintf(`{"steps":%d,"step_ms":%d,"soak_seq":%d}`, 1+s.intn(8), 100+s.intn(301), seq))
	}
	return req
}

// dispatchOne sends the job, up to four times over the replicas: again
// after a refused connection, or a 429 or 503 answer, which by
// docs/PROTOCOL.md accepted nothing; never after a request that got no
// answer, or a 503 that says its outcome is unknown, which may have
// queued the job.
func (s *soak) dispatchOne(ctx context.Context, seq int64, req wire.DispatchRequest) {
	r := &request{jobType: req.JobType}
	defer func() {
		s.mu.Lock()
		s.requests[seq] = r
		s.mu.Unlock()
	}()
	first := s.intn(len(s.ops))
	for attempt := range 4 {
		resp, err := s.ops[(first+attempt)%len(s.ops)].Dispatch(ctx, req)
		var (
			oe   *wire.Error
			nerr *net.OpError
		)
		switch {
		case err == nil:
			r.id = resp.Job.ID
			r.attempts = append(r.attempts, "201")
			r.mayQueue++
			return
		case errors.As(err, &oe) && oe.Status == http.StatusServiceUnavailable && outcomeUnknown(oe):
			// The server could not learn whether its commit landed: like
			// no answer, it may have queued the job, and is not tried again.
			r.attempts = append(r.attempts, "503 outcome unknown")
			r.mayQueue++
			return
		case errors.As(err, &oe):
			r.attempts = append(r.attempts, fmt.Sprintf("%d %s", oe.Status, oe.Code))
			if oe.Status != http.StatusTooManyRequests && oe.Status != http.StatusServiceUnavailable {
				return
			}
		case errors.As(err, &nerr) && nerr.Op == "dial":
			r.attempts = append(r.attempts, "refused")
		default:
			r.attempts = append(r.attempts, "no answer: "+err.Error())
			r.mayQueue++
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}

// snapshot copies the jobs dispatched with a 201 answer: id → type.
func (s *soak) snapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]string, len(s.requests))
	for _, r := range s.requests {
		if r.id != "" {
			m[r.id] = r.jobType
		}
	}
	return m
}

// recordCheckpoints reads the latest checkpoint every -checkpoint-every
// from a random replica, verifies its signature, and records it when it
// is new.
func (s *soak) recordCheckpoints(ctx context.Context) {
	t := time.NewTicker(s.cfg.checkpointEvery)
	defer t.Stop()
	for {
		s.readCheckpoint(ctx, s.ops[s.intn(len(s.ops))])
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readCheckpoint reads, verifies and records the latest checkpoint;
// a replica that does not answer is no problem, a bad signature is.
func (s *soak) readCheckpoint(ctx context.Context, op *operator.Client) *receipts.Checkpoint {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	note, err := op.Checkpoint(rctx)
	if err != nil {
		return nil
	}
	cp, err := receipts.OpenCheckpoint(note, s.tokens.ReceiptPublicKey, receipts.DefaultOrigin)
	if err != nil {
		s.problem("a checkpoint served does not verify: %v", err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.checkpoints); n == 0 || s.checkpoints[n-1].note != string(note) {
		s.checkpoints = append(s.checkpoints, seenCheckpoint{at: time.Now(), note: string(note), cp: cp})
	}
	return cp
}

// faults starts a loop per enabled fault until ctx ends.
func (s *soak) faults(ctx context.Context, wg *sync.WaitGroup) {
	c := s.cfg
	every := func(d time.Duration, f func()) {
		if d == 0 {
			return
		}
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(s.jitter(d)):
				}
				if ctx.Err() != nil {
					return
				}
				f()
			}
		})
	}
	every(c.serverKillEvery, func() {
		i := s.intn(len(s.servers))
		s.servers[i].signal(syscall.SIGKILL, "SIGKILLed by the soak")
		s.serverKills.Add(1)
		s.logf("SIGKILL %s", s.servers[i].name)
	})
	every(c.workerKillEvery, func() {
		i := s.intn(len(s.workers))
		s.workers[i].signal(syscall.SIGKILL, "SIGKILLed by the soak")
		s.workerKills.Add(1)
	})
	every(c.workerRestartEvery, func() { s.restartBusyWorker(ctx) })
	every(c.pgRestartEvery, func() {
		t := time.Now()
		if err := s.pg.restart(ctx); err != nil {
			if ctx.Err() == nil {
				s.problem("restarting PostgreSQL: %v", err)
			}
			return
		}
		s.pgRestarts.Add(1)
		s.logf("PostgreSQL restarted (-m immediate) in %v", time.Since(t).Round(time.Millisecond))
	})
	if s.features.clockSkew && c.replicas > 1 {
		every(c.skewEvery, func() { s.turnSkew(!s.skewed.Load()) })
	}
}

// restartBusyWorker SIGKILLs a worker that holds a job (looked up with
// the operator API, a few workers tried at random) and lets its slot
// start it again on the same identity, restartDelay later (well within
// 2 s): the restart reconciliation's case. Without a busy worker it
// kills a random one.
func (s *soak) restartBusyWorker(ctx context.Context) {
	op := s.ops[s.intn(len(s.ops))]
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	victim, job := -1, ""
	if list, err := op.ListWorkers(rctx, operator.WorkerQuery{Limit: 1000}); err == nil {
		ids := map[string]string{}
		for _, w := range list.Workers {
			ids[w.NodeID] = w.WorkerID
		}
		for range 4 {
			i := s.intn(len(s.workers))
			id := ids[fmt.Sprintf("soak-%02d", i)]
			if id == "" {
				continue
			}
			if d, err := op.Worker(rctx, id); err == nil && len(d.Leases) > 0 {
				victim, job = i, d.Leases[0].JobID
				break
			}
		}
	}
	if ctx.Err() != nil {
		return
	}
	if victim < 0 {
		s.busyMisses.Add(1)
		victim = s.intn(len(s.workers))
	}
	if s.workers[victim].signal(syscall.SIGKILL, "SIGKILLed by the soak to be restarted at once (holding job "+job+")") {
		s.workerRestarts.Add(1)
	}
}

// turnSkew restarts the last replica with its clock skewed, or not.
func (s *soak) turnSkew(on bool) {
	s.skewed.Store(on)
	sv := s.servers[len(s.servers)-1]
	if on {
		s.skewTurns.Add(1)
		sv.signal(syscall.SIGTERM, fmt.Sprintf("restarted with -clock-skew %v", s.cfg.skew))
		s.logf("%s: clock skewed by %v", sv.name, s.cfg.skew)
	} else {
		sv.signal(syscall.SIGTERM, "restarted without clock skew")
		s.logf("%s: clock back to the true time", sv.name)
	}
}

// outcomeUnknown reports whether a 503 says that the server could not
// learn whether its commit landed (docs/PROTOCOL.md §12: "the request may
// have been accepted"), rather than that nothing was accepted.
func outcomeUnknown(e *wire.Error) bool {
	return strings.Contains(e.Message, "may have been accepted")
}
