package credential

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Quotas bound what a principal may write that is never deleted (a node's
// audit receipts): each quota counts units in fixed windows of time, in
// the store, so that every Issuer sharing the store counts against one
// total.

// ErrQuotaExceeded means a principal has spent a quota for the current
// window (429 quota_exceeded). Charge returns it inside a *QuotaError.
var ErrQuotaExceeded = errors.New("credential: quota exceeded")

// Quota is a principal's window of one quota (Store.ChargeQuota).
type Quota struct {
	// Start is when the window began; it ends Window later.
	Start time.Time
	// Used is how many units were counted in the window.
	Used int64
}

// QuotaError is the error Charge returns when a charge does not fit: it
// matches ErrQuotaExceeded, and says when the window ends.
type QuotaError struct {
	PrincipalID, Name string
	// Limit is the quota's units per window, Used those counted so far.
	Limit, Used int64
	// ResetAt is when the window ends and the quota is whole again.
	ResetAt time.Time
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: principal %s used %d of %d %s until %s", ErrQuotaExceeded,
		e.PrincipalID, e.Used, e.Limit, e.Name, e.ResetAt.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrQuotaExceeded.
func (e *QuotaError) Unwrap() error { return ErrQuotaExceeded }

// Charge counts n units of the quota name of principalID, which allows
// limit units in each window of length window: a window begins at the
// first charge after the previous window ended, and the charge is counted
// only if the window's units stay at most limit. It returns the window as
// counted. Call it in the transaction of the writes it pays for, so that
// the units count only if they commit. The count is one conditional
// write in the store: concurrent charges, on any number of Issuers
// sharing it, never count past limit.
//
// A *QuotaError (ErrQuotaExceeded), counting nothing, when the units do
// not fit; ErrInvalidArgument for an empty name, n below 1 or above
// limit (it could never fit), or a window below a microsecond.
func (is *Issuer) Charge(ctx context.Context, principalID, name string, n, limit int64, window time.Duration) (Quota, error) {
	if name == "" || n < 1 || n > limit || window < time.Microsecond {
		return Quota{}, fmt.Errorf("%w: quota %q, charge %d, limit %d, window %v", ErrInvalidArgument, name, n, limit, window)
	}
	window = window.Truncate(time.Microsecond)
	q, ok, err := is.store.ChargeQuota(ctx, QuotaCharge{
		PrincipalID: principalID, Name: name, N: n, Limit: limit, Window: window, Now: is.now(),
	})
	if err != nil {
		return Quota{}, fmt.Errorf("quota %s of principal %q: %w", name, principalID, err)
	}
	if !ok {
		return q, &QuotaError{PrincipalID: principalID, Name: name, Limit: limit, Used: q.Used, ResetAt: q.Start.Add(window)}
	}
	return q, nil
}

// QuotaCharge is one charge of Store.ChargeQuota.
type QuotaCharge struct {
	PrincipalID, Name string
	// N is the units to count, at most Limit in a window of length
	// Window; 0 < N <= Limit, and Window is a whole number of
	// microseconds.
	N, Limit int64
	Window   time.Duration
	// Now is the time of the charge, UTC, truncated to microseconds.
	Now time.Time
}
