package envelope

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors returned by the Gate and by stores. Callers test them with errors.Is.
var (
	// ErrBlocked matches every *BlockedError: the envelope does not allow
	// the job type now.
	ErrBlocked = errors.New("envelope: blocked")
	// ErrConflict means a store write lost a race (the state changed since it
	// was read). The Gate reads again and retries; its callers see it only
	// when every retry lost.
	ErrConflict = errors.New("envelope: conflict")
	// ErrInvalidArgument means an argument or a Config field is out of range or
	// missing.
	ErrInvalidArgument = errors.New("envelope: invalid argument")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure), or kept aborting the
	// store's own; nothing of it is kept, and the whole transaction must
	// be run again, from its beginning. Stores return it; the Gate never
	// retries it (it retries only ErrConflict, a lost race of one write)
	// and returns it as it is.
	ErrAborted = errors.New("envelope: transaction aborted")
)

// BlockedError reports that the envelope does not allow a job type now.
type BlockedError struct {
	JobType string
	// Reason says why, for an operator: "lora_train is blocked: the
	// runtime is not activated".
	Reason string
}

func (e *BlockedError) Error() string { return "envelope: " + e.Reason }

// Is makes errors.Is(err, ErrBlocked) hold for every BlockedError.
func (e *BlockedError) Is(target error) bool { return target == ErrBlocked }

// InitialVersion is the policy version of a runtime that has never
// changed: inactive.
const InitialVersion int64 = 1

// State is the runtime's activation as stored: the state the last change
// left. Whether it allows blocked types at a given time is a Snapshot's
// question, since an activation also ends at its deadline.
type State struct {
	// Version is the policy version: InitialVersion, plus one per change.
	Version int64 `json:"policy_version"`
	// Active is set by an activation and cleared by a deactivation or a
	// recorded expiry.
	Active bool `json:"active"`
	// By is who made the last change: the operator who activated or
	// deactivated; empty for the initial state and after an expiry.
	By string `json:"by"`
	// Reason is the last change's reason.
	Reason string `json:"reason"`
	// Until is the deadline of the activation, nil when it has none. After
	// a recorded expiry it is the deadline that passed; after a
	// deactivation it is nil.
	Until *time.Time `json:"until"`
	// ChangedAt is when the last change was made; zero for the initial
	// state.
	ChangedAt time.Time `json:"changed_at"`
	// SafeTypes are the job types an operator made safe at run time
	// (Gate.SetSafeTypes), sorted as bytes, nil when none: they run as the
	// Policy's safe types do. Every change carries them over.
	SafeTypes []string `json:"safe_types"`
}

// InitialState is the state of a runtime that has never changed, which a
// new Store answers.
func InitialState() State { return State{Version: InitialVersion} }

// Action is what one change did.
type Action string

// The changes a history records.
const (
	ActionActivate   Action = "activate"
	ActionDeactivate Action = "deactivate"
	// ActionExpire records the end of a timed activation at its deadline.
	ActionExpire Action = "expire"
	// ActionSafeTypes records a change of the safe types an operator
	// added at run time (Gate.SetSafeTypes).
	ActionSafeTypes Action = "safe_types"
)

// Record is one entry of the history: the change that produced a version.
type Record struct {
	// Version is the policy version the change produced.
	Version int64  `json:"policy_version"`
	Action  Action `json:"action"`
	// By is the operator who made the change; empty for an expiry.
	By     string `json:"by"`
	Reason string `json:"reason"`
	// Until is the activation's deadline (nil when it has none), or, for
	// an expiry, the deadline that passed; nil for a deactivation.
	Until *time.Time `json:"until"`
	// At is when the change was made.
	At time.Time `json:"at"`
	// SafeTypes are the run-time safe types after the change (see
	// State.SafeTypes): a safe-types change's new list, or, for any other
	// change, the list it carried over.
	SafeTypes []string `json:"safe_types"`
	// WasActive, on a safe-types change, is whether the runtime was
	// activated before it (such a change leaves the activation as it
	// was); false for every other change.
	WasActive bool `json:"was_active,omitempty"`
}

// State returns the state the change left. A safe-types change keeps the
// activation it found: its Until is the deadline that stands, and
// WasActive whether the runtime was active.
func (r Record) State() State {
	return State{
		Version:   r.Version,
		Active:    r.Action == ActionActivate || r.Action == ActionSafeTypes && r.WasActive,
		By:        r.By,
		Reason:    r.Reason,
		Until:     cloneTime(r.Until),
		ChangedAt: r.At,
		SafeTypes: slices.Clone(r.SafeTypes),
	}
}

// String renders r on one line, for logs and examples:
// "v2 activate by alice until 2026-11-30T12:00:00Z: nightly LoRA run".
func (r Record) String() string {
	s := fmt.Sprintf("v%d %s", r.Version, r.Action)
	if r.By != "" {
		s += " by " + r.By
	}
	if r.Until != nil {
		s += " until " + r.Until.Format(time.RFC3339Nano)
	}
	return s + ": " + r.Reason
}

// Store keeps the runtime's state and its history. It makes no decisions:
// the Gate decides every change and the Store applies it atomically.
//
// The contract below holds for every Store; the conformance suite
// envelopetest checks it.
//
// Isolation and transactions. Each method is atomic: Apply writes the
// state and the record both or neither, and decides (the version it is
// conditional on) on committed data, READ COMMITTED or stronger, together
// with the writes of its own transaction, never on a read that another
// writer can invalidate before the write that follows it; State and
// History read one committed state. Every method takes the context first
// and, when the store supports transactions, joins the one the context
// carries (how a context carries one is the adapter's business, such as
// bunstore.WithTx): it sees that transaction's own earlier writes, and its
// writes commit or roll back with it. Without one, a method commits before
// it returns.
//
// Values. Records are keyed and ordered by version, an integer; the
// envelope has no string ids. Times handed to a Store are UTC and
// truncated to microseconds; a Store must give them back exactly. By,
// Reason and each of SafeTypes come back byte for byte (SafeTypes nil when
// none, as written): no trimming, case folding or Unicode normalisation.
// They are valid UTF-8 without NUL (U+0000), which PostgreSQL text cannot
// hold; the Gate hands a Store no other. A Store returns copies: changing
// a returned value does not change the stored one.
//
// Limits. Callers always pass History a limit of at least 1 (the Gate
// pages by 100, at most 1000); a Store returns ErrInvalidArgument for a
// limit of 0 or less rather than guess what it would mean.
//
// Errors. Each method returns the sentinels its documentation names, or
// ErrAborted when the database aborted the transaction the context
// carries; any other error means the store could not answer. A store may
// retry internally, a bounded number of times, only when the context
// carries no transaction: a transaction the context carries is the
// caller's to run again, and the Gate never does. Once a call has returned
// ErrAborted, nothing more of that transaction commits: every later call
// with its context fails (workerapi.Transactor says why this takes care on
// MySQL and MariaDB).
type Store interface {
	// State returns the current state; InitialState() if no change was
	// ever applied. It returns no sentinel error but ErrAborted.
	State(ctx context.Context) (State, error)
	// Apply makes next the current state and appends rec to the history,
	// both or neither, only if the current version is prev (next.Version
	// and rec.Version hold the new one). ErrConflict if the version
	// differs.
	Apply(ctx context.Context, prev int64, next State, rec Record) error
	// History returns the records with Version > after in ascending
	// version order, at most limit of them. ErrInvalidArgument if limit
	// is not positive.
	History(ctx context.Context, after int64, limit int) ([]Record, error)
}

func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}
