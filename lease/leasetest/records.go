package leasetest

import (
	"encoding/json"
	"fmt"
	"slices"
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
	{"IDs", testIDs},
	{"Payloads", testPayloads},
	{"WorkerFilter", testWorkerFilter},
	{"LastWorkerAndTagFilters", testLastWorkerAndTagFilters},
	{"Limits", testLimits},
	{"ListDescending", testListDescending},
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
	// A heartbeat writes when the worker was seen, its status and its
	// metrics, and nothing else: no status and no metrics keep theirs,
	// and it returns the worker as stored.
	f.clock.Advance(time.Second)
	hb2, err := f.m.Heartbeat(f.ctx, w.ID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := *hb
	want.LastSeenAt = hb.LastSeenAt.Add(time.Second)
	if d := cmp.Diff(&want, hb2, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("a heartbeat without status or metrics (-want +got):\n%s", d)
	}
	if got, err := f.m.Worker(f.ctx, w.ID); err != nil || cmp.Diff(hb2, got, cmpopts.EquateEmpty()) != "" {
		t.Fatalf("Heartbeat returned %+v, the store holds %+v (%v)", hb2, got, err)
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
	list, err := f.m.Workers(f.ctx, lease.WorkerFilter{Limit: 10})
	if err != nil || len(list) != 2 {
		t.Fatalf("Workers = %v, %v", list, err)
	}
	if list, err := f.m.Workers(f.ctx, lease.WorkerFilter{After: list[0].ID, Limit: 10}); err != nil || len(list) != 1 || (list[0].ID != b.ID && list[0].ID != w.ID) {
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

// ids are caller-chosen ids that a store must keep apart and order as Go
// does, byte by byte: case, Unicode normalisation, trailing spaces, and
// characters beyond the Basic Multilingual Plane (which UTF-16 orders
// before U+E000..U+FFFF) all count. The fixtures' own ids are lowercase
// ASCII, which hides a wrong collation.
var ids = []string{
	"job-a",
	"Job-A",
	"JOB-A",
	"job-B",             // after "job-a" when case is folded, before it as bytes
	"job-a ",            // equal to "job-a" in a PAD SPACE collation
	"jöb-ü",             // precomposed (NFC)
	"jo\u0308b-u\u0308", // the same, decomposed (NFD)
	"job-\uff21",        // FULLWIDTH LATIN CAPITAL LETTER A
	"job-\U0001f600",    // a four-byte character
}

// Jobs, workers and nodes are found, kept apart and ordered by their ids
// as bytes.
func testIDs(t *testing.T, f *fixture) {
	// One creation time, so that the claim order falls to the ids.
	for i, id := range ids {
		_, err := f.m.Enqueue(f.ctx, lease.NewJob{ID: id, Type: "status_check", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			t.Fatalf("Enqueue(%q) after %q: %v", id, ids[:i], err)
		}
	}
	for i, id := range ids {
		j := f.get(id)
		if j.ID != id || string(j.Payload) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Fatalf("Get(%q) = job %q with payload %s, want payload {\"i\":%d}", id, j.ID, j.Payload, i)
		}
	}
	for _, id := range []string{"JOB-a", "job-b", "job-\uff41", "job-A"} {
		_, err := f.m.Get(f.ctx, id)
		wantErr(t, fmt.Sprintf("Get(%q)", id), err, lease.ErrNotFound)
	}
	sorted := slices.Sorted(slices.Values(ids))
	var got []string
	after := ""
	for range len(ids) {
		jobs, next, err := f.m.List(f.ctx, lease.JobFilter{After: after, Limit: 2})
		if err != nil {
			t.Fatalf("List after %q: %v", after, err)
		}
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if d := cmp.Diff(sorted, got); d != "" {
		t.Fatalf("jobs paged by id, 2 a page (-byte order +got):\n%s", d)
	}
	// A cursor in the middle, next to ids equal but for case or padding.
	for _, cursor := range []string{"job-a", "Job-A", "job-B"} {
		jobs, _, err := f.m.List(f.ctx, lease.JobFilter{After: cursor, Limit: 100})
		if err != nil {
			t.Fatalf("List after %q: %v", cursor, err)
		}
		got = got[:0]
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if d := cmp.Diff(sorted[slices.Index(sorted, cursor)+1:], got); d != "" {
			t.Fatalf("List after %q (-byte order +got):\n%s", cursor, d)
		}
	}

	// Claims of one priority and age go in id order.
	w := f.worker("node-a", nil, []string{"status_check"}, lease.Governor{MaxJobs: len(ids)})
	gs := f.lease(w, len(ids))
	got = got[:0]
	for _, g := range gs {
		got = append(got, g.Job.ID)
		if g.Job.Lease.JobID != g.Job.ID {
			t.Errorf("job %q holds a lease of job %q", g.Job.ID, g.Job.Lease.JobID)
		}
	}
	if d := cmp.Diff(sorted, got); d != "" {
		t.Fatalf("claim order of jobs alike but for their ids (-byte order +got):\n%s", d)
	}
	// Events and artifacts belong to their job only.
	refs := map[string]lease.Ref{}
	for _, g := range gs {
		refs[g.Job.ID] = lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
	}
	for _, id := range []string{"job-a", "Job-A"} {
		f.accept(refs[id])
		if _, err := f.m.RecordEvents(f.ctx, refs[id], lease.Event{Kind: lease.EventLog, Seq: 1, Message: id}); err != nil {
			t.Fatalf("RecordEvents(%q): %v", id, err)
		}
		if _, err := f.m.AddArtifact(f.ctx, refs[id], lease.Artifact{Type: "log", Name: id}); err != nil {
			t.Fatalf("AddArtifact(%q): %v", id, err)
		}
	}
	for _, id := range []string{"job-a", "Job-A"} {
		evs, err := f.m.Events(f.ctx, id, 0, 10)
		if err != nil || len(evs) != 1 || evs[0].JobID != id || evs[0].Message != id {
			t.Fatalf("Events(%q) = %+v, %v; want its one log line", id, evs, err)
		}
		arts, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: id})
		if err != nil || len(arts) != 1 || arts[0].JobID != id || arts[0].Name != id {
			t.Fatalf("Artifacts(%q) = %+v, %v; want its one artifact", id, arts, err)
		}
	}

	// Workers and nodes.
	var wids []string
	for _, id := range []string{"wrk-a", "Wrk-A", "wrk-ä"} {
		w, err := f.m.RegisterWorker(f.ctx, &lease.Worker{ID: id, NodeID: "Node-" + id})
		if err != nil || w.ID != id {
			t.Fatalf("RegisterWorker(%q) = %+v, %v", id, w, err)
		}
		wids = append(wids, id)
	}
	for _, id := range []string{"NODE-A", "node-b"} {
		if _, err := f.m.RegisterWorker(f.ctx, &lease.Worker{NodeID: id}); err != nil {
			t.Fatalf("RegisterWorker(node %q) beside node %q: %v", id, "node-a", err)
		}
	}
	if got, err := f.m.WorkerByNode(f.ctx, "Node-Wrk-A"); err != nil || got.ID != "Wrk-A" {
		t.Fatalf("WorkerByNode(%q) = %+v, %v", "Node-Wrk-A", got, err)
	}
	_, err := f.m.WorkerByNode(f.ctx, "node-wrk-a")
	wantErr(t, fmt.Sprintf("WorkerByNode(%q)", "node-wrk-a"), err, lease.ErrNotFound)
	_, err = f.m.Worker(f.ctx, "WRK-A")
	wantErr(t, fmt.Sprintf("Worker(%q)", "WRK-A"), err, lease.ErrNotFound)
	all, err := f.m.Workers(f.ctx, lease.WorkerFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var gotW []string
	for _, w := range all {
		if slices.Contains(wids, w.ID) {
			gotW = append(gotW, w.ID)
		}
	}
	if d := cmp.Diff(slices.Sorted(slices.Values(wids)), gotW); d != "" {
		t.Fatalf("workers in id order (-byte order +got):\n%s", d)
	}
	if page, err := f.m.Workers(f.ctx, lease.WorkerFilter{After: "Wrk-A", Limit: 100}); err != nil || len(page) == 0 || page[0].ID != "wrk-a" {
		t.Fatalf("Workers after %q = %v, %v; want %q first", "Wrk-A", page, err, "wrk-a")
	}
}

// payloads are valid JSON values that a store that re-encodes JSON would
// change: spacing, HTML-sensitive characters, number forms, key order,
// duplicate keys, escapes (\u0000 included, which PostgreSQL's jsonb
// refuses) and non-ASCII text. The fixtures' own payloads are compact.
var payloads = []string{
	`{ "prompt" : "<b>&" , "n":1e3 }`,
	"{\n\t\"b\": [1.0, 2.50, -0, 12345678901234567890123],\n\t\"a\": {}\n}\n",
	`{"a":1,"a":2}`,
	`{"esc":"\u00e9\u2028\/\u0000","raw":"é😀\u003c"}`,
	` [ "not", "an", "object" ] `,
}

// Every JSON value comes back byte for byte: a job's payload, a failure's,
// a result's metrics, an event's payload, an artifact's metadata and a
// worker's metrics.
func testPayloads(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	for i, p := range payloads {
		raw := json.RawMessage(p)
		check := func(what string, got json.RawMessage) {
			t.Helper()
			if string(got) != p {
				t.Fatalf("payload %d, %s:\n got %q\nwant %q", i, what, got, p)
			}
		}
		j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Payload = raw })
		check("job payload", f.get(j.ID).Payload)
		_, ref := f.leaseOne(w)
		f.fail(ref, lease.Failure{Code: "retry", Payload: raw, Retryable: true})
		check("failure payload", f.get(j.ID).LastError.Payload)
		_, ref = f.leaseOne(w)
		f.accept(ref)
		if _, err := f.m.RecordEvents(f.ctx, ref,
			lease.Event{Kind: lease.EventLog, Seq: 1, Payload: raw},
			lease.Event{Kind: lease.EventStatus, Type: "progress", Payload: raw}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{Type: "adapter", Name: "a", Metadata: raw}); err != nil {
			t.Fatal(err)
		}
		f.complete(ref, lease.Result{Metrics: raw})
		got := f.get(j.ID)
		check("job payload after completion", got.Payload)
		check("failure payload after completion", got.LastError.Payload)
		check("result metrics", got.Result.Metrics)
		evs, err := f.m.Events(f.ctx, j.ID, 0, 10)
		if err != nil || len(evs) != 2 {
			t.Fatalf("Events = %v, %v", evs, err)
		}
		check("log line payload", evs[0].Payload)
		check("status event payload", evs[1].Payload)
		arts, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: j.ID})
		if err != nil || len(arts) != 1 {
			t.Fatalf("Artifacts = %v, %v", arts, err)
		}
		check("artifact metadata", arts[0].Metadata)
		if _, err := f.m.Heartbeat(f.ctx, w.ID, "idle", raw); err != nil {
			t.Fatal(err)
		}
		wk, err := f.m.Worker(f.ctx, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		check("worker metrics", wk.Metrics)
	}
}

// JobFilter.WorkerID selects the worker's live jobs only: not those its
// lease left, finished or back in the queue, though their Lease still
// names it, nor another worker's.
func testWorkerFilter(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	other := f.worker("other", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	leaseNew := func(by *lease.Worker) lease.Ref {
		t.Helper()
		j := f.enqueue("status_check")
		lj, ref := f.leaseOne(by)
		if lj.ID != j.ID {
			t.Fatalf("leased %s, want the new job %s", lj.ID, j.ID)
		}
		return ref
	}
	leased := leaseNew(w)
	running := leaseNew(w)
	f.accept(running)
	ref := leaseNew(w)
	f.accept(ref)
	f.complete(ref, lease.Result{})
	ref = leaseNew(w)
	f.accept(ref)
	f.fail(ref, lease.Failure{Code: "bad_input"})
	ref = leaseNew(w)
	f.cancel(ref.JobID)
	f.fail(ref, lease.Failure{Code: "canceled"})
	f.state(ref.JobID, lease.StateCanceled)
	others := leaseNew(other)
	ref = leaseNew(w)
	f.release(ref, "preempted")
	f.enqueue("status_check")

	live := slices.Sorted(slices.Values([]string{leased.JobID, running.JobID}))
	cases := []struct {
		name string
		jf   lease.JobFilter
		want []string
	}{
		{"worker", lease.JobFilter{WorkerID: w.ID}, live},
		{"worker, 1 a page", lease.JobFilter{WorkerID: w.ID, Limit: 1}, live[:1]},
		{"worker, running", lease.JobFilter{WorkerID: w.ID, State: lease.StateRunning}, []string{running.JobID}},
		{"worker, succeeded", lease.JobFilter{WorkerID: w.ID, State: lease.StateSucceeded}, nil},
		{"worker, queued", lease.JobFilter{WorkerID: w.ID, State: lease.StateQueued}, nil},
		{"another worker", lease.JobFilter{WorkerID: other.ID}, []string{others.JobID}},
		{"an unknown worker", lease.JobFilter{WorkerID: "wrk_nobody"}, nil},
	}
	for _, c := range cases {
		jf := c.jf
		if jf.Limit == 0 {
			jf.Limit = 100
		}
		jobs, err := f.store.ListJobs(f.ctx, jf)
		if err != nil {
			t.Fatalf("%s: ListJobs: %v", c.name, err)
		}
		var got []string
		for _, j := range jobs {
			got = append(got, j.ID)
			if !j.State.Live() || j.Lease.WorkerID != jf.WorkerID {
				t.Errorf("%s: ListJobs gave job %s, %s under a lease of %s", c.name, j.ID, j.State, j.Lease.WorkerID)
			}
		}
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: ListJobs(%+v) (-want +got):\n%s", c.name, jf, d)
		}
	}
}

// Every limit is at least 1: a store refuses a limit <= 0 with
// ErrInvalidArgument (rather than read it as none, or as all), and
// returns no more than a limit of 1 allows.
func testLimits(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	w2 := f.defaultWorker("w2")
	var refs []lease.Ref
	for range 3 {
		f.enqueue("status_check")
		_, ref := f.leaseOne(w)
		refs = append(refs, ref)
	}
	f.accept(refs[0])
	for range 2 {
		if _, err := f.m.RecordEvents(f.ctx, refs[0], lease.Event{Kind: lease.EventStatus, Type: "progress"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.AddArtifact(f.ctx, refs[0], lease.Artifact{Type: "log", Name: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	queued := f.enqueue("status_check")
	f.clock.Advance(acceptTTL) // refs[1] and refs[2] are past their accept deadline
	now := f.now()
	job := refs[0].JobID
	calls := []struct {
		name string
		call func(limit int) (int, error)
	}{
		{"ListJobs", func(limit int) (int, error) {
			js, err := f.store.ListJobs(f.ctx, lease.JobFilter{Limit: limit})
			return len(js), err
		}},
		{"ExpiredJobs", func(limit int) (int, error) {
			js, err := f.store.ExpiredJobs(f.ctx, now, limit)
			return len(js), err
		}},
		{"OfflineJobs", func(limit int) (int, error) {
			js, err := f.store.OfflineJobs(f.ctx, now, limit)
			return len(js), err
		}},
		{"ListEvents", func(limit int) (int, error) {
			evs, err := f.store.ListEvents(f.ctx, job, 0, limit)
			return len(evs), err
		}},
		{"ListArtifacts", func(limit int) (int, error) {
			as, err := f.store.ListArtifacts(f.ctx, lease.ArtifactFilter{JobID: job, Limit: limit})
			return len(as), err
		}},
		{"ListWorkers", func(limit int) (int, error) {
			ws, err := f.store.ListWorkers(f.ctx, lease.WorkerFilter{Limit: limit})
			return len(ws), err
		}},
		{"ClaimLeases", func(limit int) (int, error) {
			js, err := f.store.ClaimLeases(f.ctx, w2.ID, func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
				return lease.ClaimQuery{WorkerID: w2.ID, Types: []string{"status_check"}, Fits: []lease.Fit{{}}, MaxActive: 10, Limit: limit, Now: now},
					lease.LeaseClaim{Leases: []lease.Lease{{ID: "lse_limit", WorkerID: w2.ID, TokenHash: []byte{1}, ExpiresAt: now.Add(time.Hour), AcceptBy: now.Add(time.Hour)}}}, true, nil
			})
			return len(js), err
		}},
	}
	for _, c := range calls {
		for _, limit := range []int{0, -1} {
			n, err := c.call(limit)
			wantErr(t, fmt.Sprintf("%s with limit %d (gave %d)", c.name, limit, n), err, lease.ErrInvalidArgument)
		}
	}
	f.same(queued) // no claim took it
	for _, c := range calls {
		if n, err := c.call(1); err != nil || n != 1 {
			t.Errorf("%s with limit 1 gave %d, %v; want 1 of several", c.name, n, err)
		}
	}
}

// JobFilter.LastWorkerID selects the jobs whose last lease, live or
// ended, is the worker's, whatever their state; JobFilter.Tag the jobs
// that carry a tag among their requirements; both combine with the
// other fields and with paging.
func testLastWorkerAndTagFilters(t *testing.T, f *fixture) {
	a := f.taggedWorker("a", "lab-a", "lab-b")
	b := f.taggedWorker("b", "lab-a", "lab-b")
	leaseNew := func(w *lease.Worker, opts ...func(*lease.NewJob)) lease.Ref {
		t.Helper()
		j := f.enqueue("status_check", opts...)
		lj, ref := f.leaseOne(w)
		if lj.ID != j.ID {
			t.Fatalf("leased %s, want the new job %s", lj.ID, j.ID)
		}
		return ref
	}
	done := leaseNew(a, withTags("lab-a"))
	f.accept(done)
	f.complete(done, lease.Result{})
	live := leaseNew(a)
	others := leaseNew(b, withTags("lab-b"))
	requeued := leaseNew(a, withTags("lab-a", "lab-b"))
	f.release(requeued, "preempted")
	f.state(requeued.JobID, lease.StateQueued)
	never := f.enqueue("status_check", withTags("lab-a"))
	// A tag that is a prefix, or a JSON fragment, of another matches
	// nothing it should not.
	odd := f.enqueue("status_check", withTags(`lab-"x"`))

	sorted := func(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }
	cases := []struct {
		name string
		jf   lease.JobFilter
		want []string
	}{
		{"last worker a", lease.JobFilter{LastWorkerID: a.ID}, sorted(done.JobID, requeued.JobID, live.JobID)},
		{"last worker a, queued", lease.JobFilter{LastWorkerID: a.ID, State: lease.StateQueued}, []string{requeued.JobID}},
		{"last worker a, succeeded", lease.JobFilter{LastWorkerID: a.ID, State: lease.StateSucceeded}, []string{done.JobID}},
		{"last worker a, 1 a page", lease.JobFilter{LastWorkerID: a.ID, Limit: 1}, sorted(done.JobID, requeued.JobID, live.JobID)[:1]},
		{"last worker b", lease.JobFilter{LastWorkerID: b.ID}, []string{others.JobID}},
		{"an unknown worker", lease.JobFilter{LastWorkerID: "wrk_nobody"}, nil},
		{"tag lab-a", lease.JobFilter{Tag: "lab-a"}, sorted(done.JobID, requeued.JobID, never.ID)},
		{"tag lab-b", lease.JobFilter{Tag: "lab-b"}, sorted(requeued.JobID, others.JobID)},
		{"tag lab-a, worker a", lease.JobFilter{Tag: "lab-a", LastWorkerID: a.ID}, sorted(done.JobID, requeued.JobID)},
		{"tag lab-a, queued", lease.JobFilter{Tag: "lab-a", State: lease.StateQueued}, sorted(requeued.JobID, never.ID)},
		{"tag with quotes", lease.JobFilter{Tag: `lab-"x"`}, []string{odd.ID}},
		{"tag prefix", lease.JobFilter{Tag: "lab"}, nil},
		{"tag unknown", lease.JobFilter{Tag: "lab-c"}, nil},
		{"tag, wrong type", lease.JobFilter{Tag: "lab-a", Type: "other"}, nil},
	}
	for _, c := range cases {
		jf := c.jf
		if jf.Limit == 0 {
			jf.Limit = 100
		}
		jobs, err := f.store.ListJobs(f.ctx, jf)
		if err != nil {
			t.Fatalf("%s: ListJobs: %v", c.name, err)
		}
		var got []string
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: ListJobs(%+v) (-want +got):\n%s", c.name, jf, d)
		}
	}
}
