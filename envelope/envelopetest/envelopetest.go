// Package envelopetest is the conformance suite that every envelope.Store
// must pass. An adapter's test calls Run with a function that returns a
// new store in the initial state:
//
//	func TestEnvelopeStore(t *testing.T) {
//		envelopetest.Run(t, func(t *testing.T) envelope.Store { return newEmptyStore(t) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite drives the store through envelope.Gate, so it checks the envelope
// end to end on that store: classes of job types, activation, deadlines
// (lazy and recorded), the policy version and history, exact timestamps,
// the job types an operator makes safe at run time (safetypes.go), and
// concurrent changes from two Gates. An adapter whose replicas open
// separate handles on one database also calls RunShared with two of them.
package envelopetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/testclock"
)

// epoch has a nanosecond part so that stores that fail to truncate or to
// round-trip microseconds are caught; start is what the Gate makes of it.
var (
	epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)
	start = epoch.Truncate(time.Microsecond)
)

// concurrency is how many goroutines change the envelope at once.
const concurrency = 16

type fixture struct {
	t     *testing.T
	ctx   context.Context
	store envelope.Store
	clock *testclock.Clock
	g     *envelope.Gate
}

func newFixture(t *testing.T, newStore func(t *testing.T) envelope.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), store: newStore(t), clock: testclock.New(epoch)}
	f.g = f.gate(f.store, nil)
	return f
}

// gate returns a Gate over s on the fixture's clock; cfg may be nil.
func (f *fixture) gate(s envelope.Store, cfg *envelope.Config) *envelope.Gate {
	f.t.Helper()
	var c envelope.Config
	if cfg != nil {
		c = *cfg
	}
	c.Now = f.clock.Now
	g, err := envelope.NewGate(s, &c)
	if err != nil {
		f.t.Fatalf("NewGate: %v", err)
	}
	return g
}

func (f *fixture) snapshot() *envelope.Snapshot {
	f.t.Helper()
	s, err := f.g.Snapshot(f.ctx)
	if err != nil {
		f.t.Fatalf("Snapshot: %v", err)
	}
	return s
}

func (f *fixture) activate(by, reason string, until *time.Time) envelope.State {
	f.t.Helper()
	st, err := f.g.Activate(f.ctx, by, reason, until)
	if err != nil {
		f.t.Fatalf("Activate(%s): %v", by, err)
	}
	return st
}

func (f *fixture) deactivate(by, reason string) envelope.State {
	f.t.Helper()
	st, err := f.g.Deactivate(f.ctx, by, reason)
	if err != nil {
		f.t.Fatalf("Deactivate(%s): %v", by, err)
	}
	return st
}

func (f *fixture) expire(want bool) {
	f.t.Helper()
	_, changed, err := f.g.ExpireActivation(f.ctx)
	if err != nil {
		f.t.Fatalf("ExpireActivation: %v", err)
	}
	if changed != want {
		f.t.Fatalf("ExpireActivation changed = %v, want %v", changed, want)
	}
}

func (f *fixture) history(after int64, limit int) []envelope.Record {
	f.t.Helper()
	rs, err := f.g.History(f.ctx, after, limit)
	if err != nil {
		f.t.Fatalf("History(%d, %d): %v", after, limit, err)
	}
	return rs
}

// stored checks that the store holds exactly the state want.
func (f *fixture) stored(want envelope.State) {
	f.t.Helper()
	got, err := f.store.State(f.ctx)
	if err != nil {
		f.t.Fatalf("Store.State: %v", err)
	}
	if d := cmp.Diff(want, got); d != "" {
		f.t.Fatalf("stored state differs (-want +stored):\n%s", d)
	}
}

// allowed checks the answer of Allow(jobType) on s.
func allowed(t *testing.T, s *envelope.Snapshot, jobType string, want bool) {
	t.Helper()
	err := s.Allow(jobType)
	if want && err != nil {
		t.Fatalf("Allow(%s) at %s, version %d = %v, want nil", jobType, s.At().Format(time.RFC3339Nano), s.Version(), err)
	}
	if !want {
		var be *envelope.BlockedError
		if !errors.As(err, &be) || !errors.Is(err, envelope.ErrBlocked) {
			t.Fatalf("Allow(%s) at %s, version %d = %v, want a *BlockedError", jobType, s.At().Format(time.RFC3339Nano), s.Version(), err)
		}
		if be.JobType != jobType || be.Reason == "" {
			t.Fatalf("Allow(%s) = %+v", jobType, be)
		}
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// exact checks that a stored time is want to the microsecond, in UTC.
func exact(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) || got.Location() != time.UTC || got.Nanosecond()%1000 != 0 {
		t.Fatalf("%s = %s (%s), want %s UTC", what, got.Format(time.RFC3339Nano), got.Location(), want.Format(time.RFC3339Nano))
	}
}

func ptr(t time.Time) *time.Time { return &t }

// Run runs the conformance suite against stores made by newStore. Each
// subtest gets its own store and runs in parallel with the others, so
// newStore is called concurrently, from parallel subtests, and must
// return independent stores: a change made in one must never show in
// another.
func Run(t *testing.T, newStore func(t *testing.T) envelope.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"InitialState", testInitialState},
		{"Classes", testClasses},
		{"ExtensionSets", testExtensionSets},
		{"ActivateDeactivate", testActivateDeactivate},
		{"UntilBoundary", testUntilBoundary},
		{"LazyExpiry", testLazyExpiry},
		{"ExpireActivation", testExpireActivation},
		{"Reactivate", testReactivate},
		{"SnapshotIsPure", testSnapshotIsPure},
		{"VersionMonotonic", testVersionMonotonic},
		{"History", testHistory},
		{"Timestamps", testTimestamps},
		{"BlockedErrors", testBlockedErrors},
		{"InvalidArguments", testInvalidArguments},
		{"StoreApply", testStoreApply},
		{"StoreLimits", testStoreLimits},
		{"TextRoundTrip", testTextRoundTrip},
		{"SafeTypes", testSafeTypes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newFixture(t, newStore))
		})
	}
	t.Run("Shared", func(t *testing.T) {
		t.Parallel()
		RunShared(t, func(t *testing.T) (envelope.Store, envelope.Store) {
			s := newStore(t)
			return s, s
		})
	})
}

// RunShared runs the concurrency cases against two stores over one
// database, as two replicas' would be (Run passes one store twice). Each
// subtest gets its own pair and runs in parallel with the others, so
// newStores is called concurrently and must return a pair over a database
// of its own each time.
func RunShared(t *testing.T, newStores func(t *testing.T) (a, b envelope.Store)) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture, gates [2]*envelope.Gate)
	}{
		{"ConcurrentActivations", testConcurrentActivations},
		{"ConcurrentExpiry", testConcurrentExpiry},
		{"ConcurrentMixed", testConcurrentMixed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := newStores(t)
			f := newFixture(t, func(*testing.T) envelope.Store { return a })
			tc.fn(t, f, [2]*envelope.Gate{f.gate(yielding{a}, nil), f.gate(yielding{b}, nil)})
		})
	}
}

// yielding is a Store that pauses after each read of the state, so that
// concurrent Gates read the same version and race to write the next one,
// as replicas do, even on a store as fast as memory. The pause stands for
// a replica's round trip to its database: it is the behaviour the
// concurrency cases need, not a wait for an event.
type yielding struct{ envelope.Store }

func (y yielding) State(ctx context.Context) (envelope.State, error) {
	st, err := y.Store.State(ctx)
	runtime.Gosched()
	time.Sleep(200 * time.Microsecond)
	return st, err
}

func testInitialState(t *testing.T, f *fixture) {
	want := envelope.State{Version: 1}
	if d := cmp.Diff(want, envelope.InitialState()); d != "" {
		t.Fatalf("InitialState (-want +got):\n%s", d)
	}
	f.stored(want)
	s := f.snapshot()
	if s.Version() != 1 || s.Active() {
		t.Fatalf("initial snapshot: version %d, active %v", s.Version(), s.Active())
	}
	if d := cmp.Diff(want, s.State()); d != "" {
		t.Fatalf("initial snapshot state (-want +got):\n%s", d)
	}
	exact(t, "snapshot time", s.At(), start)
	if rs := f.history(0, 0); len(rs) != 0 {
		t.Fatalf("initial history = %v, want none", rs)
	}
	f.expire(false)
	f.stored(want)
}

func testClasses(t *testing.T, f *fixture) {
	tests := []struct {
		typ   string
		class envelope.Class
	}{
		{"status_check", envelope.ClassSafe},
		{"telemetry_sync", envelope.ClassSafe},
		{"dataset_prepare_dry_run", envelope.ClassSafe},
		{"embedding_dry_run", envelope.ClassSafe},
		{"teacher_write_confirmed", envelope.ClassBlocked},
		{"raw_training", envelope.ClassBlocked},
		{"lora_train", envelope.ClassBlocked},
		{"auto_promotion", envelope.ClassBlocked},
		{"dataset_mutation", envelope.ClassBlocked},
		{"model_file_write", envelope.ClassBlocked},
		{"public_inbound_listener", envelope.ClassBlocked},
		{"gpu_burn", envelope.ClassUnknown},
		{"", envelope.ClassUnknown},
		{"Status_Check", envelope.ClassUnknown},
		{"status_check ", envelope.ClassUnknown},
	}
	inactive := f.snapshot()
	f.activate("alice", "test run", nil)
	active := f.snapshot()
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.typ), func(t *testing.T) {
			if got := f.g.Policy().Class(tc.typ); got != tc.class {
				t.Fatalf("Class = %s, want %s", got, tc.class)
			}
			allowed(t, inactive, tc.typ, tc.class == envelope.ClassSafe)
			allowed(t, active, tc.typ, true)
		})
	}
	if d := cmp.Diff(envelope.SafeTypes(), f.g.Policy().SafeTypes()); d != "" {
		t.Errorf("Policy.SafeTypes (-canonical +got):\n%s", d)
	}
	if d := cmp.Diff(envelope.BlockedTypes(), f.g.Policy().BlockedTypes()); d != "" {
		t.Errorf("Policy.BlockedTypes (-canonical +got):\n%s", d)
	}
	// The canonical lists are fresh copies: changing one changes nothing.
	envelope.SafeTypes()[0] = "lora_train"
	envelope.BlockedTypes()[2] = "status_check"
	f.g.Policy().SafeTypes()[0] = "lora_train"
	if c := f.g.Policy().Class("lora_train"); c != envelope.ClassBlocked {
		t.Fatalf("after changing returned lists, lora_train is %s", c)
	}
	if got := envelope.SafeTypes()[0]; got != "status_check" {
		t.Fatalf("SafeTypes()[0] = %s after a caller changed its copy", got)
	}
}

func testExtensionSets(t *testing.T, f *fixture) {
	g := f.gate(f.store, &envelope.Config{
		ExtraSafe:    []string{"gpu_probe", "gpu_probe", "status_check"},
		ExtraBlocked: []string{"gpu_burn", "lora_train"},
	})
	p := g.Policy()
	wantSafe := append(envelope.SafeTypes(), "gpu_probe")
	if d := cmp.Diff(wantSafe, p.SafeTypes()); d != "" {
		t.Errorf("SafeTypes (-want +got):\n%s", d)
	}
	wantBlocked := append(envelope.BlockedTypes(), "gpu_burn")
	if d := cmp.Diff(wantBlocked, p.BlockedTypes()); d != "" {
		t.Errorf("BlockedTypes (-want +got):\n%s", d)
	}
	s, err := g.Snapshot(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	allowed(t, s, "gpu_probe", true)
	allowed(t, s, "gpu_burn", false)
	if err := s.Allow("gpu_burn"); strings.Contains(err.Error(), "unknown") {
		t.Errorf("an extra blocked type is refused as unknown: %v", err)
	}
	if c := p.Class("gpu_burn"); c != envelope.ClassBlocked {
		t.Errorf("gpu_burn is %s", c)
	}
	// The default Gate does not know the host's types.
	if c := f.g.Policy().Class("gpu_probe"); c != envelope.ClassUnknown {
		t.Errorf("default Gate: gpu_probe is %s", c)
	}

	bad := []struct {
		name string
		cfg  envelope.Config
	}{
		{"same type in both", envelope.Config{ExtraSafe: []string{"gpu_x"}, ExtraBlocked: []string{"gpu_x"}}},
		{"canonical blocked made safe", envelope.Config{ExtraSafe: []string{"lora_train"}}},
		{"canonical safe made blocked", envelope.Config{ExtraBlocked: []string{"status_check"}}},
		{"empty safe type", envelope.Config{ExtraSafe: []string{""}}},
		{"empty blocked type", envelope.Config{ExtraBlocked: []string{""}}},
		{"long type", envelope.Config{ExtraSafe: []string{strings.Repeat("a", 129)}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			g, err := envelope.NewGate(f.store, &tc.cfg)
			if g != nil || !errors.Is(err, envelope.ErrInvalidArgument) {
				t.Fatalf("NewGate = %v, %v; want ErrInvalidArgument", g, err)
			}
		})
	}
	t.Run("nil store", func(t *testing.T) {
		_, err := envelope.NewGate(nil, nil)
		wantErr(t, "NewGate(nil)", err, envelope.ErrInvalidArgument)
	})
	t.Run("nil config", func(t *testing.T) {
		if _, err := envelope.NewGate(f.store, nil); err != nil {
			t.Fatalf("NewGate(store, nil): %v", err)
		}
	})
}

func testActivateDeactivate(t *testing.T, f *fixture) {
	allowed(t, f.snapshot(), "lora_train", false)
	f.clock.Advance(time.Minute)
	st := f.activate("alice", "nightly LoRA run", nil)
	want := envelope.State{Version: 2, Active: true, By: "alice", Reason: "nightly LoRA run", ChangedAt: start.Add(time.Minute)}
	if d := cmp.Diff(want, st); d != "" {
		t.Fatalf("Activate (-want +got):\n%s", d)
	}
	f.stored(want)
	s := f.snapshot()
	if !s.Active() || s.Version() != 2 {
		t.Fatalf("after Activate: active %v version %d", s.Active(), s.Version())
	}
	for _, typ := range []string{"lora_train", "raw_training", "gpu_burn", "status_check"} {
		allowed(t, s, typ, true)
		if err := f.g.Allow(f.ctx, typ); err != nil {
			t.Fatalf("Gate.Allow(%s) = %v", typ, err)
		}
	}
	// Without a deadline the activation lasts.
	f.clock.Advance(365 * 24 * time.Hour)
	allowed(t, f.snapshot(), "lora_train", true)
	f.expire(false)

	st = f.deactivate("bob", "run finished")
	want = envelope.State{Version: 3, By: "bob", Reason: "run finished", ChangedAt: start.Add(time.Minute + 365*24*time.Hour)}
	if d := cmp.Diff(want, st); d != "" {
		t.Fatalf("Deactivate (-want +got):\n%s", d)
	}
	f.stored(want)
	s = f.snapshot()
	if s.Active() || s.Version() != 3 {
		t.Fatalf("after Deactivate: active %v version %d", s.Active(), s.Version())
	}
	allowed(t, s, "lora_train", false)
	allowed(t, s, "gpu_burn", false)
	allowed(t, s, "status_check", true)
	wantErr(t, "Gate.Allow(lora_train)", f.g.Allow(f.ctx, "lora_train"), envelope.ErrBlocked)

	// Deactivating an inactive runtime is a change of its own.
	st = f.deactivate("bob", "making sure")
	if st.Version != 4 || st.Active {
		t.Fatalf("second Deactivate = %+v", st)
	}
	f.stored(st)
}

func testUntilBoundary(t *testing.T, f *fixture) {
	until := start.Add(time.Hour)
	st := f.activate("alice", "one hour", ptr(until))
	if st.Until == nil || !st.Until.Equal(until) {
		t.Fatalf("Activate until = %v, want %s", st.Until, until)
	}
	tests := []struct {
		name string
		at   time.Time
		want bool
	}{
		{"activation time", start, true},
		{"a microsecond before", until.Add(-time.Microsecond), true},
		{"at the deadline", until, false},
		{"a microsecond after", until.Add(time.Microsecond), false},
		{"much later", until.Add(30 * 24 * time.Hour), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.clock.Set(tc.at)
			s := f.snapshot()
			if s.Active() != tc.want {
				t.Fatalf("Active() at %s = %v, want %v", tc.at.Format(time.RFC3339Nano), s.Active(), tc.want)
			}
			allowed(t, s, "lora_train", tc.want)
			allowed(t, s, "gpu_burn", tc.want)
			allowed(t, s, "status_check", true)
			if err := f.g.Allow(f.ctx, "lora_train"); (err == nil) != tc.want {
				t.Fatalf("Gate.Allow(lora_train) = %v, want allowed %v", err, tc.want)
			}
		})
	}
}

func testLazyExpiry(t *testing.T, f *fixture) {
	until := start.Add(10 * time.Minute)
	st := f.activate("alice", "short run", ptr(until))
	f.clock.Set(until.Add(time.Minute))
	// Nobody has called ExpireActivation: the store still says active, yet
	// nothing blocked runs, and the version is unchanged.
	f.stored(st)
	s := f.snapshot()
	if s.Active() || !s.State().Active || s.Version() != 2 {
		t.Fatalf("past the deadline: Active() %v, stored active %v, version %d", s.Active(), s.State().Active, s.Version())
	}
	allowed(t, s, "lora_train", false)
	err := s.Allow("lora_train")
	if !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Allow past the deadline = %v, want it to say the activation expired", err)
	}
	if rs := f.history(0, 0); len(rs) != 1 {
		t.Fatalf("history = %v, want only the activation", rs)
	}
}

func testExpireActivation(t *testing.T, f *fixture) {
	// Nothing to expire: inactive, then active without a deadline.
	f.expire(false)
	f.activate("alice", "open ended", nil)
	f.expire(false)
	f.deactivate("alice", "done")

	until := start.Add(time.Hour)
	act := f.activate("bob", "timed", ptr(until))
	f.clock.Set(until.Add(-time.Microsecond))
	f.expire(false) // before the deadline
	f.stored(act)

	f.clock.Set(until.Add(5 * time.Second))
	f.expire(true)
	want := envelope.State{Version: act.Version + 1, Reason: "activation by bob expired", Until: ptr(until), ChangedAt: until.Add(5 * time.Second)}
	f.stored(want)
	rs := f.history(act.Version, 0)
	wantRec := envelope.Record{Version: act.Version + 1, Action: envelope.ActionExpire, Reason: "activation by bob expired", Until: ptr(until), At: until.Add(5 * time.Second)}
	if d := cmp.Diff([]envelope.Record{wantRec}, rs); d != "" {
		t.Fatalf("history after expiry (-want +got):\n%s", d)
	}
	s := f.snapshot()
	allowed(t, s, "lora_train", false)
	if err := s.Allow("lora_train"); !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("Allow after a recorded expiry = %v, want it to say when the activation expired", err)
	}

	// Once only.
	f.clock.Advance(time.Hour)
	f.expire(false)
	f.expire(false)
	f.stored(want)

	// Exactly at the deadline counts as expired.
	until2 := f.clock.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)
	f.activate("carol", "one minute", ptr(until2))
	f.clock.Set(until2)
	f.expire(true)
	if s := f.snapshot(); s.State().Active || s.Version() != want.Version+2 {
		t.Fatalf("after the second expiry: %+v", s.State())
	}
}

func testReactivate(t *testing.T, f *fixture) {
	f.activate("alice", "an hour", ptr(start.Add(time.Hour)))
	f.clock.Advance(time.Minute)
	// Activating again replaces the deadline: here, with none.
	st := f.activate("bob", "open ended", nil)
	if st.Version != 3 || st.Until != nil || st.By != "bob" {
		t.Fatalf("reactivation = %+v", st)
	}
	f.clock.Advance(2 * time.Hour)
	allowed(t, f.snapshot(), "lora_train", true)
	f.expire(false)
	// And the other way: a deadline on an open activation.
	until := f.clock.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)
	f.activate("carol", "one more minute", ptr(until))
	f.clock.Set(until)
	allowed(t, f.snapshot(), "lora_train", false)
	f.expire(true)
}

func testSnapshotIsPure(t *testing.T, f *fixture) {
	before := f.snapshot()
	f.activate("alice", "run", ptr(start.Add(time.Hour)))
	allowed(t, before, "lora_train", false)
	if before.Version() != 1 {
		t.Fatalf("old snapshot version = %d", before.Version())
	}
	during := f.snapshot()
	f.deactivate("bob", "stop")
	f.clock.Advance(2 * time.Hour)
	// The snapshot keeps its own time and state.
	allowed(t, during, "lora_train", true)
	if !during.Active() || during.Version() != 2 {
		t.Fatalf("snapshot taken while active: active %v version %d", during.Active(), during.Version())
	}
	exact(t, "snapshot time", during.At(), start)
	// Changing what State returns does not change the snapshot.
	st := during.State()
	*st.Until = start
	allowed(t, during, "lora_train", true)
}

func testVersionMonotonic(t *testing.T, f *fixture) {
	version := int64(1)
	step := func(what string, op func(), bump bool) {
		t.Helper()
		op()
		if bump {
			version++
		}
		if got := f.snapshot().Version(); got != version {
			t.Fatalf("after %s: version %d, want %d", what, got, version)
		}
	}
	until := start.Add(time.Hour)
	step("activate", func() { f.activate("a", "r", nil) }, true)
	step("activate again", func() { f.activate("a", "r", ptr(until)) }, true)
	step("expire before the deadline", func() { f.expire(false) }, false)
	step("lazy expiry", func() { f.clock.Set(until) }, false)
	step("expire", func() { f.expire(true) }, true)
	step("expire again", func() { f.expire(false) }, false)
	step("deactivate", func() { f.deactivate("a", "r") }, true)
	step("deactivate again", func() { f.deactivate("a", "r") }, true)
	step("failed activate", func() {
		if _, err := f.g.Activate(f.ctx, "", "r", nil); err == nil {
			t.Fatal("Activate without by succeeded")
		}
	}, false)
	step("history read", func() { f.history(0, 0) }, false)
}

func testHistory(t *testing.T, f *fixture) {
	at := func(d time.Duration) time.Time { return start.Add(d) }
	f.activate("alice", "nightly", ptr(at(2*time.Hour)))
	f.clock.Set(at(time.Minute))
	f.deactivate("bob", "done early")
	f.clock.Set(at(2 * time.Minute))
	f.activate("carol", "short", ptr(at(3*time.Minute)))
	f.clock.Set(at(3 * time.Minute))
	f.expire(true)
	f.clock.Set(at(4 * time.Minute))
	f.deactivate("dave", "cleanup")
	f.clock.Set(at(5 * time.Minute))
	last := f.activate("erin", "open ended", nil)

	want := []envelope.Record{
		{Version: 2, Action: envelope.ActionActivate, By: "alice", Reason: "nightly", Until: ptr(at(2 * time.Hour)), At: at(0)},
		{Version: 3, Action: envelope.ActionDeactivate, By: "bob", Reason: "done early", At: at(time.Minute)},
		{Version: 4, Action: envelope.ActionActivate, By: "carol", Reason: "short", Until: ptr(at(3 * time.Minute)), At: at(2 * time.Minute)},
		{Version: 5, Action: envelope.ActionExpire, Reason: "activation by carol expired", Until: ptr(at(3 * time.Minute)), At: at(3 * time.Minute)},
		{Version: 6, Action: envelope.ActionDeactivate, By: "dave", Reason: "cleanup", At: at(4 * time.Minute)},
		{Version: 7, Action: envelope.ActionActivate, By: "erin", Reason: "open ended", At: at(5 * time.Minute)},
	}
	if d := cmp.Diff(want, f.history(0, 0)); d != "" {
		t.Fatalf("History(0, 0) (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want[len(want)-1].State(), last); d != "" {
		t.Fatalf("the last record's state differs from what Activate returned (-record +returned):\n%s", d)
	}
	f.stored(last)
	pages := []struct {
		after int64
		limit int
		want  []envelope.Record
	}{
		{0, 1, want[:1]},
		{3, 2, want[2:4]},
		{1, 100, want},
		{5, 0, want[4:]},
		{6, 1, want[5:]},
		{7, 0, nil},
		{100, 10, nil},
	}
	for _, p := range pages {
		t.Run(fmt.Sprintf("after %d limit %d", p.after, p.limit), func(t *testing.T) {
			if d := cmp.Diff(p.want, f.history(p.after, p.limit), cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
	// The store pages the same way the Gate asks it to.
	got, err := f.store.History(f.ctx, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want[1:4], got); d != "" {
		t.Fatalf("Store.History(2, 3) (-want +got):\n%s", d)
	}
	got, err = f.store.History(f.ctx, 0, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Store.History(0, %d) (-want +got):\n%s", len(want), d)
	}
}

func testTimestamps(t *testing.T, f *fixture) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	until := time.Date(2026, 11, 30, 20, 30, 0, 987654321, zone) // 15:00:00.987654321Z
	reason := "nightly 'LoRA' run — ünïcode, \"quotes\"; DROP TABLE x; --"
	st := f.activate("ops@example.com", reason, &until)
	exact(t, "ChangedAt", st.ChangedAt, start)
	exact(t, "Until", *st.Until, until.UTC().Truncate(time.Microsecond))

	got, err := f.store.State(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	exact(t, "stored ChangedAt", got.ChangedAt, st.ChangedAt)
	exact(t, "stored Until", *got.Until, *st.Until)
	if got.Reason != reason || got.By != "ops@example.com" {
		t.Fatalf("stored by %q reason %q", got.By, got.Reason)
	}
	rs := f.history(0, 0)
	if len(rs) != 1 {
		t.Fatalf("history = %v", rs)
	}
	exact(t, "record At", rs[0].At, st.ChangedAt)
	exact(t, "record Until", *rs[0].Until, *st.Until)
	if rs[0].Reason != reason {
		t.Fatalf("record reason %q", rs[0].Reason)
	}

	// A deadline one microsecond after now is in the future; the
	// nanoseconds below a microsecond do not count.
	f.clock.Set(epoch.Add(time.Hour))
	now := epoch.Add(time.Hour).Truncate(time.Microsecond)
	st = f.activate("a", "r", ptr(now.Add(time.Microsecond)))
	exact(t, "Until", *st.Until, now.Add(time.Microsecond))
	_, err = f.g.Activate(f.ctx, "a", "r", ptr(now.Add(999*time.Nanosecond)))
	wantErr(t, "Activate until within the current microsecond", err, envelope.ErrInvalidArgument)

	// Times far from now round-trip too.
	f.clock.Set(time.Date(2262, 1, 1, 0, 0, 0, 1000, time.UTC))
	st = f.deactivate("a", "far future")
	f.stored(st)
	exact(t, "far ChangedAt", st.ChangedAt, time.Date(2262, 1, 1, 0, 0, 0, 1000, time.UTC))
}

func testBlockedErrors(t *testing.T, f *fixture) {
	until := start.Add(time.Hour)
	tests := []struct {
		name   string
		setup  func()
		typ    string
		reason string
	}{
		{"blocked, inactive", func() {}, "lora_train", "lora_train is blocked: the runtime is not activated"},
		{"unknown, inactive", func() {}, "gpu burn", `unknown job type "gpu burn" is blocked: the runtime is not activated`},
		{"blocked, past the deadline", func() {
			f.activate("alice", "run", ptr(until))
			f.clock.Set(until)
		}, "raw_training", "raw_training is blocked: the activation expired at 2026-11-30T10:00:00.123456Z"},
		{"unknown, expiry recorded", func() { f.expire(true) }, "x", `unknown job type "x" is blocked: the activation expired at 2026-11-30T10:00:00.123456Z`},
		{"blocked, deactivated", func() {
			f.activate("alice", "run", nil)
			f.deactivate("bob", "stop")
		}, "lora_train", "lora_train is blocked: the runtime is not activated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			err := f.g.Allow(f.ctx, tc.typ)
			var be *envelope.BlockedError
			if !errors.As(err, &be) {
				t.Fatalf("Allow(%s) = %v, want a *BlockedError", tc.typ, err)
			}
			if !errors.Is(err, envelope.ErrBlocked) || errors.Is(err, envelope.ErrInvalidArgument) {
				t.Fatalf("errors.Is misreports %v", err)
			}
			if be.JobType != tc.typ || be.Reason != tc.reason {
				t.Fatalf("BlockedError = {%q, %q}, want {%q, %q}", be.JobType, be.Reason, tc.typ, tc.reason)
			}
			if err.Error() != "envelope: "+tc.reason {
				t.Fatalf("Error() = %q", err.Error())
			}
			if wrapped := fmt.Errorf("accept: %w", err); !errors.Is(wrapped, envelope.ErrBlocked) {
				t.Fatal("a wrapped BlockedError does not match ErrBlocked")
			}
		})
	}
}

func testInvalidArguments(t *testing.T, f *fixture) {
	past := start.Add(-time.Second)
	tests := []struct {
		name string
		call func() error
	}{
		{"activate without by", func() error { _, err := f.g.Activate(f.ctx, "", "r", nil); return err }},
		{"activate with blank by", func() error { _, err := f.g.Activate(f.ctx, " \t", "r", nil); return err }},
		{"activate without reason", func() error { _, err := f.g.Activate(f.ctx, "a", "", nil); return err }},
		{"activate with blank reason", func() error { _, err := f.g.Activate(f.ctx, "a", "\n", nil); return err }},
		{"activate with a long by", func() error { _, err := f.g.Activate(f.ctx, strings.Repeat("a", 257), "r", nil); return err }},
		{"activate with a long reason", func() error {
			_, err := f.g.Activate(f.ctx, "a", strings.Repeat("r", 1025), nil)
			return err
		}},
		{"activate with a reason not UTF-8", func() error { _, err := f.g.Activate(f.ctx, "a", "bad \xff", nil); return err }},
		{"activate with a reason holding NUL", func() error { _, err := f.g.Activate(f.ctx, "a", "nul \x00", nil); return err }},
		{"activate by a name holding NUL", func() error { _, err := f.g.Activate(f.ctx, "a\x00b", "r", nil); return err }},
		{"deactivate by a name not UTF-8", func() error { _, err := f.g.Deactivate(f.ctx, "\xc3", "r"); return err }},
		{"activate until now", func() error { _, err := f.g.Activate(f.ctx, "a", "r", ptr(epoch)); return err }},
		{"activate until the past", func() error { _, err := f.g.Activate(f.ctx, "a", "r", &past); return err }},
		{"activate until the zero time", func() error { _, err := f.g.Activate(f.ctx, "a", "r", &time.Time{}); return err }},
		{"deactivate without by", func() error { _, err := f.g.Deactivate(f.ctx, "", "r"); return err }},
		{"deactivate without reason", func() error { _, err := f.g.Deactivate(f.ctx, "a", ""); return err }},
		{"history after a negative version", func() error { _, err := f.g.History(f.ctx, -1, 0); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.name, tc.call(), envelope.ErrInvalidArgument)
		})
	}
	// Nothing was changed.
	f.stored(envelope.InitialState())
	if rs := f.history(0, 0); len(rs) != 0 {
		t.Fatalf("history after invalid calls = %v", rs)
	}
	// The limits themselves are fine.
	if _, err := f.g.Activate(f.ctx, strings.Repeat("a", 256), strings.Repeat("r", 1024), nil); err != nil {
		t.Fatalf("Activate at the length limits: %v", err)
	}
}

func testStoreApply(t *testing.T, f *fixture) {
	s := f.store
	// A fresh store is at version 1, and only at version 1.
	for _, prev := range []int64{0, 2, 5} {
		rec := envelope.Record{Version: prev + 1, Action: envelope.ActionDeactivate, By: "bob", Reason: "stale", At: start}
		wantErr(t, fmt.Sprintf("Apply(%d) on a fresh store", prev), s.Apply(f.ctx, prev, rec.State(), rec), envelope.ErrConflict)
	}
	f.stored(envelope.InitialState())
	if rs, err := s.History(f.ctx, 0, 100); err != nil || len(rs) != 0 {
		t.Fatalf("History after refused writes = %v, %v", rs, err)
	}

	until := start.Add(time.Hour)
	rec := envelope.Record{Version: 2, Action: envelope.ActionActivate, By: "alice", Reason: "r", Until: &until, At: start}
	st := rec.State()
	st.Until = &until // the state and the record share the caller's time
	if err := s.Apply(f.ctx, 1, st, rec); err != nil {
		t.Fatalf("Apply(1): %v", err)
	}
	f.stored(rec.State())

	// Returned values are copies.
	got, err := s.State(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	*got.Until = start
	rs, err := s.History(f.ctx, 0, 100)
	if err != nil || len(rs) != 1 {
		t.Fatalf("History = %v, %v", rs, err)
	}
	*rs[0].Until = start
	until = start.Add(-time.Hour) // the caller's own copy, too
	want := envelope.Record{Version: 2, Action: envelope.ActionActivate, By: "alice", Reason: "r", Until: ptr(start.Add(time.Hour)), At: start}
	f.stored(want.State())

	// A write at a stale or a future version changes nothing.
	for _, prev := range []int64{1, 3, 0} {
		other := envelope.Record{Version: prev + 1, Action: envelope.ActionDeactivate, By: "bob", Reason: "stale", At: start.Add(time.Minute)}
		wantErr(t, fmt.Sprintf("Apply(%d) at version 2", prev), s.Apply(f.ctx, prev, other.State(), other), envelope.ErrConflict)
	}
	f.stored(want.State())
	rs, err = s.History(f.ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]envelope.Record{want}, rs); d != "" {
		t.Fatalf("history after conflicts (-want +got):\n%s", d)
	}

	next := envelope.Record{Version: 3, Action: envelope.ActionDeactivate, By: "bob", Reason: "stop", At: start.Add(time.Minute)}
	if err := s.Apply(f.ctx, 2, next.State(), next); err != nil {
		t.Fatalf("Apply(2): %v", err)
	}
	f.stored(next.State())
	if rs, err := s.History(f.ctx, 2, 100); err != nil || len(rs) != 1 || rs[0].Version != 3 {
		t.Fatalf("History(2) = %v, %v", rs, err)
	}
}

// testConcurrentActivations: activations from many goroutines on two
// Gates each get a version of their own, consecutive, and none is lost.
func testConcurrentActivations(t *testing.T, f *fixture, gates [2]*envelope.Gate) {
	states := make([]envelope.State, concurrency)
	errs := make([]error, concurrency)
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i := range concurrency {
		wg.Go(func() {
			<-ready
			states[i], errs[i] = gates[i%2].Activate(f.ctx, fmt.Sprintf("op-%02d", i), fmt.Sprintf("reason %d", i), nil)
		})
	}
	close(ready)
	wg.Wait()
	byVersion := map[int64]envelope.State{}
	var versions []int64
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Activate %d: %v", i, err)
		}
		if states[i].By != fmt.Sprintf("op-%02d", i) || !states[i].Active {
			t.Fatalf("Activate %d returned %+v", i, states[i])
		}
		versions = append(versions, states[i].Version)
		byVersion[states[i].Version] = states[i]
	}
	slices.Sort(versions)
	for i, v := range versions {
		if v != int64(i+2) {
			t.Fatalf("versions = %v, want 2 to %d, each once", versions, concurrency+1)
		}
	}
	rs := f.history(0, 0)
	if len(rs) != concurrency {
		t.Fatalf("history has %d records, want %d", len(rs), concurrency)
	}
	for i, r := range rs {
		if r.Version != int64(i+2) || r.Action != envelope.ActionActivate {
			t.Fatalf("record %d = %v", i, r)
		}
		if d := cmp.Diff(byVersion[r.Version], r.State()); d != "" {
			t.Fatalf("record %d differs from the state its Activate returned (-returned +record):\n%s", r.Version, d)
		}
	}
	f.stored(byVersion[int64(concurrency+1)])
	for _, g := range gates {
		s, err := g.Snapshot(f.ctx)
		if err != nil || s.Version() != int64(concurrency+1) {
			t.Fatalf("Snapshot after the race: %v, %v", s, err)
		}
	}
}

// testConcurrentExpiry: many maintainers expiring one activation at once
// record its end exactly once.
func testConcurrentExpiry(t *testing.T, f *fixture, gates [2]*envelope.Gate) {
	until := start.Add(time.Minute)
	act := f.activate("alice", "timed", &until)
	f.clock.Set(until.Add(time.Second))
	changed := make([]bool, concurrency)
	errs := make([]error, concurrency)
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i := range concurrency {
		wg.Go(func() {
			<-ready
			_, changed[i], errs[i] = gates[i%2].ExpireActivation(f.ctx)
		})
	}
	close(ready)
	wg.Wait()
	n := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ExpireActivation %d: %v", i, err)
		}
		if changed[i] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d of %d ExpireActivation calls recorded the expiry, want 1", n, concurrency)
	}
	rs := f.history(act.Version, 0)
	if len(rs) != 1 || rs[0].Action != envelope.ActionExpire || rs[0].Version != act.Version+1 {
		t.Fatalf("history after the expiry = %v", rs)
	}
}

// testConcurrentMixed: activations, deactivations and expiries racing
// each other leave a gapless history whose last record is the state.
func testConcurrentMixed(t *testing.T, f *fixture, gates [2]*envelope.Gate) {
	var wg sync.WaitGroup
	ready := make(chan struct{})
	errs := make([]error, concurrency)
	expired := make([]bool, concurrency)
	for i := range concurrency {
		wg.Go(func() {
			<-ready
			g := gates[i%2]
			switch i % 4 {
			case 0:
				_, errs[i] = g.Activate(f.ctx, "a", "timed", ptr(start.Add(time.Minute)))
			case 1:
				_, errs[i] = g.Deactivate(f.ctx, "d", "stop")
			case 2:
				_, errs[i] = g.Activate(f.ctx, "a", "open", nil)
			case 3:
				f.clock.Advance(20 * time.Second)
				_, expired[i], errs[i] = g.ExpireActivation(f.ctx)
			}
		})
	}
	close(ready)
	wg.Wait()
	for i, err := range errs {
		// An activation whose deadline the racing clock passed is refused.
		if err != nil && !(i%4 == 0 && errors.Is(err, envelope.ErrInvalidArgument)) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	changes := 0
	for i := range concurrency {
		if (i%4 != 3 && errs[i] == nil) || expired[i] {
			changes++
		}
	}
	rs := f.history(0, 0)
	if len(rs) != changes || changes == 0 {
		t.Fatalf("history has %d records, want one per change: %d", len(rs), changes)
	}
	for i, r := range rs {
		if r.Version != int64(i+2) {
			t.Fatalf("history versions have a gap at %d: %v", i, rs)
		}
	}
	s := f.snapshot()
	if d := cmp.Diff(rs[len(rs)-1].State(), s.State()); d != "" {
		t.Fatalf("state differs from the last record (-record +state):\n%s", d)
	}
}

// testStoreLimits: callers always pass History a limit of at least 1, and
// a Store refuses one of 0 or less rather than guess what it means.
func testStoreLimits(t *testing.T, f *fixture) {
	for i := range 3 {
		f.clock.Advance(time.Second)
		f.activate("alice", fmt.Sprint("run ", i), nil)
	}
	for _, limit := range []int{0, -1, -1000} {
		rs, err := f.store.History(f.ctx, 0, limit)
		wantErr(t, fmt.Sprintf("Store.History(0, %d)", limit), err, envelope.ErrInvalidArgument)
		if len(rs) != 0 {
			t.Fatalf("Store.History(0, %d) refused but returned %d records", limit, len(rs))
		}
	}
	for limit, want := range map[int]int{1: 1, 2: 2, 3: 3, 4: 3, 1 << 30: 3} {
		rs, err := f.store.History(f.ctx, 0, limit)
		if err != nil || len(rs) != want {
			t.Fatalf("Store.History(0, %d) = %d records, %v; want %d", limit, len(rs), err, want)
		}
	}
	// The Gate never passes the store a limit below 1.
	if rs := f.history(0, 0); len(rs) != 3 {
		t.Fatalf("Gate.History(0, 0) = %d records, want 3", len(rs))
	}
	if rs := f.history(1, -5); len(rs) != 3 {
		t.Fatalf("Gate.History(1, -5) = %d records, want 3", len(rs))
	}
}

// testTextRoundTrip: who made a change and why come back byte for byte,
// in the state and in the history: no trimming, case folding or Unicode
// normalisation.
func testTextRoundTrip(t *testing.T, f *fixture) {
	texts := []struct{ by, reason string }{
		{"  Alice  ", "  leading and trailing space  "},
		{"ALICE", "e\u0301 and \u00e9: decomposed and precomposed"},
		{"alice@example.com", "tab\there, newline\nthere, \r\n too"},
		{"O'Brien", `quote " and backslash \ and 100% _wild_; DROP TABLE nodelane_envelope; --`},
		{"Ωmega", "🚀 zero\u200bwidth \ufeff BOM"},
		{strings.Repeat("é", 128), strings.Repeat("ü", 512)}, // 256 and 1024 bytes
	}
	var want []envelope.Record
	for i, tc := range texts {
		f.clock.Advance(time.Second)
		var st envelope.State
		if i%2 == 0 {
			st = f.activate(tc.by, tc.reason, nil)
		} else {
			st = f.deactivate(tc.by, tc.reason)
		}
		if st.By != tc.by || st.Reason != tc.reason {
			t.Fatalf("change %d returned by %q reason %q, want %q %q", i, st.By, st.Reason, tc.by, tc.reason)
		}
		f.stored(st)
		want = append(want, envelope.Record{Version: st.Version, Action: map[bool]envelope.Action{true: envelope.ActionActivate, false: envelope.ActionDeactivate}[i%2 == 0],
			By: tc.by, Reason: tc.reason, At: st.ChangedAt})
	}
	got, err := f.store.History(f.ctx, 0, len(texts))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("history (-want +got):\n%s", d)
	}
}
