package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Limits of the worker routes.
const (
	// A long-poll looks again without a notification only when something
	// no notification announces may have made a job leasable: a job that
	// was not due becomes due (the first attempt's explanation says when,
	// for the jobs it examined), a worker at its live-lease limit frees a
	// slot, or a job a notification announced was not due yet (a retry's
	// backoff). Then it looks first pollTick after its last look, and
	// twice as long each time, up to maxPollTick, so that a thousand
	// long-polls do not cost a thousand claim transactions a second (on
	// SQLite, each takes the one writer). An idle long-poll that nothing
	// wakes looks no more than once, at its start.
	pollTick    = time.Second
	maxPollTick = 5 * time.Second
)

// leaseBody is LeaseRequest with presence: max_jobs 0 is refused, while
// an absent max_jobs means 1.
type leaseBody struct {
	SupportedJobTypes []string `json:"supported_job_types"`
	SupportedGPUSKUs  []string `json:"supported_gpu_skus"`
	MaxJobs           *int     `json:"max_jobs"`
	WaitSeconds       *int     `json:"wait_seconds"`
	Accept            bool     `json:"accept"`
	RequestID         string   `json:"request_id"`
}

// lease: POST /workers/jobs/lease. The first attempt runs in the
// request's transaction. If it grants nothing and the worker asked to
// wait, the wait runs after the commit and holds no transaction: each
// notification (or a tick, or the deadline) makes one more attempt in a
// transaction of its own. With accept, each attempt claims straight into
// running (leaseOnce).
func (s *Server) lease(ctx context.Context, c *call) (int, any, error) {
	var req leaseBody
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	n, wait := 1, 0
	if req.MaxJobs != nil {
		if n = *req.MaxJobs; n < 1 || n > wire.MaxJobsPerLease {
			return 0, nil, invalid("max_jobs must be 1 to %d", wire.MaxJobsPerLease)
		}
	}
	if req.WaitSeconds != nil {
		if wait = *req.WaitSeconds; wait < 0 || wait > wire.MaxWaitSeconds {
			return 0, nil, invalid("wait_seconds must be 0 to %d", wire.MaxWaitSeconds)
		}
	}
	k, err := keyFor(c, "lease", "", req.RequestID, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	lr := lease.LeaseRequest{
		WorkerID: c.principal.ID,
		JobTypes: req.SupportedJobTypes,
		GPUSKUs:  req.SupportedGPUSKUs,
		MaxJobs:  n,
	}
	d := min(time.Duration(wait)*time.Second, s.cfg.MaxWait)
	var (
		w     *waiter
		sig   <-chan struct{}
		class string
	)
	if d > 0 {
		// Join before the first attempt, so that a job dispatched while
		// it runs still wakes the wait (relay), each attempt naming the
		// class of its claim. A ban or a retirement of the worker wakes
		// it too (its signals), and the next attempt refuses it
		// (checkGranted): with a Notifier that is not a SignalNotifier,
		// the ban's Notify wakes it through the relay.
		if err := s.longPoll(c); err != nil {
			return 0, nil, err
		}
		lr.Planned = func(q lease.ClaimQuery) { class = classKey(q) }
		w = s.relay.join()
		c.cleanup(func() { s.relay.leave(w) })
		if sn, ok := s.st.Notifier.(SignalNotifier); ok {
			var cancel func()
			sig, cancel = sn.SubscribeWorker(lr.WorkerID)
			c.cleanup(cancel)
		}
	}
	// The first attempt says why it granted nothing: the answer of a
	// long-poll that nothing woke, and when it must look again unasked.
	out, why, err := s.leaseOnce(ctx, c, lr, req.Accept, true)
	if err != nil {
		return 0, nil, err
	}
	if w != nil {
		s.relay.done(w, class, len(out.Leases), true, why != nil && why.look)
	}
	if err := s.rememberLease(ctx, c, k, out); err != nil {
		return 0, nil, err
	}
	if len(out.Leases) > 0 || d <= 0 {
		return http.StatusOK, out, nil
	}
	deadline := time.Now().Add(d)
	c.then = func(ctx context.Context) (int, any, error) {
		defer s.park()()
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		look := newLooks(why)
		defer look.stop()
		for {
			select {
			case <-ctx.Done():
				return 0, nil, context.Cause(ctx)
			case <-timer.C:
				if why == nil {
					// An attempt ran since the first: say why as of now.
					done, err := s.turn(ctx)
					if err != nil {
						return 0, nil, err
					}
					defer done()
					snap, err := s.gate.Snapshot(ctx)
					if err != nil {
						return 0, nil, err
					}
					if why, err = s.whyNoJob(ctx, snap, lr); err != nil {
						return 0, nil, err
					}
				}
				out.Message = why.message
				return http.StatusOK, out, nil
			case <-w.c:
			case <-sig:
			case <-look.c:
			}
			var next *wire.LeaseResponse
			class = ""
			queued, noted, granted := len(c.hooks), len(c.notes), len(c.jobIDs)
			done, err := s.turn(ctx)
			if err != nil {
				return 0, nil, err
			}
			err = s.sharedTx(ctx, c, func(ctx context.Context) error {
				var err error
				if next, _, err = s.leaseOnce(ctx, c, lr, req.Accept, false); err != nil {
					return err
				}
				return s.rememberLease(ctx, c, k, next)
			})
			done()
			if err != nil {
				// They did not commit.
				c.hooks, c.notes, c.jobIDs = c.hooks[:queued], c.notes[:noted], c.jobIDs[:granted]
				return 0, nil, err
			}
			out = next
			s.relay.done(w, class, len(out.Leases), false, false)
			if len(out.Leases) > 0 {
				return http.StatusOK, out, nil
			}
			why = nil
			look.tick()
		}
	}
	return http.StatusOK, out, nil
}

// looks times the looks of a waiting long-poll that no notification
// asks for (see pollTick): none while its first attempt's explanation
// holds, but at the time it named a job due; ticks once an attempt
// found nothing, or from the start when the explanation says something
// may change unannounced.
type looks struct {
	t     *time.Timer
	c     <-chan time.Time // nil: no look due
	every time.Duration
}

func newLooks(why *noJob) *looks {
	l := &looks{}
	switch {
	case why.look:
		l.tick()
	case !why.next.IsZero():
		l.t = time.NewTimer(max(time.Until(why.next), 0))
		l.c = l.t.C
	}
	return l
}

// tick arms the next look, pollTick after the first and twice as long
// each time after, up to maxPollTick.
func (l *looks) tick() {
	if l.every == 0 {
		l.every = pollTick
	} else {
		l.every = min(2*l.every, maxPollTick)
	}
	if l.t == nil {
		l.t = time.NewTimer(l.every)
	} else {
		l.t.Reset(l.every)
	}
	l.c = l.t.C
}

func (l *looks) stop() {
	if l.t != nil {
		l.t.Stop()
	}
}

// rememberLease remembers out, the answer to the lease request k, if it
// granted a job: until the last accept_by of its grants, after which a
// repeat leases anew.
func (s *Server) rememberLease(ctx context.Context, c *call, k *keyed, out *wire.LeaseResponse) error {
	if k == nil || len(out.Leases) == 0 {
		return nil
	}
	var until time.Time
	for _, g := range out.Leases {
		if g.AcceptBy.After(until) {
			until = g.AcceptBy
		}
	}
	return s.remember(ctx, c, k, http.StatusOK, out, until)
}

// leaseOnce makes one attempt to lease jobs under a fresh envelope
// snapshot, for a worker that is not banned (checkGranted), and, with
// explain, says why none was granted (in the answer's message, and as
// a noJob; nil otherwise). With accept, the claim accepts the
// jobs it grants in the same write (lease.LeaseRequest.Accept): the
// snapshot gates their types before the claim, for the lease and the
// accept at once.
func (s *Server) leaseOnce(ctx context.Context, c *call, lr lease.LeaseRequest, accept, explain bool) (*wire.LeaseResponse, *noJob, error) {
	// A ban or a retirement committed since the request's credential
	// was verified (during a long-poll's wait) is seen here, in the
	// claim's transaction: no job is granted to a banned worker.
	if err := s.checkGranted(ctx, lr.WorkerID); err != nil {
		return nil, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	prices := s.cfg.Prices
	lr.Allow = func(t string) bool { return snap.Allow(t) == nil }
	lr.PolicyVersion = snap.Version()
	lr.Price = prices.Rate
	lr.Accept = accept
	grants, err := s.leases.Lease(ctx, lr)
	if err != nil {
		return nil, nil, err
	}
	if len(grants) > 0 {
		// And again after the claim, in its transaction: a ban that
		// committed while this attempt ran (after the check above, before
		// the claim saw a job dispatched after the ban) rolls the grants
		// back. The claim read every job it grants after those jobs were
		// dispatched, so this read comes after any ban that preceded
		// their dispatch.
		if err := s.checkGranted(ctx, lr.WorkerID); err != nil {
			return nil, nil, err
		}
	}
	if n := len(grants); n > 0 {
		if em := s.events(); em != nil {
			c.note(func() { em.ObserveLeases(LeaseGranted, n) })
		}
		for _, g := range grants {
			c.jobIDs = append(c.jobIDs, g.Job.ID)
		}
	}
	// Read after the claim: at or after every grant's time (leases_through).
	out := &wire.LeaseResponse{Leases: []wire.Grant{}, ServerTime: s.now()}
	for _, g := range grants {
		j := g.Job
		// A grant accepted in the claim is reported as a lease then an
		// accept would report it: queued>leased, then leased>running.
		from := lease.StateQueued
		if g.Leased != nil {
			if err := s.jobChanged(ctx, c, from, g.Leased); err != nil {
				return nil, nil, err
			}
			from = lease.StateLeased
		}
		if err := s.jobChanged(ctx, c, from, j); err != nil {
			return nil, nil, err
		}
		wj, err := s.grantJob(ctx, j)
		if err != nil {
			return nil, nil, err
		}
		out.Leases = append(out.Leases, wire.Grant{
			LeaseID: j.Lease.ID, LeaseToken: g.Token, Job: wj,
			ExpiresAt: j.Lease.ExpiresAt, AcceptBy: j.Lease.AcceptBy,
		})
	}
	if len(grants) > 0 {
		f := out.Leases[0]
		out.LeaseID, out.LeaseToken, out.Job, out.ExpiresAt, out.AcceptBy = &f.LeaseID, &f.LeaseToken, &f.Job, &f.ExpiresAt, &f.AcceptBy
		out.Message = "leased " + jobCount(len(grants))
		if lr.Accept {
			out.Message = "leased and accepted " + jobCount(len(grants))
		}
		return out, nil, nil
	}
	if !explain {
		return out, nil, nil
	}
	why, err := s.whyNoJob(ctx, snap, lr)
	if err != nil {
		return nil, nil, err
	}
	out.Message = why.message
	return out, why, nil
}

// jobCount is "1 job" or "n jobs".
func jobCount(n int) string {
	if n == 1 {
		return "1 job"
	}
	return fmt.Sprintf("%d jobs", n)
}

// noJob is why a lease attempt granted nothing.
type noJob struct {
	// message says it in words: the answer's message.
	message string
	// next is the earliest time a fitting job examined that was not due
	// becomes due (zero: none).
	next time.Time
	// look reports that the answer may change without a notification
	// other than at next: the worker is at its live-lease limit (its own
	// job's end frees a slot), or there were more jobs than examined.
	look bool
}

// whyNoJob explains an empty lease with lease.Manager.ExplainLease: a
// worker awaiting approval, the types asked for that it did not register
// or its approval leaves out (ignored), the types the envelope blocks (in
// the envelope's words), the types with no queued, fitting or due job,
// and a worker already at its live-lease limit.
func (s *Server) whyNoJob(ctx context.Context, snap *envelope.Snapshot, lr lease.LeaseRequest) (*noJob, error) {
	ex, err := s.leases.ExplainLease(ctx, lr, nil)
	if err != nil {
		return nil, err
	}
	nj := &noJob{look: ex.Truncated || (!ex.Pending && !ex.Draining && !ex.Banned && !ex.Slot)}
	for _, tv := range ex.Types {
		if !tv.NextAt.IsZero() && (nj.next.IsZero() || tv.NextAt.Before(nj.next)) {
			nj.next = tv.NextAt
		}
	}
	why := []string{"no eligible job"}
	// The types the request asked for beyond what the worker may serve
	// are named in one phrase per reason, where the first of them was.
	ignored := map[lease.ReasonCode][]string{}
	at := map[lease.ReasonCode]int{}
	for _, r := range ex.Reasons {
		var be *envelope.BlockedError
		switch {
		case r.Code == lease.ReasonNoJobTypes, r.Code == lease.ReasonPendingApproval, r.Code == lease.ReasonDraining:
			nj.message = "no eligible job: " + r.Message
			return nj, nil
		case r.Code == lease.ReasonTypeNotRegistered, r.Code == lease.ReasonTypeNotApproved:
			if _, ok := at[r.Code]; !ok {
				at[r.Code] = len(why)
				why = append(why, "")
			}
			ignored[r.Code] = append(ignored[r.Code], fmt.Sprintf("%q", r.JobType))
		case r.Code == lease.ReasonTypeNotAllowed && errors.As(snap.Allow(r.JobType), &be):
			why = append(why, be.Reason)
		default:
			why = append(why, r.Message)
		}
	}
	if i, ok := at[lease.ReasonTypeNotRegistered]; ok {
		why[i] = "ignored job types the worker did not register: " + strings.Join(ignored[lease.ReasonTypeNotRegistered], ", ")
	}
	if i, ok := at[lease.ReasonTypeNotApproved]; ok {
		why[i] = "ignored job types the worker's approval does not include: " + strings.Join(ignored[lease.ReasonTypeNotApproved], ", ")
	}
	nj.message = strings.Join(why, "; ")
	return nj, nil
}

// accept: POST /workers/jobs/{id}/accept. The lease is checked first,
// then the envelope is asked again: a type blocked since the lease was
// granted is not accepted (403), and its lease runs out at the accept
// deadline.
func (s *Server) accept(ctx context.Context, c *call) (int, any, error) {
	var req wire.TokenRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	// Only a JobChanged hook needs the state before (an accept repeated
	// under the same lease changes nothing): a read no accept pays for
	// otherwise.
	from := lease.StateLeased
	if s.cfg.Hooks != nil {
		before, err := s.leases.Get(ctx, ref.JobID)
		if err != nil {
			return 0, nil, err
		}
		from = before.State
	}
	// The lease first: a caller without it learns nothing of the job,
	// not even its type's verdict. A blocked type then fails the
	// request, and its transaction takes the accept back.
	j, err := s.leases.Accept(ctx, ref)
	if err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	if err := snap.Allow(j.Type); err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, from, j); err != nil {
		return 0, nil, err
	}
	wj, err := s.grantJob(ctx, j)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.AcceptResponse{Job: wj, ExpiresAt: j.Lease.ExpiresAt}, nil
}
