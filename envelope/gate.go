package envelope

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config holds the Gate's optional settings. A nil *Config means all defaults.
type Config struct {
	// ExtraSafe adds job types that always run. A type may not be both
	// safe and blocked, counting the canonical lists: NewGate rejects such
	// a Config, so no host can make a canonical blocked type safe.
	// Defaults to none.
	ExtraSafe []string
	// ExtraBlocked adds job types that run only while the runtime is
	// activated. Unlisted types are blocked anyway; listing one makes it
	// known, so its refusal says "blocked" rather than "unknown".
	// Defaults to none.
	ExtraBlocked []string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Gate decides which job types may run and changes the runtime's
// activation over a Store. It is safe for concurrent use, and several
// Gates (on several replicas) may share one Store: every change is
// conditional on the version it read.
type Gate struct {
	store  Store
	policy *Policy
	now    func() time.Time
}

const (
	// casTries bounds how often a change is retried after losing a race.
	// Each loss means another change was committed, so only a flood of
	// concurrent changes exhausts it.
	casTries = 64
	// maxByLen and maxReasonLen bound what an operator writes.
	maxByLen     = 256
	maxReasonLen = 1024
	// defaultHistoryPage and maxHistoryPage are History's page sizes.
	defaultHistoryPage = 100
	maxHistoryPage     = 1000
)

// The bounds of Gate.SetSafeTypes; a change beyond one is refused with
// ErrInvalidArgument.
const (
	// MaxSafeTypes bounds the job types an operator may make safe at run
	// time, all changes together.
	MaxSafeTypes = 256
	// MaxSafeTypesChange bounds the job types one change adds and removes.
	MaxSafeTypesChange = 64
)

// NotSafeableError reports a job type that Gate.SetSafeTypes may not make
// safe: one the Policy blocks (a canonical blocked type, such as
// raw_training or model_file_write, or one of Config.ExtraBlocked). It
// matches ErrInvalidArgument.
type NotSafeableError struct {
	JobType string
}

func (e *NotSafeableError) Error() string {
	return fmt.Sprintf("envelope: job type %s is blocked by the policy and can never be made safe", e.JobType)
}

// Is makes errors.Is(err, ErrInvalidArgument) hold for every
// NotSafeableError.
func (e *NotSafeableError) Is(target error) bool { return target == ErrInvalidArgument }

// NewGate returns a Gate over store. cfg may be nil. It returns
// ErrInvalidArgument if store is nil or the extra job types are invalid:
// empty, longer than 128 bytes, or both safe and blocked.
func NewGate(store Store, cfg *Config) (*Gate, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil Store", ErrInvalidArgument)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	p, err := newPolicy(c.ExtraSafe, c.ExtraBlocked)
	if err != nil {
		return nil, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Gate{store: store, policy: p, now: c.Now}, nil
}

// Policy returns the Gate's job type classes.
func (g *Gate) Policy() *Policy { return g.policy }

// clock is the Gate's time in UTC, truncated to microseconds so that
// every store round-trips it exactly.
func (g *Gate) clock() time.Time { return g.now().UTC().Truncate(time.Microsecond) }

// Snapshot reads the state once and returns it with the time it was
// read, so that every question asked of it in one request gets answers
// under one policy version.
func (g *Gate) Snapshot(ctx context.Context) (*Snapshot, error) {
	st, err := g.store.State(ctx)
	if err != nil {
		return nil, err
	}
	return &Snapshot{policy: g.policy, state: st, at: g.clock()}, nil
}

// Allow reports whether jobType may run now: nil, or a *BlockedError.
// It is Snapshot followed by Snapshot.Allow; a caller with several types
// to check should take one Snapshot.
func (g *Gate) Allow(ctx context.Context, jobType string) error {
	s, err := g.Snapshot(ctx)
	if err != nil {
		return err
	}
	return s.Allow(jobType)
}

// Activate lets blocked and unknown job types run, until the deadline
// until if it is not nil, and returns the new state. by (who activates)
// and reason are required: not blank, UTF-8 without NUL, at most 256 and
// 1024 bytes, kept byte for byte; until must be in the future. Activating an
// active runtime replaces its deadline and reason, as a change of its own.
// ErrInvalidArgument.
func (g *Gate) Activate(ctx context.Context, by, reason string, until *time.Time) (State, error) {
	if err := checkText(by, reason); err != nil {
		return State{}, err
	}
	var u *time.Time
	if until != nil {
		t := until.UTC().Truncate(time.Microsecond)
		u = &t
	}
	st, _, err := g.change(ctx, func(_ State, now time.Time) (*Record, error) {
		if u != nil && !u.After(now) {
			return nil, fmt.Errorf("%w: until %s is not in the future (now %s)",
				ErrInvalidArgument, u.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
		}
		return &Record{Action: ActionActivate, By: by, Reason: reason, Until: cloneTime(u)}, nil
	})
	return st, err
}

// Deactivate blocks blocked and unknown job types again and returns the
// new state. by and reason are required. Deactivating an inactive runtime
// is recorded too, as a change of its own: it is an operator's explicit
// act, and every call has a version (and so a receipt) of its own.
// ErrInvalidArgument.
func (g *Gate) Deactivate(ctx context.Context, by, reason string) (State, error) {
	if err := checkText(by, reason); err != nil {
		return State{}, err
	}
	st, _, err := g.change(ctx, func(State, time.Time) (*Record, error) {
		return &Record{Action: ActionDeactivate, By: by, Reason: reason}, nil
	})
	return st, err
}

// ExpireActivation records the end of a timed activation whose deadline
// has passed, as a change of its own (ActionExpire), and reports whether
// it did, with the state it left (so the caller can mint the expiry's
// receipt under its exact version). It does nothing, and reports false, when the runtime is
// inactive, has no deadline, or is before it. The maintainer calls it
// periodically; any number of replicas may call it at once, and exactly
// one of them records each expiry. Snapshots do not wait for it: an
// activation allows nothing from its deadline on.
func (g *Gate) ExpireActivation(ctx context.Context) (st State, changed bool, err error) {
	return g.change(ctx, func(cur State, now time.Time) (*Record, error) {
		if !cur.Active || cur.Until == nil || now.Before(*cur.Until) {
			return nil, nil
		}
		reason := "activation expired"
		if cur.By != "" {
			reason = "activation by " + cur.By + " expired"
		}
		return &Record{Action: ActionExpire, Reason: reason, Until: cloneTime(cur.Until)}, nil
	})
}

// SetSafeTypes changes the job types an operator makes safe at run time
// (State.SafeTypes) and returns the new state and the list before the
// change (for its receipt): it adds add and removes
// remove, as one change with a version (and so a receipt) of its own, and
// leaves the activation as it was. by and reason are required, as for
// Activate. Each type is 1 to 128 bytes of UTF-8 without NUL, whitespace
// or control characters; together add and remove name 1 to
// MaxSafeTypesChange types, none of them twice, and the run-time list may
// hold at most MaxSafeTypes. A type the Policy blocks is a
// *NotSafeableError: no change can make a canonical blocked type safe.
// Adding a type that is safe already changes nothing of the list;
// removing one the Policy makes safe (canonical, or Config.ExtraSafe) is
// refused, since only the run-time additions can be removed; removing a
// type not in the list changes nothing of it. ErrInvalidArgument.
func (g *Gate) SetSafeTypes(ctx context.Context, by, reason string, add, remove []string) (next State, before []string, err error) {
	if err := checkText(by, reason); err != nil {
		return State{}, nil, err
	}
	if n := len(add) + len(remove); n == 0 || n > MaxSafeTypesChange {
		return State{}, nil, fmt.Errorf("%w: a change adds and removes 1 to %d job types, not %d", ErrInvalidArgument, MaxSafeTypesChange, n)
	}
	seen := map[string]bool{}
	for _, t := range slices.Concat(add, remove) {
		if err := checkType(t); err != nil {
			return State{}, nil, err
		}
		if seen[t] {
			return State{}, nil, fmt.Errorf("%w: job type %s is named twice", ErrInvalidArgument, t)
		}
		seen[t] = true
	}
	for _, t := range add {
		if g.policy.Class(t) == ClassBlocked {
			return State{}, nil, &NotSafeableError{JobType: t}
		}
	}
	for _, t := range remove {
		if g.policy.Class(t) == ClassSafe {
			return State{}, nil, fmt.Errorf("%w: job type %s is safe by the server's policy; only the types added at run time can be removed", ErrInvalidArgument, t)
		}
	}
	st, _, err := g.change(ctx, func(cur State, _ time.Time) (*Record, error) {
		before = slices.Clone(cur.SafeTypes)
		set := slices.Clone(cur.SafeTypes)
		for _, t := range add {
			if g.policy.Class(t) != ClassSafe && !slices.Contains(set, t) {
				set = append(set, t)
			}
		}
		set = slices.DeleteFunc(set, func(t string) bool { return slices.Contains(remove, t) })
		if len(set) > MaxSafeTypes {
			return nil, fmt.Errorf("%w: %d job types made safe at run time, more than %d", ErrInvalidArgument, len(set), MaxSafeTypes)
		}
		slices.Sort(set)
		if len(set) == 0 {
			set = nil
		}
		return &Record{Action: ActionSafeTypes, By: by, Reason: reason, Until: cloneTime(cur.Until), SafeTypes: set, WasActive: cur.Active}, nil
	})
	if err != nil {
		return State{}, nil, err
	}
	return st, before, nil
}

// checkType checks a job type named in a safe-types change.
func checkType(t string) error {
	if t == "" || len(t) > maxTypeLen || !utf8.ValidString(t) || strings.IndexFunc(t, func(r rune) bool { return r == 0 || unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("%w: job type %q must be 1 to %d bytes of UTF-8 without whitespace or control characters", ErrInvalidArgument, t, maxTypeLen)
	}
	return nil
}

// History returns the changes with a version above afterVersion, oldest
// first, at most limit of them: 100 if limit is not positive, and never
// more than 1000. The initial state (version 1) has no record.
// ErrInvalidArgument if afterVersion is negative.
func (g *Gate) History(ctx context.Context, afterVersion int64, limit int) ([]Record, error) {
	if afterVersion < 0 {
		return nil, fmt.Errorf("%w: afterVersion %d is negative", ErrInvalidArgument, afterVersion)
	}
	if limit <= 0 {
		limit = defaultHistoryPage
	}
	return g.store.History(ctx, afterVersion, min(limit, maxHistoryPage))
}

// change reads the state, asks decide for the change to make (nil for
// none) and applies it conditionally on the version read, reading again
// after each lost race. It returns the state it left, or the one it read
// when decide made no change.
func (g *Gate) change(ctx context.Context, decide func(cur State, now time.Time) (*Record, error)) (State, bool, error) {
	for range casTries {
		cur, err := g.store.State(ctx)
		if err != nil {
			return State{}, false, err
		}
		now := g.clock()
		rec, err := decide(cur, now)
		if err != nil || rec == nil {
			return cur, false, err
		}
		rec.Version = cur.Version + 1
		rec.At = now
		if rec.Action != ActionSafeTypes {
			rec.SafeTypes = slices.Clone(cur.SafeTypes) // carried over
		}
		next := rec.State()
		err = g.store.Apply(ctx, cur.Version, next, *rec)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return State{}, false, err
		}
		return next, true, nil
	}
	return State{}, false, fmt.Errorf("%w: the envelope changed %d times while a change was being made", ErrConflict, casTries)
}

func checkText(by, reason string) error {
	for _, f := range []struct {
		name, value string
		max         int
	}{{"by", by, maxByLen}, {"reason", reason, maxReasonLen}} {
		if strings.TrimSpace(f.value) == "" {
			return fmt.Errorf("%w: %s is required", ErrInvalidArgument, f.name)
		}
		if len(f.value) > f.max || !utf8.ValidString(f.value) || strings.ContainsRune(f.value, 0) {
			return fmt.Errorf("%w: %s must be UTF-8 without NUL, of at most %d bytes", ErrInvalidArgument, f.name, f.max)
		}
	}
	return nil
}

// Snapshot is the envelope as read once, at one time. Its answers are
// pure: they depend on nothing but the state and time it holds.
type Snapshot struct {
	policy *Policy
	state  State
	at     time.Time
}

// State returns the state as stored when the snapshot was taken. Its
// Active field may still be set past the deadline; see Active.
func (s *Snapshot) State() State {
	st := s.state
	st.Until = cloneTime(st.Until)
	st.SafeTypes = slices.Clone(st.SafeTypes)
	return st
}

// SafeTypes returns every safe job type under this snapshot: the
// Policy's (canonical, then the host's), then those an operator added at
// run time (State.SafeTypes).
func (s *Snapshot) SafeTypes() []string {
	return slices.Concat(s.policy.SafeTypes(), s.state.SafeTypes)
}

// Class returns the class of jobType under this snapshot: the Policy's,
// or ClassSafe for a type an operator made safe at run time.
func (s *Snapshot) Class(jobType string) Class {
	c := s.policy.Class(jobType)
	if c == ClassUnknown && slices.Contains(s.state.SafeTypes, jobType) {
		return ClassSafe
	}
	return c
}

// Version returns the policy version in force, which grants and receipts
// made under this snapshot carry.
func (s *Snapshot) Version() int64 { return s.state.Version }

// At returns when the snapshot was taken (UTC, microseconds).
func (s *Snapshot) At() time.Time { return s.at }

// Active reports whether the runtime was activated at the snapshot's
// time: activated, and before the deadline if there is one.
func (s *Snapshot) Active() bool {
	return s.state.Active && (s.state.Until == nil || s.at.Before(*s.state.Until))
}

// Allow reports whether jobType may run under this snapshot: nil for a
// safe type; for a blocked or unknown type, nil only while the runtime is
// active, and otherwise a *BlockedError (which matches ErrBlocked) whose
// Reason an operator can read.
func (s *Snapshot) Allow(jobType string) error {
	class := s.policy.Class(jobType)
	if class == ClassSafe || s.Active() || class == ClassUnknown && slices.Contains(s.state.SafeTypes, jobType) {
		return nil
	}
	what := jobType + " is blocked"
	if class == ClassUnknown {
		what = fmt.Sprintf("unknown job type %q is blocked", jobType)
	}
	why := "the runtime is not activated"
	if u := s.state.Until; u != nil {
		// Past the deadline, recorded (inactive, Until kept) or not yet.
		why = "the activation expired at " + u.Format(time.RFC3339Nano)
	}
	return &BlockedError{JobType: jobType, Reason: what + ": " + why}
}
