package workerapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/replay"
)

// EventMetrics is an optional extension of Metrics: when Config.Metrics
// also implements it, the Server tells it of leases, of the receipts the
// sequencer integrates and of the signed requests the replay checks
// refuse, where they happen. Each call is made once the change it
// counts committed (or, for a refusal, was answered), on the request's or
// the background work's goroutine: it must only count in memory, never
// block. A host whose Metrics lacks these methods keeps working as before.
type EventMetrics interface {
	// ObserveLeases counts n leases that reached outcome.
	ObserveLeases(outcome LeaseOutcome, n int)
	// ObserveSequenced counts n receipts integrated into the log by one
	// published batch; lag is how long the oldest of them waited, from
	// its minting to its batch's checkpoint.
	ObserveSequenced(n int, lag time.Duration)
	// ObserveNonceRejected counts a signed request refused by the
	// signature and replay checks; reason is the error code it was
	// answered with (PROTOCOL.md): replayed_nonce, stale_timestamp,
	// bad_signature, bad_digest, malformed_signature, missing_signature,
	// or rate_limited for a node over its nonce quota.
	ObserveNonceRejected(reason string)
}

// LeaseOutcome is what became of a lease, for EventMetrics.ObserveLeases.
type LeaseOutcome string

// The outcomes of a lease that EventMetrics counts.
const (
	// LeaseGranted means a lease request granted the lease.
	LeaseGranted LeaseOutcome = "granted"
	// LeaseExpired means the lease ran out (its TTL, accept deadline, cancel
	// grace or max runtime) or its worker went offline, and the job was
	// requeued or ended.
	LeaseExpired LeaseOutcome = "expired"
	// LeaseLost means a worker acted under a lease it no longer holds and was
	// answered 409 lease_lost.
	LeaseLost LeaseOutcome = "lost"
)

// statsTimeout bounds the store reads of one Stats call.
const statsTimeout = 5 * time.Second

// Stats counts the jobs in states queued, leased and running by state
// and type, and the workers by liveness, for a metrics collector that
// reads them when scraped (lease.Manager.Stats: two bounded statements on
// bunstore). It gives up after 5 seconds. It returns an error wrapping
// lease.ErrNoStats if the lease store counts nothing.
func (s *Server) Stats(ctx context.Context) (*lease.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	return s.leases.Stats(ctx)
}

// LongPolls returns how many long-polls wait on this Server now: lease
// and signals requests whose first look found nothing and that wait, with
// no transaction open, for a notification, a tick or the end of their
// wait. A long-poll is counted once it waits, subscribed to the Notifier
// already, so that a job dispatched (or a signal sent) after LongPolls
// counted it wakes it. Tests use it to know that a long-poll is parked
// before they dispatch; a host may report it as a gauge.
func (s *Server) LongPolls() int { return int(s.parked.Load()) }

// park counts a long-poll that starts waiting, until the function it
// returns is called.
func (s *Server) park() func() {
	s.parked.Add(1)
	return func() { s.parked.Add(-1) }
}

// turn waits, in arrival order, until fewer than Config.MaxActiveRequests
// requests run their database work, and returns the function that ends
// this one's turn (once; later calls do nothing). It fails only when ctx
// ends first.
func (s *Server) turn(ctx context.Context) (func(), error) {
	if s.turns == nil {
		return func() {}, nil
	}
	select {
	case s.turns <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	var once sync.Once
	return func() { once.Do(func() { <-s.turns }) }, nil
}

// verify verifies a request's credential: from what the credential
// store keeps in memory (credential.MemoryOnly) without a turn, else in
// a turn of its own.
func (s *Server) verify(ctx context.Context, token string, scope credential.Scope) (*credential.Principal, *credential.Credential, error) {
	p, cred, err := s.issuer.Verify(credential.MemoryOnly(ctx), token, scope)
	if !errors.Is(err, credential.ErrNotInMemory) {
		return p, cred, err
	}
	done, err := s.turn(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	return s.issuer.Verify(ctx, token, scope)
}

// events returns the Metrics' EventMetrics, or nil.
func (s *Server) events() EventMetrics {
	em, _ := s.cfg.Metrics.(EventMetrics)
	return em
}

// note runs f once the request's changes committed: lifecycle logs and
// event counts, never before the commit they describe.
func (c *call) note(f func()) { c.notes = append(c.notes, f) }

// callKey carries the request's call in its context, for the lease
// Manager's LeaseEnded hook (a sweep of Lease runs in a request).
type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// sequenced is receipts.Config.OnSequenced.
func (s *Server) sequenced(n int, oldest time.Time) {
	if em := s.events(); em != nil {
		em.ObserveSequenced(n, max(s.clockNow().Sub(oldest), 0))
	}
}

// replayErrors are the refusals of the signature and replay checks that
// EventMetrics.ObserveNonceRejected counts.
var replayErrors = []error{
	replay.ErrMissingSignature, replay.ErrMalformedSignature, replay.ErrBadDigest, replay.ErrBadSignature,
	replay.ErrStaleTimestamp, replay.ErrReplayedNonce, replay.ErrQuota,
}

// rejected counts err if it is a refusal of the replay checks.
func (s *Server) rejected(err error) {
	em := s.events()
	if em == nil || err == nil {
		return
	}
	for _, e := range replayErrors {
		if errors.Is(err, e) {
			em.ObserveNonceRejected(statusOf(err).code)
			return
		}
	}
}

// jobEvent names the change of a job from from to j's state, for its
// INFO log line: dispatched, leased, accepted, completed, failed,
// canceled, released or requeued (expired is logged by leaseEnded).
func jobEvent(from lease.State, j *lease.Job, pattern string) string {
	switch {
	case from == "":
		return "dispatched"
	case j.State == lease.StateLeased:
		return "leased"
	case j.State == lease.StateRunning:
		return "accepted"
	case j.State == lease.StateSucceeded:
		return "completed"
	case j.State == lease.StateFailed:
		return "failed"
	case j.State == lease.StateCanceled:
		return "canceled"
	case strings.HasSuffix(pattern, "/fail"):
		return "failed" // retryable: queued again
	case strings.HasSuffix(pattern, "/release"):
		return "released"
	}
	return "requeued"
}

// logJob logs a committed change of a job at INFO ("job leased", ...),
// with event, job_id, job_type, worker_id (of the lease, when it has one),
// attempt (the failed or expired one for those events), state, from, and
// reason (the error code) when the change failed or expired it.
func (s *Server) logJob(event string, from lease.State, j *lease.Job) {
	if !s.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := []any{"event", event, "job_id", j.ID, "job_type", j.Type}
	if j.Lease != nil {
		attrs = append(attrs, "worker_id", j.Lease.WorkerID)
	}
	// The attempt the event concerns: a failure's or expiry's own, not
	// the next one a requeue makes.
	attempt := j.Attempt
	if (event == "failed" || event == "expired") && j.LastError != nil {
		attempt = j.LastError.Attempt
	}
	attrs = append(attrs, "attempt", attempt, "state", string(j.State))
	if from != "" {
		attrs = append(attrs, "from", string(from))
	}
	if (event == "failed" || event == "expired") && j.LastError != nil {
		attrs = append(attrs, "reason", j.LastError.Code)
	}
	s.log.Info(fmt.Sprintf("job %s", event), attrs...)
}

// JobMetrics is an optional extension of Metrics: when Config.Metrics
// also implements it, the Server tells it of every committed change of a
// job's state (dispatch, lease, accept, completion, failure, cancel,
// expiry, requeue), once the change committed, on the request's or the
// background work's goroutine: like EventMetrics it must only count in
// memory, never block. workerapi/prommetrics derives from it the
// dispatch-to-lease latency, the jobs finished by type and outcome, their
// runtime and the micro-USD charged.
type JobMetrics interface {
	ObserveJob(JobChange)
}

// JobChange is a committed change of a job's state, for
// JobMetrics.ObserveJob.
type JobChange struct {
	// From is the state before the change ("" for a dispatch). A lease
	// granted and accepted in one request (accept: true) is told as two
	// changes, queued to leased then leased to running, as its hooks are.
	From lease.State
	// Job is the job after the change.
	Job lease.Job
	// ChargedMicroUSD is what a completion (running to succeeded)
	// charged: the cost of its job_charged receipt. 0 for any other
	// change.
	ChargedMicroUSD int64
}

// observeJob tells the Config.Metrics' JobMetrics, if it has one, of a
// committed change of j from state from. Callers call it once the change
// committed (a note, or after a transaction of their own).
func (s *Server) observeJob(from lease.State, j *lease.Job) {
	jm, ok := s.cfg.Metrics.(JobMetrics)
	if !ok || j.State == from {
		return
	}
	ch := JobChange{From: from, Job: *j}
	if from == lease.StateRunning && j.State == lease.StateSucceeded {
		if c, err := jobCharge(j); err == nil {
			ch.ChargedMicroUSD = c.CostMicros
		}
	}
	jm.ObserveJob(ch)
}

// Bounds of one Gauges call, so that a scrape costs a fixed number of
// reads whatever the size of the queue and the fleet.
const (
	// GaugesMaxTypes is how many job types Gauges reads the oldest
	// queued job of (one single-row read each), in type order.
	GaugesMaxTypes = 64
	// GaugesMaxJobs is how many queued jobs Gauges judges for
	// Gauges.Unleasable, the first in id order (one read).
	GaugesMaxJobs = 500
	// GaugesMaxKinds is how many kinds of queued job (a type and its
	// requirements) Gauges explains, one lease.Manager.Explain each; the
	// jobs of the other kinds are left out of Gauges.Unleasable.
	GaugesMaxKinds = 16
	// GaugesMaxWorkers is how many registered workers Gauges examines,
	// the first in id order (one read, and one read of each one's
	// principal for its ban, which bunstore answers from memory once
	// read).
	GaugesMaxWorkers = 500
)

// Gauges are what a metrics collector reads when scraped, beyond Stats:
// the age of the queue, the jobs nothing can lease, the envelope, and
// the fleet by approval, ban and liveness. Each is read within the
// bounds above (GaugesMaxTypes, GaugesMaxJobs, GaugesMaxKinds,
// GaugesMaxWorkers); a Truncated field says that a bound cut a reading
// short.
type Gauges struct {
	// At is when the gauges were read (the Server's clock).
	At time.Time
	// Stats are the counts Stats reads, read once for both.
	Stats *lease.Stats
	// OldestQueued is, by job type, when the first queued job of that
	// type in id order (the oldest dispatched) was dispatched: its
	// CreatedAt. Types with no queued job are missing; at most
	// GaugesMaxTypes types, those first in type order among those
	// Stats counted queued.
	OldestQueued map[string]time.Time
	// Unleasable counts the queued jobs that no registered worker could
	// lease now, by the code of the first reason (lease.Explain's, or
	// lease.ReasonTypeNotAllowed for a type the envelope blocks), among
	// the first GaugesMaxJobs queued jobs in id order. Jobs of one type
	// with the same requirements, due or not both, share one verdict,
	// their first's.
	Unleasable map[lease.ReasonCode]int
	// UnleasableTruncated reports that more jobs were queued than
	// GaugesMaxJobs, or of more kinds than GaugesMaxKinds: Unleasable is
	// then a lower bound.
	UnleasableTruncated bool
	// EnvelopeActive reports that the envelope's runtime is active.
	EnvelopeActive bool
	// Workers count the registered workers examined (the first
	// GaugesMaxWorkers in id order) by approval, ban and liveness.
	Workers []WorkerCount
	// WorkersTruncated reports that more workers are registered than
	// GaugesMaxWorkers.
	WorkersTruncated bool
	// JobTypes are the job types the workers examined registered,
	// sorted, each once.
	JobTypes []string
}

// WorkerCount is how many workers share one approval, ban and liveness.
type WorkerCount struct {
	Pending  bool
	Banned   bool
	Liveness lease.Liveness
	N        int
}

// Gauges reads the Gauges, Stats included, within the bounds
// GaugesMaxTypes, GaugesMaxJobs, GaugesMaxKinds and GaugesMaxWorkers,
// for a metrics collector that reads them when scraped. It writes
// nothing, and gives up after 5 seconds (as Stats). Its error wraps
// lease.ErrNoStats if the lease store counts nothing.
func (s *Server) Gauges(ctx context.Context) (*Gauges, error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	g := &Gauges{At: s.now(), OldestQueued: map[string]time.Time{}, Unleasable: map[lease.ReasonCode]int{}}

	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("workerapi: gauges: %w", err)
	}
	g.EnvelopeActive = snap.Active()

	st, err := s.leases.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("workerapi: gauges: %w", err)
	}
	g.Stats = st
	var types []string
	for _, jc := range st.Jobs {
		if jc.State == lease.StateQueued && jc.N > 0 {
			types = append(types, jc.Type)
		}
	}
	slices.Sort(types)
	for _, t := range types[:min(len(types), GaugesMaxTypes)] {
		js, _, err := s.leases.List(ctx, lease.JobFilter{State: lease.StateQueued, Type: t, Limit: 1})
		if err != nil {
			return nil, fmt.Errorf("workerapi: gauges: %w", err)
		}
		if len(js) == 1 {
			g.OldestQueued[t] = js[0].CreatedAt
		}
	}

	if err := s.unleasable(ctx, g); err != nil {
		return nil, fmt.Errorf("workerapi: gauges: %w", err)
	}

	ws, err := s.leases.Workers(ctx, lease.WorkerFilter{Limit: GaugesMaxWorkers + 1})
	if err != nil {
		return nil, fmt.Errorf("workerapi: gauges: %w", err)
	}
	if len(ws) > GaugesMaxWorkers {
		ws, g.WorkersTruncated = ws[:GaugesMaxWorkers], true
	}
	counts := map[WorkerCount]int{}
	seen := map[string]bool{}
	for _, w := range ws {
		banned, err := s.banned(ctx, w.ID)
		if err != nil {
			return nil, fmt.Errorf("workerapi: gauges: %w", err)
		}
		counts[WorkerCount{Pending: w.Approval.Pending, Banned: banned, Liveness: s.leases.Liveness(w)}]++
		for _, t := range w.Capabilities.JobTypes {
			if !seen[t] {
				seen[t] = true
				g.JobTypes = append(g.JobTypes, t)
			}
		}
	}
	for k, n := range counts {
		k.N = n
		g.Workers = append(g.Workers, k)
	}
	slices.Sort(g.JobTypes)
	return g, nil
}

// unleasable fills g.Unleasable from the first GaugesMaxJobs queued jobs,
// one verdict (leasability) for each kind of job.
func (s *Server) unleasable(ctx context.Context, g *Gauges) error {
	js, _, err := s.leases.List(ctx, lease.JobFilter{State: lease.StateQueued, Limit: GaugesMaxJobs + 1})
	if err != nil {
		return err
	}
	if len(js) > GaugesMaxJobs {
		js, g.UnleasableTruncated = js[:GaugesMaxJobs], true
	}
	type verdict struct {
		leasable bool
		code     lease.ReasonCode
	}
	verdicts := map[string]verdict{}
	for _, j := range js {
		// A job waiting for its scheduled time (a retry's backoff) is
		// judged apart from the due jobs of its kind.
		kind := fmt.Sprintf("%q %#v %t", j.Type, j.Requirements, j.ScheduledAt.After(g.At))
		v, ok := verdicts[kind]
		if !ok {
			if len(verdicts) == GaugesMaxKinds {
				g.UnleasableTruncated = true
				continue
			}
			leasable, why, err := s.leasability(ctx, j)
			if err != nil {
				return err
			}
			v = verdict{leasable: leasable, code: why.Code}
			verdicts[kind] = v
		}
		if !v.leasable && v.code != "" {
			g.Unleasable[v.code]++
		}
	}
	return nil
}
