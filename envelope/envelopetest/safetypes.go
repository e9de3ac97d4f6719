package envelopetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/envelope"
)

// setSafe calls SetSafeTypes and fails the test on an error.
func (f *fixture) setSafe(add, remove []string) envelope.State {
	f.t.Helper()
	prev, err := f.store.State(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	st, before, err := f.g.SetSafeTypes(f.ctx, "alice", "our own job types", add, remove)
	if !cmp.Equal(before, prev.SafeTypes) {
		f.t.Fatalf("SetSafeTypes: the list before = %v, stored %v", before, prev.SafeTypes)
	}
	if err != nil {
		f.t.Fatalf("SetSafeTypes(+%v -%v): %v", add, remove, err)
	}
	return st
}

// testSafeTypes: SetSafeTypes makes unknown types safe at run time, each
// change a version of its own that keeps the activation as it was; the
// store keeps the list (and WasActive) in its state and history, and
// every other change carries the list over. A type the policy blocks can
// never be made safe, a policy safe type cannot be removed, and a bad
// change is refused with nothing stored.
func testSafeTypes(t *testing.T, f *fixture) {
	allowed(t, f.snapshot(), "eval_run", false)
	st := f.setSafe([]string{"eval_run", "gpu_probe", "status_check"}, nil)
	want := []string{"eval_run", "gpu_probe"} // status_check is safe already
	if st.Version != envelope.InitialVersion+1 || st.Active || !cmp.Equal(st.SafeTypes, want) {
		t.Fatalf("after adding: %+v", st)
	}
	f.stored(st)
	s := f.snapshot()
	allowed(t, s, "eval_run", true)
	allowed(t, s, "gpu_probe", true)
	allowed(t, s, "lora_train", false)
	allowed(t, s, "other", false)
	if c := s.Class("eval_run"); c != envelope.ClassSafe {
		t.Fatalf("Class(eval_run) = %s, want safe", c)
	}
	if got := s.SafeTypes(); !cmp.Equal(got, append(envelope.SafeTypes(), want...)) {
		t.Fatalf("Snapshot.SafeTypes = %v", got)
	}

	// An activation carries the list over; a safe-types change keeps the
	// activation and its deadline.
	until := start.Add(time.Hour)
	act := f.activate("bob", "night run", &until)
	if !cmp.Equal(act.SafeTypes, want) {
		t.Fatalf("the activation dropped the safe types: %+v", act)
	}
	st = f.setSafe(nil, []string{"gpu_probe"})
	if !st.Active || st.Until == nil || !st.Until.Equal(until) || !cmp.Equal(st.SafeTypes, []string{"eval_run"}) || st.By != "alice" {
		t.Fatalf("a safe-types change while active: %+v", st)
	}
	f.stored(st)
	allowed(t, f.snapshot(), "lora_train", true)
	de := f.deactivate("bob", "done")
	if !cmp.Equal(de.SafeTypes, []string{"eval_run"}) {
		t.Fatalf("the deactivation dropped the safe types: %+v", de)
	}
	s = f.snapshot()
	allowed(t, s, "eval_run", true)
	allowed(t, s, "gpu_probe", false)
	allowed(t, s, "lora_train", false)
	st = f.setSafe(nil, []string{"eval_run", "never_added"})
	if st.SafeTypes != nil || st.Active {
		t.Fatalf("after removing every one: %+v", st)
	}
	f.stored(st)

	// The history keeps each list and whether the runtime was active.
	hist := f.history(0, 100)
	if len(hist) != 5 {
		t.Fatalf("history has %d records, want 5", len(hist))
	}
	for i, c := range []struct {
		action    envelope.Action
		safe      []string
		wasActive bool
	}{
		{envelope.ActionSafeTypes, want, false},
		{envelope.ActionActivate, want, false},
		{envelope.ActionSafeTypes, []string{"eval_run"}, true},
		{envelope.ActionDeactivate, []string{"eval_run"}, false},
		{envelope.ActionSafeTypes, nil, false},
	} {
		r := hist[i]
		if r.Action != c.action || !cmp.Equal(r.SafeTypes, c.safe) || r.WasActive != c.wasActive {
			t.Errorf("history[%d] = %+v, want %s with %v (was active %v)", i, r, c.action, c.safe, c.wasActive)
		}
	}
	if got := hist[2].State(); !got.Active || !cmp.Equal(got.SafeTypes, []string{"eval_run"}) {
		t.Errorf("the state of a safe-types change while active: %+v", got)
	}

	// Refusals: nothing is stored.
	before, err := f.store.State(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, envelope.MaxSafeTypesChange+1)
	for i := range many {
		many[i] = "t" + strings.Repeat("x", i+1)
	}
	for _, c := range []struct {
		name        string
		by, reason  string
		add, remove []string
		blocked     string
	}{
		{"a canonical blocked type", "alice", "r", []string{"eval_run", "raw_training"}, nil, "raw_training"},
		{"model_file_write", "alice", "r", []string{"model_file_write"}, nil, "model_file_write"},
		{"lora_train", "alice", "r", []string{"lora_train"}, nil, "lora_train"},
		{"a canonical safe type removed", "alice", "r", nil, []string{"status_check"}, ""},
		{"nothing", "alice", "r", nil, nil, ""},
		{"too many", "alice", "r", many, nil, ""},
		{"twice", "alice", "r", []string{"a"}, []string{"a"}, ""},
		{"empty type", "alice", "r", []string{""}, nil, ""},
		{"a space", "alice", "r", []string{"a b"}, nil, ""},
		{"a control character", "alice", "r", []string{"a\x01"}, nil, ""},
		{"too long", "alice", "r", []string{strings.Repeat("a", 129)}, nil, ""},
		{"no reason", "alice", " ", []string{"eval_run"}, nil, ""},
		{"no by", "", "r", []string{"eval_run"}, nil, ""},
	} {
		_, _, err := f.g.SetSafeTypes(f.ctx, c.by, c.reason, c.add, c.remove)
		wantErr(t, "SetSafeTypes: "+c.name, err, envelope.ErrInvalidArgument)
		var ne *envelope.NotSafeableError
		if got := errors.As(err, &ne); got != (c.blocked != "") || got && ne.JobType != c.blocked {
			t.Errorf("SetSafeTypes: %s: err %v, want a NotSafeableError naming %q", c.name, err, c.blocked)
		}
	}
	f.stored(before)

	// A host's extra blocked type cannot be made safe either; its extra
	// safe ones are safe already.
	g := f.gate(f.store, &envelope.Config{ExtraBlocked: []string{"gpu_burn"}, ExtraSafe: []string{"host_probe"}})
	_, _, err = g.SetSafeTypes(f.ctx, "alice", "r", []string{"gpu_burn"}, nil)
	var ne *envelope.NotSafeableError
	if !errors.As(err, &ne) || ne.JobType != "gpu_burn" {
		t.Fatalf("SetSafeTypes(an extra blocked type) = %v", err)
	}
	if _, _, err := g.SetSafeTypes(f.ctx, "alice", "r", nil, []string{"host_probe"}); !errors.Is(err, envelope.ErrInvalidArgument) {
		t.Fatalf("SetSafeTypes(remove an extra safe type) = %v", err)
	}
	f.stored(before)
}
