package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// node is one simulated worker node: its own key, token and client.
type node struct {
	nodeID   string
	workerID string
	c        *client.Client
}

// enroll registers the nodes and says how long it took, then reads the
// PostgreSQL counters (with -pg) that the report counts from.
func enroll(ctx context.Context, cfg *config, hc *http.Client, log *slog.Logger, stats *routeStats, pg *pgProbe, out io.Writer) ([]*node, pgCounters, error) {
	start := time.Now()
	nodes, err := registerNodes(ctx, cfg, hc, log, stats)
	if err != nil {
		return nil, pgCounters{}, err
	}
	fmt.Fprintf(out, "registered %d nodes in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))
	var before pgCounters
	if pg != nil {
		if before, err = pg.read(ctx); err != nil {
			return nil, pgCounters{}, err
		}
	}
	return nodes, before, nil
}

// registerNodes registers cfg.nodes nodes, cfg.registerN at a time, each
// with a new Ed25519 key, under node ids unique to this run. Each call is
// recorded in stats; the first failure stops the others and is returned.
func registerNodes(ctx context.Context, cfg *config, hc *http.Client, log *slog.Logger, stats *routeStats) ([]*node, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	prefix := "loadgen-" + hex.EncodeToString(b[:])
	nodes := make([]*node, cfg.nodes)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, cfg.registerN)
	var wg sync.WaitGroup
	for i := range nodes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			n, err := registerNode(ctx, cfg, hc, log, stats, fmt.Sprintf("%s-%05d", prefix, i))
			if err != nil {
				cancel(err)
				return
			}
			nodes[i] = n
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("registering the nodes: %w", err)
	}
	return nodes, nil
}

// registerNode registers one node that runs cfg.jobType on one GPU.
func registerNode(ctx context.Context, cfg *config, hc *http.Client, log *slog.Logger, stats *routeStats, nodeID string) (*node, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg.server, &client.Config{Identity: id, HTTPClient: hc, Logger: log.With("node", nodeID), UserAgent: "nodelane-loadgen/1"})
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	req := wire.RegisterRequest{
		NodeID: nodeID, Name: nodeID, Hostname: host, Role: "loadgen",
		Capabilities:             wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{cfg.jobType}},
		GovernorLimits:           wire.GovernorLimits{MaxJobs: cfg.maxJobs, MaxVRAMMB: 24576},
		Tags:                     []string{"loadgen"},
		Version:                  "nodelane-loadgen/1",
		HeartbeatIntervalSeconds: max(1, int(cfg.interval/time.Second)),
	}
	start := time.Now()
	resp, err := c.Register(ctx, cfg.tokens.provisioning, req)
	if ctx.Err() != nil {
		return nil, context.Cause(ctx) // another node failed first, or the run was stopped
	}
	stats.add(rowRegister, time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", nodeID, err)
	}
	if resp.Status == wire.RegisterStatusPending {
		return nil, fmt.Errorf("node %s registered pending: the server approves nodes (-approve-nodes), and an unapproved node leases nothing", nodeID)
	}
	return &node{nodeID: nodeID, workerID: resp.WorkerID, c: c}, nil
}

// jobRecord is what the run saw of one job.
type jobRecord struct {
	// dispatchedAt is when its dispatch answer arrived; zero for a job
	// loadgen did not dispatch (or not yet).
	dispatchedAt time.Time
	// leasedAt is when each lease answer that carried it arrived.
	leasedAt []time.Time
	// completes counts the complete calls that succeeded.
	completes int
	// answer is the first complete answer; workerID and leaseID are of
	// the node and lease that got it.
	answer            *wire.CompleteResponse
	workerID, leaseID string
	// err is the first accept or complete call that failed.
	err error
}

// settled reports whether a job loadgen dispatched needs nothing more:
// it was completed, or a call on it failed.
func (r *jobRecord) settled() bool {
	return !r.dispatchedAt.IsZero() && (r.completes > 0 || r.err != nil)
}

// load is one run-mode run.
type load struct {
	cfg   *config
	log   *slog.Logger
	stats *routeStats
	// workerHTTP counts the nodes' requests, opHTTP the operator's.
	workerHTTP, opHTTP *countingTransport
	hc                 *http.Client
	op                 *operator.Client

	mu           sync.Mutex
	jobs         map[string]*jobRecord
	ours         []string // the jobs dispatched, in the order answered
	dispatchErrs int
	dispatchDone bool
	nSettled     int
	first, last  time.Time // the first dispatch sent, the last completion answered
	finished     chan struct{}
	closed       bool
	// leftLeased counts the grants of the batched flow that the lease
	// did not accept.
	leftLeased atomic.Int64
}

// newLoad prepares a run: its HTTP clients and records.
func newLoad(cfg *config, log *slog.Logger) (*load, error) {
	l := &load{cfg: cfg, log: log, stats: newRouteStats(), workerHTTP: &countingTransport{}, opHTTP: &countingTransport{},
		jobs: map[string]*jobRecord{}, finished: make(chan struct{})}
	// Every node may have a long-poll and max-jobs accepts or completes
	// in flight.
	l.hc = httpClient(cfg, cfg.nodes*(cfg.perNode+2)+cfg.registerN, l.workerHTTP)
	opc := httpClient(cfg, cfg.dispatch+8, l.opHTTP)
	opc.Timeout = 2 * time.Minute
	op, err := operator.New(cfg.server, cfg.tokens.operator, &operator.Config{HTTPClient: opc, UserAgent: "nodelane-loadgen/1"})
	if err != nil {
		return nil, err
	}
	l.op = op
	return l, nil
}

// update applies f to the record of job id under the lock, counting the
// job settled when f settles it, and ends the run when every dispatched
// job is settled.
func (l *load) update(id string, f func(r *jobRecord)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.jobs[id]
	if r == nil {
		r = &jobRecord{}
		l.jobs[id] = r
	}
	was := r.settled()
	f(r)
	if !was && r.settled() {
		l.nSettled++
	}
	l.maybeFinishLocked()
}

// maybeFinishLocked closes finished once dispatching has ended and every
// job dispatched is settled.
func (l *load) maybeFinishLocked() {
	if !l.closed && l.dispatchDone && l.nSettled == len(l.ours) {
		l.closed = true
		close(l.finished)
	}
}

// run registers the nodes, dispatches and runs the jobs, writes the
// report and the checks to out, and returns errChecksFailed if a check
// failed.
func (l *load) run(ctx context.Context, out io.Writer) error {
	cfg := l.cfg
	fmt.Fprintf(out, "loadgen run: flow %s, %d nodes, %d jobs of %s, max_jobs %d, %d jobs at once per node, wait_seconds %d, %d dispatchers, server %s\n",
		cfg.flow, cfg.nodes, cfg.jobs, cfg.jobType, cfg.maxJobs, cfg.perNode, cfg.wait, cfg.dispatch, cfg.server)
	if cfg.batch > 1 {
		fmt.Fprintf(out, "dispatch: %d jobs a request (POST /operator/jobs/batch)\n", cfg.batch)
	}
	if cfg.rate > 0 {
		fmt.Fprintf(out, "dispatch: %d jobs a second\n", cfg.rate)
	}
	pg, err := openPG(ctx, cfg.pgDSN, cfg.pgSettle)
	if err != nil {
		return err
	}
	defer pg.close()

	nodes, pgBefore, err := enroll(ctx, cfg, l.hc, l.log, l.stats, pg, out)
	if err != nil {
		return err
	}
	mem := startMemSampler(cfg.serverPIDs, 500*time.Millisecond)
	reqBefore := l.workerHTTP.requests.Load()
	cpuBefore := markCPU(cfg.serverPIDs)
	if pg != nil {
		pg.cpu.start(ctx)
	}

	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	var workers sync.WaitGroup
	for _, n := range nodes {
		workers.Go(func() { l.work(runCtx, n) })
	}
	l.dispatchAll(runCtx)
	select {
	case <-l.finished:
	case <-runCtx.Done():
	}
	stopped := context.Cause(runCtx)
	cancel()
	workers.Wait()
	cpuAfter := markCPU(cfg.serverPIDs)
	pgCPU, pgBackends, pgCPUErr := time.Duration(0), 0, errNoPG
	if pg != nil {
		pgCPU, pgBackends, pgCPUErr = pg.cpu.finish(ctx)
	}
	memLine := mem.finish()
	var pgAfter pgCounters
	if pg != nil {
		if pgAfter, err = pg.read(ctx); err != nil {
			return err
		}
	}

	l.mu.Lock()
	dispatched, completed, failed, foreign := len(l.ours), 0, 0, 0
	for _, r := range l.jobs {
		switch {
		case r.dispatchedAt.IsZero():
			foreign++
		case r.completes > 0:
			completed++
			if len(r.leasedAt) > 0 {
				l.stats.add(rowDispatchLease, max(r.leasedAt[0].Sub(r.dispatchedAt), 0), nil)
			}
		case r.err != nil:
			failed++
		}
	}
	elapsed := l.last.Sub(l.first)
	dispatchErrs := l.dispatchErrs
	l.mu.Unlock()

	fmt.Fprintf(out, "jobs: %d dispatched (%d dispatch errors), %d completed, %d failed", dispatched, dispatchErrs, completed, failed)
	if completed > 0 && elapsed > 0 {
		fmt.Fprintf(out, ", in %s from the first dispatch to the last completion: %.1f jobs/s\n",
			elapsed.Round(time.Millisecond), float64(completed)/elapsed.Seconds())
	} else {
		fmt.Fprintln(out)
	}
	if foreign > 0 {
		fmt.Fprintf(out, "jobs not dispatched by this run that its nodes leased: %d\n", foreign)
	}
	if stopped != nil {
		fmt.Fprintf(out, "the run stopped before every job was settled: %v\n", stopped)
	}
	l.stats.print(out)
	reqs := l.workerHTTP.requests.Load() - reqBefore
	fmt.Fprintf(out, "worker HTTP: %s", l.workerHTTP)
	if completed > 0 {
		fmt.Fprintf(out, "; %.2f requests per job after registration", float64(reqs)/float64(completed))
	}
	fmt.Fprintf(out, "\noperator HTTP: %s\n", l.opHTTP)
	if cfg.flow == flowBatched {
		fmt.Fprintf(out, "grants the lease left leased, accepted one by one: %d\n", l.leftLeased.Load())
	}
	fmt.Fprintln(out, cpuLine(cfg.serverPIDs, cpuBefore, cpuAfter, pgCPU, pgBackends, pgCPUErr, completed, "job"))
	fmt.Fprintln(out, memLine)
	if pg != nil {
		fmt.Fprintln(out, pgLine(pgBefore, pgAfter, completed, "job"))
	}

	cctx, ccancel := context.WithTimeout(ctx, 10*time.Minute)
	defer ccancel()
	ok := report(out, "exactly once", l.exactlyOnce(cctx))
	if cfg.checkRcpts {
		ok = report(out, "receipts", l.verifyReceipts(cctx)) && ok
	} else {
		fmt.Fprintln(out, "check receipts: skipped (-check-receipts=false)")
	}
	if stopped != nil || dispatchErrs > 0 {
		ok = false
	}
	if !ok {
		return errChecksFailed
	}
	return nil
}

// dispatchAll dispatches cfg.jobs jobs, cfg.batch a request, cfg.dispatch
// requests at a time.
func (l *load) dispatchAll(ctx context.Context) {
	l.mu.Lock()
	l.first = time.Now()
	l.mu.Unlock()
	next := make(chan []wire.DispatchRequest)
	go func() {
		defer close(next)
		// With a rate, the requests that carry job i go out at i/rate
		// seconds from the start.
		var pace *time.Timer
		if l.cfg.rate > 0 {
			pace = time.NewTimer(0)
			defer pace.Stop()
		}
		start := time.Now()
		for i := 0; i < l.cfg.jobs; i += l.cfg.batch {
			if pace != nil {
				pace.Reset(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(l.cfg.rate))))
				select {
				case <-pace.C:
				case <-ctx.Done():
					return
				}
			}
			var reqs []wire.DispatchRequest
			for k := i; k < min(i+l.cfg.batch, l.cfg.jobs); k++ {
				payload, _ := json.Marshal(map[string]any{"loadgen": k})
				reqs = append(reqs, wire.DispatchRequest{JobType: l.cfg.jobType, Payload: payload})
			}
			select {
			case next <- reqs:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range l.cfg.dispatch {
		wg.Go(func() {
			for reqs := range next {
				start := time.Now()
				resps, err := l.dispatch(ctx, reqs)
				at := time.Now()
				if err != nil && ctx.Err() != nil {
					return
				}
				l.stats.add(rowDispatch, at.Sub(start), err)
				if err != nil {
					l.mu.Lock()
					l.dispatchErrs += len(reqs)
					l.mu.Unlock()
					continue
				}
				for _, resp := range resps {
					l.update(resp.Job.ID, func(r *jobRecord) {
						r.dispatchedAt = at
						l.ours = append(l.ours, resp.Job.ID)
					})
				}
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	l.dispatchDone = true
	l.maybeFinishLocked()
	l.mu.Unlock()
}

// dispatch queues the jobs of reqs: one through POST /operator/jobs,
// more through POST /operator/jobs/batch. A 429 or 503 answer, which
// queued nothing, is tried again, up to four times in all: the operator
// client never retries by itself.
func (l *load) dispatch(ctx context.Context, reqs []wire.DispatchRequest) ([]wire.DispatchResponse, error) {
	for attempt := 1; ; attempt++ {
		var out []wire.DispatchResponse
		var err error
		if len(reqs) == 1 {
			var r *wire.DispatchResponse
			if r, err = l.op.Dispatch(ctx, reqs[0]); err == nil {
				out = []wire.DispatchResponse{*r}
			}
		} else {
			var r *wire.DispatchBatchResponse
			if r, err = l.op.DispatchBatch(ctx, wire.DispatchBatchRequest{Jobs: reqs}); err == nil {
				out = r.Jobs
			}
		}
		var we *wire.Error
		if !errors.As(err, &we) || (we.Status != http.StatusTooManyRequests && we.Status != http.StatusServiceUnavailable) || attempt == 4 {
			return out, err
		}
		select {
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// work is one node: it heartbeats every cfg.interval and leases jobs
// until ctx ends, accepting and completing the jobs of each lease answer,
// cfg.perNode at a time, before it leases again.
func (l *load) work(ctx context.Context, n *node) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for {
			start := time.Now()
			_, err := n.c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "busy"})
			if ctx.Err() != nil {
				return
			}
			l.stats.add(rowHeartbeat, time.Since(start), err)
			if !sleep(ctx, l.cfg.interval) {
				return
			}
		}
	})
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := n.c.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{l.cfg.jobType}, MaxJobs: l.cfg.maxJobs, WaitSeconds: l.cfg.wait,
			Accept: l.cfg.flow == flowBatched})
		at := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			l.stats.add(rowLease, at.Sub(start), err)
			sleep(ctx, time.Second) // a server in trouble: do not hammer it
			continue
		case len(resp.Leases) == 0:
			l.stats.add(rowLeaseEmpty, at.Sub(start), nil)
			continue
		}
		l.stats.add(rowLease, at.Sub(start), nil)
		if l.cfg.flow == flowBatched {
			for _, g := range resp.Leases {
				l.update(g.Job.ID, func(r *jobRecord) { r.leasedAt = append(r.leasedAt, at) })
			}
			l.finishBatch(ctx, n, resp.Leases)
			continue
		}
		var jobs sync.WaitGroup
		sem := make(chan struct{}, l.cfg.perNode)
		for _, g := range resp.Leases {
			l.update(g.Job.ID, func(r *jobRecord) { r.leasedAt = append(r.leasedAt, at) })
			sem <- struct{}{}
			jobs.Go(func() {
				defer func() { <-sem }()
				l.finish(ctx, n, g)
			})
		}
		jobs.Wait()
	}
}

// finish accepts and completes one leased job.
func (l *load) finish(ctx context.Context, n *node, g wire.Grant) {
	id := g.Job.ID
	fail := func(err error) {
		l.update(id, func(r *jobRecord) {
			if r.err == nil {
				r.err = err
			}
		})
	}
	start := time.Now()
	_, err := n.c.Accept(ctx, id, wire.TokenRequest{LeaseToken: g.LeaseToken})
	l.stats.add(rowAccept, time.Since(start), err)
	if err != nil {
		fail(fmt.Errorf("accept by %s: %w", n.workerID, err))
		return
	}
	start = time.Now()
	resp, err := n.c.Complete(ctx, id, wire.CompleteRequest{LeaseToken: g.LeaseToken, Metrics: json.RawMessage(`{"loadgen":1}`), WaitForProofs: l.cfg.waitProofs})
	at := time.Now()
	l.stats.add(rowComplete, at.Sub(start), err)
	if err != nil {
		fail(fmt.Errorf("complete by %s: %w", n.workerID, err))
		return
	}
	l.update(id, func(r *jobRecord) {
		r.completes++
		if r.answer == nil {
			r.answer, r.workerID, r.leaseID = resp, n.workerID, g.LeaseID
		}
	})
	l.mu.Lock()
	if at.After(l.last) {
		l.last = at
	}
	l.mu.Unlock()
}

// finishBatch completes the jobs of one lease answer of the batched
// flow: it accepts, one by one, the grants the lease left leased (none,
// unless the server is older than accept: true or its envelope refused
// the accept), then completes the jobs accepted with POST
// /workers/jobs/complete, wire.MaxBatchComplete at a time.
func (l *load) finishBatch(ctx context.Context, n *node, grants []wire.Grant) {
	fail := func(id string, err error) {
		l.update(id, func(r *jobRecord) {
			if r.err == nil {
				r.err = err
			}
		})
	}
	running := make([]wire.Grant, 0, len(grants))
	for _, g := range grants {
		if g.Job.State == wire.JobStateLeased {
			l.leftLeased.Add(1)
			start := time.Now()
			_, err := n.c.Accept(ctx, g.Job.ID, wire.TokenRequest{LeaseToken: g.LeaseToken})
			l.stats.add(rowAccept, time.Since(start), err)
			if err != nil {
				fail(g.Job.ID, fmt.Errorf("accept by %s: %w", n.workerID, err))
				continue
			}
		}
		running = append(running, g)
	}
	for chunk := range slices.Chunk(running, wire.MaxBatchComplete) {
		req := wire.CompleteBatchRequest{Completions: make([]wire.Completion, len(chunk))}
		for i, g := range chunk {
			req.Completions[i] = wire.Completion{JobID: g.Job.ID,
				CompleteRequest: wire.CompleteRequest{LeaseToken: g.LeaseToken, Metrics: json.RawMessage(`{"loadgen":1}`), WaitForProofs: l.cfg.waitProofs}}
		}
		start := time.Now()
		resp, err := n.c.CompleteBatch(ctx, req)
		at := time.Now()
		l.stats.add(rowCompleteBatch, at.Sub(start), err)
		if err != nil {
			for _, g := range chunk {
				fail(g.Job.ID, fmt.Errorf("batch complete by %s: %w", n.workerID, err))
			}
			continue
		}
		for i, res := range resp.Results {
			g := chunk[i]
			if err := client.CompletionError(&res); err != nil {
				fail(g.Job.ID, fmt.Errorf("batch complete by %s: %w", n.workerID, err))
				continue
			}
			// A batch answers no job: this is the answer complete of the
			// job alone would have given but for its job, which the
			// exactly-once check reads back from the server.
			c := res.Completed
			answer := &wire.CompleteResponse{Job: wire.Job{ID: g.Job.ID, State: stateSucceeded},
				ActualMS: c.ActualMS, ActualHours: c.ActualHours, ActualCostUSD: c.ActualCostUSD,
				ReceiptID: c.ReceiptID, Receipts: c.Receipts, Proofs: c.Proofs, Checkpoint: c.Checkpoint}
			l.update(g.Job.ID, func(r *jobRecord) {
				r.completes++
				if r.answer == nil {
					r.answer, r.workerID, r.leaseID = answer, n.workerID, g.LeaseID
				}
			})
		}
		l.mu.Lock()
		if at.After(l.last) {
			l.last = at
		}
		l.mu.Unlock()
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// maxShown bounds the problems a check prints.
const maxShown = 10

// report prints a check's result and reports whether it passed.
func report(out io.Writer, name string, res checkResult) bool {
	if len(res.problems) == 0 {
		fmt.Fprintf(out, "check %s: ok: %s\n", name, res.summary)
		return true
	}
	fmt.Fprintf(out, "check %s: FAILED: %d problems (%s)\n", name, len(res.problems), res.summary)
	for i, p := range res.problems {
		if i == maxShown {
			fmt.Fprintf(out, "  ... and %d more\n", len(res.problems)-maxShown)
			break
		}
		fmt.Fprintf(out, "  - %s\n", p)
	}
	return false
}

// checkResult is a check's outcome: what it covered, and what failed.
type checkResult struct {
	summary  string
	problems []string
}

// errNotLeased is why a dispatched job was never settled.
var errNotLeased = errors.New("no lease answer carried it")
