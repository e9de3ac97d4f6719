package lease

import (
	"context"
	"crypto/sha256"
	"time"
)

// The hot path. Accept and Complete of a live lease are the two
// transitions every job makes; a Store that implements GuardedStore makes
// each as one write whose WHERE clause is the whole check, instead of a
// read, a decision in the Manager and a conditional write. The Manager
// tries the guarded write first; when its guard does not hold, nothing is
// written and the Manager falls back to the reference path (read, decide,
// write at the revision read), which finds the reason — a lost lease, a
// repeat, a cancel — and answers exactly as it would without the guarded
// write. So the guards need to hold only in the plain case, and every
// other case keeps one implementation.

// Guard names the live lease a guarded write acts under, and when.
type Guard struct {
	JobID    string
	WorkerID string
	// TokenHash is the SHA-256 of the lease token (Lease.TokenHash).
	TokenHash []byte
	// Now is the Manager's clock at the call: the lease must be live at Now.
	Now time.Time
}

// AcceptWrite is one guarded accept: the job must be leased, under the
// guard's worker and token, with its lease live at Now (before ExpiresAt
// and AcceptBy) and no cancel requested. The write sets State running,
// AcceptedAt Now, the lease's ExpiresAt to Now plus the lesser of TTL and
// the job's max runtime (Requirements.MaxRuntimeSeconds, or MaxRuntime
// when it has none), and Rev to Rev+1; nothing else.
type AcceptWrite struct {
	Guard
	TTL        time.Duration
	MaxRuntime time.Duration
}

// CompleteWrite is one guarded completion: the job must be running, under
// the guard's worker and token, with its lease live at Now (before
// ExpiresAt, and before AcceptedAt plus the job's max runtime, as in
// AcceptWrite) and no cancel requested. The write sets State succeeded,
// FinishedAt Now, Result, and Rev to Rev+1; nothing else.
type CompleteWrite struct {
	Guard
	MaxRuntime time.Duration
	// Result is the job's result; its ReceiptID, when not empty, is
	// written as the job's ReceiptID and not as part of the result.
	Result Result
}

// GuardedStore is a Store that also makes the hot transitions as guarded
// writes. Each method applies every write whose guard holds and returns,
// in the order of ws, the job as written, or nil where the guard did not
// hold (nothing is written for it); when several writes name one job,
// only the first may apply. An error means nothing was written.
//
// A Store may gather the writes of concurrent callers into one statement
// and one commit; within the context's transaction it writes in that
// transaction.
type GuardedStore interface {
	Store
	AcceptLeased(ctx context.Context, ws []AcceptWrite) ([]*Job, error)
	CompleteRunning(ctx context.Context, ws []CompleteWrite) ([]*Job, error)
}

// guard returns the Guard of ref at now.
func guard(ref Ref, now time.Time) Guard {
	h := sha256.Sum256([]byte(ref.Token))
	return Guard{JobID: ref.JobID, WorkerID: ref.WorkerID, TokenHash: h[:], Now: now}
}

// fastAccept tries the guarded accept; it returns nil, nil when the store
// has none or the guard did not hold.
func (m *Manager) fastAccept(ctx context.Context, ref Ref) (*Job, error) {
	g, ok := m.store.(GuardedStore)
	if !ok {
		return nil, nil
	}
	js, err := g.AcceptLeased(ctx, []AcceptWrite{{Guard: guard(ref, m.now()), TTL: m.cfg.LeaseTTL, MaxRuntime: m.cfg.MaxRuntime}})
	if err != nil || len(js) != 1 {
		return nil, err
	}
	return js[0], nil
}

// fastComplete tries the guarded completion; it returns nil, nil when
// the store has none or the guard did not hold.
func (m *Manager) fastComplete(ctx context.Context, ref Ref, res Result) (*Job, error) {
	g, ok := m.store.(GuardedStore)
	if !ok {
		return nil, nil
	}
	js, err := g.CompleteRunning(ctx, []CompleteWrite{{Guard: guard(ref, m.now()), MaxRuntime: m.cfg.MaxRuntime, Result: res}})
	if err != nil || len(js) != 1 {
		return nil, err
	}
	return js[0], nil
}

// LeaseClaim is what ClaimingStore.ClaimLeases writes on each job it
// claims: the k-th job claimed, in claim order, gets Leases[k] with
// JobID set to its id, Epoch one above its last lease's (1 for a job
// never leased), SKU its Requirements.GPUSKU or, when it names none,
// DefaultSKU, and PriceMicroUSD Prices[SKU] (0 for a SKU not listed);
// its State becomes leased, LeasedAt the claim's Now, AcceptedAt nil, and
// Rev Rev+1. With Accept, the same write accepts the job too: its State
// becomes running, AcceptedAt the claim's Now, and its lease's ExpiresAt
// the lesser of the prepared one and the claim's Now plus the job's max
// runtime (Requirements.MaxRuntimeSeconds, or MaxRuntime when it has
// none), as AcceptWrite would; Rev still only Rev+1.
type LeaseClaim struct {
	Leases     []Lease
	DefaultSKU string
	Prices     map[string]int64
	Accept     bool
	MaxRuntime time.Duration
}

// Grant is the grant function of a ClaimJobs call that claims c at now:
// it writes on each job it is given what LeaseClaim says, the k-th job
// getting c.Leases[k]. A store that retries after a rollback calls it
// again, for the same jobs or others: it takes the leases round-robin,
// so any len(c.Leases) consecutive calls get distinct leases and the
// attempt that commits, which claims at most that many jobs, gets
// distinct ones whatever rolled-back attempts took.
func (c LeaseClaim) Grant(now time.Time) func(*Job) {
	calls := 0
	return func(j *Job) {
		l := c.Leases[calls%len(c.Leases)]
		calls++
		l.JobID = j.ID
		l.Epoch = 1
		if j.Lease != nil {
			l.Epoch = j.Lease.Epoch + 1
		}
		l.SKU = j.Requirements.GPUSKU
		if l.SKU == "" {
			l.SKU = c.DefaultSKU
		}
		l.PriceMicroUSD = c.Prices[l.SKU]
		at := now
		j.State, j.LeasedAt, j.AcceptedAt = StateLeased, &at, nil
		if c.Accept {
			rt := c.MaxRuntime
			if s := j.Requirements.MaxRuntimeSeconds; s > 0 {
				rt = time.Duration(s) * time.Second
			}
			acc := now
			j.State, j.AcceptedAt, l.ExpiresAt = StateRunning, &acc, minTime(l.ExpiresAt, now.Add(rt))
		}
		j.Lease = &l
		j.Rev++
	}
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// ClaimingStore is a Store that reads the worker and claims jobs for it in
// one transaction, and claims and writes their leases in one statement, as
// ClaimJobs does with a grant the Manager would make. ClaimLeases reads
// worker workerID (ErrNotFound if there is none) and calls plan with it:
// plan returns the claim's query and the leases the Manager prepared, or
// false (or an error) when the worker may claim nothing, and then nothing
// is claimed. It claims at most len(c.Leases) jobs (and at most q.Limit)
// under the rules of ClaimJobs, filling in what depends on each job (see
// LeaseClaim), and returns them as written, in claim order. A store that
// retries the transaction calls plan again.
type ClaimingStore interface {
	Store
	ClaimLeases(ctx context.Context, workerID string, plan func(*Worker) (ClaimQuery, LeaseClaim, bool, error)) ([]*Job, error)
}
