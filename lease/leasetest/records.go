package leasetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

var recordTests = []test{
	{"SentinelErrors", testSentinels},
	{"Timestamps", testTimestamps},
	{"ListAndPaging", testList},
	{"Workers", testWorkers},
	{"UpdateRevision", testUpdateRevision},
}

func testSentinels(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	_, err := f.m.Get(f.ctx, "job_missing")
	wantErr(t, "get unknown", err, lease.ErrNotFound)
	_, err = f.m.Accept(f.ctx, lease.Ref{JobID: "job_missing", WorkerID: w.ID, Token: ref.Token})
	wantErr(t, "accept unknown job", err, lease.ErrNotFound)
	malformed := map[string]string{
		"empty":         "",
		"wrong prefix":  "nlc_" + ref.Token[4:],
		"bad checksum":  ref.Token[:len(ref.Token)-1] + flip(ref.Token[len(ref.Token)-1]),
		"bad body":      ref.Token[:10] + flip(ref.Token[10]) + ref.Token[11:],
		"short":         ref.Token[:len(ref.Token)-1],
		"long":          ref.Token + "0",
		"not base62":    ref.Token[:10] + "-" + ref.Token[11:],
		"trailing line": ref.Token[:len(ref.Token)-1] + "\n",
	}
	for name, tok := range malformed {
		_, err := f.m.Accept(f.ctx, lease.Ref{JobID: j.ID, WorkerID: w.ID, Token: tok})
		wantErr(t, name, err, lease.ErrMalformedToken)
	}
	f.state(j.ID, lease.StateLeased)
	badJobs := []lease.NewJob{
		{},
		{Type: string(make([]byte, 129))},
		{Type: "x", MaxAttempts: -1},
		{Type: "x", MaxAttempts: 101},
		{Type: "x", Requirements: lease.Requirements{GPUCount: -1}},
		{Type: "x", Payload: json.RawMessage(`{"a":`)},
	}
	for i, nj := range badJobs {
		_, err := f.m.Enqueue(f.ctx, nj)
		wantErr(t, fmt.Sprintf("bad job %d", i), err, lease.ErrInvalidArgument)
	}
	dup := f.enqueue("status_check")
	_, err = f.m.Enqueue(f.ctx, lease.NewJob{ID: dup.ID, Type: "status_check"})
	wantErr(t, "duplicate id", err, lease.ErrConflict)
	_, _, err = f.m.List(f.ctx, lease.JobFilter{State: "bogus"})
	wantErr(t, "list bogus state", err, lease.ErrInvalidArgument)
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

func testTimestamps(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = epoch.Add(time.Nanosecond * 1500) })
	for _, ts := range []time.Time{j.CreatedAt, j.ScheduledAt} {
		if ts.Nanosecond()%1000 != 0 || ts.Location() != time.UTC {
			t.Fatalf("time %v is not UTC microseconds", ts)
		}
	}
	f.same(j)
	lj, ref := f.leaseOne(w)
	f.same(lj)
	f.same(f.accept(ref))
	fj := f.fail(ref, lease.Failure{Code: "c", Retryable: true})
	f.same(fj)
	if !fj.LastError.At.Equal(f.clock.Now().UTC().Truncate(time.Microsecond)) {
		t.Fatalf("last error at %v", fj.LastError.At)
	}
	w2, err := f.m.Worker(f.ctx, w.ID)
	if err != nil || !w2.RegisteredAt.Equal(w.RegisteredAt) || w2.RegisteredAt.Nanosecond()%1000 != 0 {
		t.Fatalf("worker times: %+v, %v", w2, err)
	}
}

func testList(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	var ids []string
	for i := range 7 {
		typ := "status_check"
		if i%2 == 1 {
			typ = "lora_train"
		}
		ids = append(ids, f.enqueue(typ).ID)
	}
	f.leaseOne(w)
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		jobs, next, err := f.m.List(f.ctx, lease.JobFilter{After: after, Limit: 3})
		if err != nil {
			t.Fatalf("List after %q: %v", after, err)
		}
		if pages > 5 {
			t.Fatalf("7 jobs in pages of 3 took more than %d pages", pages)
		}
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if d := cmp.Diff(ids, got); d != "" {
		t.Fatalf("paged list (-want +got):\n%s", d)
	}
	count := func(f2 lease.JobFilter) int {
		jobs, _, err := f.m.List(f.ctx, f2)
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs)
	}
	if n := count(lease.JobFilter{Type: "lora_train"}); n != 3 {
		t.Errorf("lora_train jobs = %d", n)
	}
	if n := count(lease.JobFilter{State: lease.StateLeased}); n != 1 {
		t.Errorf("leased jobs = %d", n)
	}
	if n := count(lease.JobFilter{State: lease.StateQueued, Type: "status_check"}); n != 3 {
		t.Errorf("queued status_check = %d", n)
	}
	if n := count(lease.JobFilter{WorkerID: w.ID}); n != 1 {
		t.Errorf("jobs of the worker = %d", n)
	}
}

func testWorkers(t *testing.T, f *fixture) {
	w := f.worker("node-a", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check"}, lease.Governor{MaxJobs: 2, MaxVRAMMB: 20000})
	f.clock.Advance(time.Minute)
	w.Tags = []string{"lab"}
	w2, err := f.m.RegisterWorker(f.ctx, w)
	if err != nil || w2.ID != w.ID || !w2.RegisteredAt.Equal(w.RegisteredAt) || !w2.LastSeenAt.After(w.LastSeenAt) {
		t.Fatalf("re-register = %+v, %v", w2, err)
	}
	got, err := f.m.WorkerByNode(f.ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(w2, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("stored worker (-put +got):\n%s", d)
	}
	hb, err := f.m.Heartbeat(f.ctx, w.ID, "busy", json.RawMessage(`{"gpu_util":0.93}`))
	if err != nil || hb.Status != "busy" || string(hb.Metrics) != `{"gpu_util":0.93}` {
		t.Fatalf("Heartbeat = %+v, %v", hb, err)
	}
	if got, err := f.m.Worker(f.ctx, w.ID); err != nil || string(got.Metrics) != `{"gpu_util":0.93}` {
		t.Fatalf("metrics not stored: %+v, %v", got, err)
	}
	_, err = f.m.RegisterWorker(f.ctx, &lease.Worker{NodeID: "node-a"})
	wantErr(t, "a second worker for the node", err, lease.ErrConflict)
	_, err = f.m.RegisterWorker(f.ctx, &lease.Worker{})
	wantErr(t, "no node id", err, lease.ErrInvalidArgument)
	_, err = f.m.WorkerByNode(f.ctx, "node-z")
	wantErr(t, "unknown node", err, lease.ErrNotFound)
	_, err = f.m.Heartbeat(f.ctx, "wrk_missing", "idle", nil)
	wantErr(t, "heartbeat unknown", err, lease.ErrNotFound)
	b := f.worker("node-b", nil, nil, lease.Governor{})
	list, err := f.m.Workers(f.ctx, "", 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("Workers = %v, %v", list, err)
	}
	if list, err := f.m.Workers(f.ctx, list[0].ID, 10); err != nil || len(list) != 1 || (list[0].ID != b.ID && list[0].ID != w.ID) {
		t.Fatalf("Workers after: %v, %v", list, err)
	}
}

// UpdateJob writes only at the revision it was given.
func testUpdateRevision(t *testing.T, f *fixture) {
	j := f.enqueue("status_check")
	cur := f.get(j.ID)
	next := *cur
	next.Priority = 42
	next.Rev = cur.Rev + 1
	if err := f.store.UpdateJob(f.ctx, &next, cur.Rev); err != nil {
		t.Fatalf("UpdateJob at the current rev: %v", err)
	}
	stale := *cur
	stale.Priority = 7
	stale.Rev = cur.Rev + 1
	wantErr(t, "UpdateJob at a stale rev", f.store.UpdateJob(f.ctx, &stale, cur.Rev), lease.ErrConflict)
	if got := f.get(j.ID); got.Priority != 42 || got.Rev != next.Rev {
		t.Fatalf("after a stale write: priority %d rev %d", got.Priority, got.Rev)
	}
	missing := next
	missing.ID = "job_missing"
	wantErr(t, "UpdateJob of a missing job", f.store.UpdateJob(f.ctx, &missing, next.Rev), lease.ErrNotFound)
}
