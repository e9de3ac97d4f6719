package lease

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"time"
)

// The hot path. Accept and Complete of a live lease are the two
// transitions every job makes; a Store makes each as one write whose
// guard (its WHERE clause, in SQL) is the whole check, and the Manager
// writes them nowhere else. When a guard does not hold, nothing is
// written and the Manager reads the job to find the reason (a lost
// lease, a repeat, a cancel), so the guards need to hold only in the
// plain case.

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
// and AcceptBy). The write sets State running, AcceptedAt Now, Rev to
// Rev+1 and, unless the job's cancel was requested (Cancel set its last
// expiry), the lease's ExpiresAt to Now plus the lesser of TTL and the
// job's max runtime (Requirements.MaxRuntimeSeconds, or MaxRuntime when
// it has none); nothing else.
type AcceptWrite struct {
	Guard
	TTL        time.Duration
	MaxRuntime time.Duration
}

// CompleteWrite is one guarded completion: the job must be running, under
// the guard's worker and token, with its lease live at Now (before
// ExpiresAt, and before AcceptedAt plus the job's max runtime:
// Requirements.MaxRuntimeSeconds, or MaxRuntime when it has none, the
// same max runtime AcceptWrite caps the lease with) and no cancel
// requested. The write sets State succeeded,
// FinishedAt Now (its AcceptedAt, if Now is earlier), Result, and Rev to
// Rev+1; nothing else.
type CompleteWrite struct {
	Guard
	MaxRuntime time.Duration
	// Result is the job's result; its ReceiptID, when not empty, is
	// written as the job's ReceiptID and not as part of the result.
	Result Result
}

// guard returns the Guard of ref at now.
func guard(ref Ref, now time.Time) Guard {
	h := sha256.Sum256([]byte(ref.Token))
	return Guard{JobID: ref.JobID, WorkerID: ref.WorkerID, TokenHash: h[:], Now: now}
}

// holds reports whether j is leased or running under g's lease, live at
// g.Now, its max runtime defaulting to maxRuntime: the guard of every
// write under a lease.
func (g Guard) holds(j *Job, s State, maxRuntime time.Duration) bool {
	return j.State == s && g.names(j) && liveAt(j, g.Now, maxRuntime)
}

// job is the id of the job g's write names.
func (g Guard) job() string { return g.JobID }

// names reports whether j's recorded lease is g's worker's and token's,
// live or not.
func (g Guard) names(j *Job) bool {
	return j.Lease != nil && j.Lease.WorkerID == g.WorkerID && subtle.ConstantTimeCompare(j.Lease.TokenHash, g.TokenHash) == 1
}

// LeaseClaim is what Store.ClaimLeases writes on each job it claims: the
// k-th job claimed, in claim order, gets Leases[k] with JobID set to its
// id, Epoch one above its last lease's (1 for a job never leased), SKU
// its Requirements.GPUSKU or, when it names none, DefaultSKU, and
// PriceMicroUSD Prices[SKU] (0 for a SKU not listed); its State becomes
// leased, LeasedAt the claim's Now, AcceptedAt nil, and Rev Rev+1. With
// Accept, the same write accepts the job too: its State becomes running,
// AcceptedAt the claim's Now, and its lease's ExpiresAt the lesser of the
// prepared one and the claim's Now plus the job's max runtime
// (Requirements.MaxRuntimeSeconds, or MaxRuntime when it has none), as
// AcceptWrite would; Rev still only Rev+1.
type LeaseClaim struct {
	Leases     []Lease
	DefaultSKU string
	Prices     map[string]int64
	Accept     bool
	MaxRuntime time.Duration
}

// grant writes on j, the k-th job claimed at now, what c says.
func (c LeaseClaim) grant(j *Job, k int, now time.Time) {
	l := c.Leases[k]
	l.JobID = j.ID
	l.Epoch = 1
	if j.Lease != nil {
		l.Epoch = j.Lease.Epoch + 1
	}
	l.SKU = cmp.Or(j.Requirements.GPUSKU, c.DefaultSKU)
	l.PriceMicroUSD = c.Prices[l.SKU]
	at := now
	j.State, j.LeasedAt, j.AcceptedAt = StateLeased, &at, nil
	if c.Accept {
		acc := now
		j.State, j.AcceptedAt, l.ExpiresAt = StateRunning, &acc, minTime(l.ExpiresAt, now.Add(runtimeOf(j, c.MaxRuntime)))
	}
	j.Lease = &l
	j.Rev++
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
