package leasetest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

// tagTests check pools: a job's Requirements.Tags restrict it to the
// workers that have every one of them among their effective tags (those
// they registered, narrowed by what an approval pins), on every path a
// store claims by, with many workers claiming at once; Explain names the
// tags when they are all that is missing.
var tagTests = []test{
	{"PoolsRestrictLeases", testPoolsRestrictLeases},
	{"StoredSorted", testTagsStoredSorted},
	{"PinnedTagsNarrow", testPinnedTagsNarrow},
	{"TagArguments", testTagArguments},
	{"ConcurrentPools", testConcurrentPools},
	{"ExplainTags", testExplainTags},
}

func withTags(tags ...string) func(*lease.NewJob) {
	return func(nj *lease.NewJob) { nj.Requirements.Tags = tags }
}

// taggedWorker registers a CPU worker for status_check with tags.
func (f *fixture) taggedWorker(node string, tags ...string) *lease.Worker {
	f.t.Helper()
	w, err := f.m.RegisterWorker(f.ctx, &lease.Worker{
		NodeID: node, Tags: tags,
		Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}},
		Governor:     lease.Governor{MaxJobs: 8},
	})
	if err != nil {
		f.t.Fatalf("RegisterWorker(%s): %v", node, err)
	}
	return w
}

// leasedIDs leases up to n jobs for w and returns their ids, in claim order.
func (f *fixture) leasedIDs(w *lease.Worker, n int) []string {
	f.t.Helper()
	ids := []string{}
	for _, g := range f.lease(w, n) {
		ids = append(ids, g.Job.ID)
	}
	return ids
}

// A tagged job goes only to a worker that has all of its tags; an
// untagged job goes to any worker, tagged or not.
func testPoolsRestrictLeases(t *testing.T, f *fixture) {
	none := f.taggedWorker("none")
	b := f.taggedWorker("b", "lab-b")
	a := f.taggedWorker("a", "lab-a", "gpu-fast")
	ab := f.taggedWorker("ab", "lab-b", "lab-a")
	jab := f.enqueue("status_check", withTags("lab-a", "lab-b"), func(nj *lease.NewJob) { nj.Priority = 2 })
	ja := f.enqueue("status_check", withTags("lab-a"), func(nj *lease.NewJob) { nj.Priority = 1 })

	for _, w := range []*lease.Worker{none, b} {
		if got := f.leasedIDs(w, 5); len(got) != 0 {
			t.Fatalf("worker %s (tags %v) leased %v, tagged lab-a", w.NodeID, w.Tags, got)
		}
	}
	// a has lab-a but not lab-b: it skips the first job in claim order
	// and takes the second.
	if got := f.leasedIDs(a, 5); !slices.Equal(got, []string{ja.ID}) {
		t.Fatalf("worker a (lab-a) leased %v, want only %s", got, ja.ID)
	}
	if got := f.leasedIDs(ab, 5); !slices.Equal(got, []string{jab.ID}) {
		t.Fatalf("worker ab (lab-a, lab-b) leased %v, want only %s", got, jab.ID)
	}
	// An untagged job, and one whose tags b has, go to b and to none.
	plain := f.enqueue("status_check")
	jb := f.enqueue("status_check", withTags("lab-b"))
	if got := f.leasedIDs(b, 1); !slices.Equal(got, []string{plain.ID}) {
		t.Fatalf("worker b leased %v, want the untagged %s first", got, plain.ID)
	}
	if got := f.leasedIDs(none, 5); len(got) != 0 {
		t.Fatalf("untagged worker leased %v, tagged lab-b", got)
	}
	if got := f.leasedIDs(b, 5); !slices.Equal(got, []string{jb.ID}) {
		t.Fatalf("worker b leased %v, want %s", got, jb.ID)
	}
	plain2 := f.enqueue("status_check")
	if got := f.leasedIDs(none, 5); !slices.Equal(got, []string{plain2.ID}) {
		t.Fatalf("untagged worker leased %v, want the untagged %s", got, plain2.ID)
	}
	// What the worker registers again is what counts.
	none.Tags = []string{"lab-c"}
	if _, err := f.m.RegisterWorker(f.ctx, none); err != nil {
		t.Fatal(err)
	}
	jc := f.enqueue("status_check", withTags("lab-c"))
	if got := f.leasedIDs(a, 5); len(got) != 0 {
		t.Fatalf("worker a leased %v, tagged lab-c", got)
	}
	if got := f.leasedIDs(none, 5); !slices.Equal(got, []string{jc.ID}) {
		t.Fatalf("worker registered again with lab-c leased %v, want %s", got, jc.ID)
	}
}

// Enqueue stores a job's tags sorted and deduplicated, and the store
// gives them back as written; a job without tags has none.
func testTagsStoredSorted(t *testing.T, f *fixture) {
	j := f.enqueue("status_check", withTags("zeta", "lab-a", "zeta", "Lab-A", "☃"))
	if want := []string{"Lab-A", "lab-a", "zeta", "☃"}; !cmp.Equal(j.Requirements.Tags, want) {
		t.Fatalf("enqueued tags = %q, want %q", j.Requirements.Tags, want)
	}
	f.same(j)
	plain := f.enqueue("status_check", withTags([]string{}...))
	if plain.Requirements.Tags != nil {
		t.Fatalf("enqueued with [] tags: %q, want nil", plain.Requirements.Tags)
	}
	f.same(plain)
	if got := f.get(plain.ID).Requirements.Tags; len(got) != 0 {
		t.Fatalf("untagged job reads back tags %q", got)
	}
	// Tags compare as bytes: Lab-A is not lab-a.
	w := f.taggedWorker("w", "lab-a", "zeta", "☃")
	gs := f.lease(w, 5)
	if len(gs) != 1 || gs[0].Job.ID != plain.ID {
		t.Fatalf("worker without Lab-A leased %d jobs, want only the untagged %s", len(gs), plain.ID)
	}
	if len(gs[0].Job.Requirements.Tags) != 0 {
		t.Fatalf("claimed untagged job has tags %q", gs[0].Job.Requirements.Tags)
	}
	w.Tags = append(w.Tags, "Lab-A")
	if _, err := f.m.RegisterWorker(f.ctx, w); err != nil {
		t.Fatal(err)
	}
	gs = f.lease(w, 5)
	if len(gs) != 1 || gs[0].Job.ID != j.ID || !cmp.Equal(gs[0].Job.Requirements.Tags, j.Requirements.Tags) {
		t.Fatalf("worker with every tag leased %d jobs, want %s with its tags", len(gs), j.ID)
	}
}

// An approval that pins tags narrows the worker's registered tags, never
// widens them: a registered tag it does not pin does not count, and a
// pinned tag the worker did not register does not either.
func testPinnedTagsNarrow(t *testing.T, f *fixture) {
	w := f.taggedWorker("w", "lab-a", "lab-b")
	f.approve(w, lease.Approval{By: "operator", Tags: []string{"lab-b", "lab-c"}})
	if got, _ := f.m.Worker(f.ctx, w.ID); !cmp.Equal(got.EffectiveTags(), []string{"lab-b"}) {
		t.Fatalf("effective tags = %q, want [lab-b]", got.EffectiveTags())
	}
	ja := f.enqueue("status_check", withTags("lab-a"))
	jc := f.enqueue("status_check", withTags("lab-c"))
	if got := f.leasedIDs(w, 5); len(got) != 0 {
		t.Fatalf("leased %v: lab-a is registered but not pinned, lab-c pinned but not registered", got)
	}
	jb := f.enqueue("status_check", withTags("lab-b"))
	if got := f.leasedIDs(w, 5); !slices.Equal(got, []string{jb.ID}) {
		t.Fatalf("leased %v, want only %s (lab-b, registered and pinned)", got, jb.ID)
	}
	// An approval that pins no tag leaves the registered ones.
	f.approve(w, lease.Approval{By: "operator"})
	if got := f.leasedIDs(w, 5); !slices.Equal(got, []string{ja.ID}) {
		t.Fatalf("approved without tag pins: leased %v, want %s", got, ja.ID)
	}
	f.same(jc)
}

// Tags that break the rules of approval pins are refused, and nothing is
// stored.
func testTagArguments(t *testing.T, f *fixture) {
	many := make([]string, lease.MaxJobTags+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%03d", i)
	}
	for name, tags := range map[string][]string{
		"empty":         {"lab-a", ""},
		"space":         {"lab a"},
		"tab":           {"a\tb"},
		"control":       {"a\x00"},
		"not UTF-8":     {"\xff"},
		"too long":      {strings.Repeat("a", lease.MaxTagLen+1)},
		"too many":      many,
		"no-break sp.":  {"a\u00a0b"},
		"line feed end": {"a\n"},
	} {
		_, err := f.m.Enqueue(f.ctx, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{Tags: tags}})
		wantErr(t, name, err, lease.ErrInvalidArgument)
	}
	if jobs := f.list(lease.JobFilter{Limit: 1000}); len(jobs) != 0 {
		t.Fatalf("refused jobs stored: %d", len(jobs))
	}
	// The limits themselves are allowed.
	at := make([]string, lease.MaxJobTags)
	for i := range at {
		at[i] = fmt.Sprintf("%03d", i) + strings.Repeat("x", lease.MaxTagLen-3)
	}
	j := f.enqueue("status_check", withTags(at...))
	f.same(j)
}

// Many workers, half of them in pool lab-a, claim tagged and untagged
// jobs at once: every tagged job lands on a tagged worker, every job is
// leased once, and every job is done.
func testConcurrentPools(t *testing.T, f *fixture) {
	const tagged, plain, claimers = 200, 200, 16
	isTagged := map[string]bool{}
	for i := range tagged + plain {
		nj := lease.NewJob{Type: "status_check", Priority: i % 3}
		if i%2 == 0 {
			nj.Requirements.Tags = []string{"lab-a"}
		}
		j, err := f.m.Enqueue(f.ctx, nj)
		if err != nil {
			t.Fatal(err)
		}
		isTagged[j.ID] = i%2 == 0
	}
	var (
		mu     sync.Mutex
		leased = map[string]int{}
		strays []string // tagged jobs leased outside the pool
		wg     sync.WaitGroup
		errs   = make(chan error, claimers)
	)
	inPool := map[string]bool{}
	workers := make([]*lease.Worker, claimers)
	for c := range claimers {
		var tags []string
		if c%2 == 0 {
			tags = []string{"lab-a", fmt.Sprintf("node-%d", c)}
		}
		workers[c] = f.taggedWorker(fmt.Sprintf("claimer-%02d", c), tags...)
		inPool[workers[c].ID] = tags != nil
	}
	for c, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1 + c%4})
				if err != nil {
					errs <- err
					return
				}
				if len(gs) == 0 {
					return
				}
				for _, g := range gs {
					mu.Lock()
					leased[g.Job.ID]++
					if isTagged[g.Job.ID] && !inPool[w.ID] {
						strays = append(strays, fmt.Sprintf("%s by %s", g.Job.ID, w.NodeID))
					}
					mu.Unlock()
					ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
					if _, err := f.m.Accept(f.ctx, ref); err != nil {
						errs <- fmt.Errorf("accept %s: %w", g.Job.ID, err)
						return
					}
					if _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); err != nil {
						errs <- fmt.Errorf("complete %s: %w", g.Job.ID, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(strays) > 0 {
		t.Errorf("%d jobs tagged lab-a leased by workers without it, such as %s", len(strays), strays[0])
	}
	for id, k := range leased {
		if k != 1 {
			t.Errorf("job %s leased %d times", id, k)
		}
	}
	if len(leased) != tagged+plain {
		t.Errorf("leased %d distinct jobs, want %d", len(leased), tagged+plain)
	}
	// The stored leases say the same as the grants.
	for _, j := range f.list(lease.JobFilter{State: lease.StateSucceeded, Limit: 1000}) {
		if isTagged[j.ID] && (j.Lease == nil || !inPool[j.Lease.WorkerID]) {
			t.Errorf("job %s, tagged lab-a, succeeded under lease %+v of a worker outside the pool", j.ID, j.Lease)
		}
	}
}

// Explain names the job's tags when workers fit it but for them, per
// worker (lacking them, or its approval not pinning them) and in the
// summary; ExplainLease counts the queued jobs whose tags the worker
// lacks.
func testExplainTags(t *testing.T, f *fixture) {
	none := f.taggedWorker("none", "lab-b")
	pinned := f.taggedWorker("pinned", "lab-a", "lab-b")
	f.approve(pinned, lease.Approval{By: "operator", Tags: []string{"lab-b"}})
	gpuless := f.worker("gpu", nil, []string{"lora_train"}, lease.Governor{MaxJobs: 4})
	gpuless.Tags = []string{"lab-a"}
	if _, err := f.m.RegisterWorker(f.ctx, gpuless); err != nil {
		t.Fatal(err)
	}
	j := f.enqueue("status_check", withTags("lab-a"))
	ex := f.explain(j.ID, &lease.ExplainOptions{AllWorkers: true})
	wantExplained(t, "no worker has lab-a", ex, lease.Reason{Code: lease.ReasonTagsMismatch,
		Message: "no registered worker that supports status_check has tags lab-a"})
	wantVerdictReasons(t, verdict(t, ex, none), lease.Reason{Code: lease.ReasonTagsMismatch,
		Message: "the job needs tags lab-a; the worker lacks lab-a"})
	wantVerdictReasons(t, verdict(t, ex, pinned), lease.Reason{Code: lease.ReasonTagsMismatch,
		Message: "the job needs tags lab-a; its approval does not pin lab-a"})
	if v := verdict(t, ex, gpuless); v.Matches || len(v.Reasons) != 1 || v.Reasons[0].Code != lease.ReasonJobType {
		t.Errorf("verdict on a worker of another type: %+v", v)
	}

	// A GPU job: the summary says the workers fit its GPUs.
	gj := f.enqueue("lora_train", withTags("lab-a", "lab-z"), func(nj *lease.NewJob) { nj.Requirements.GPUCount = 1 })
	g := f.worker("g", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train"}, lease.Governor{MaxJobs: 4})
	g.Tags = []string{"lab-a"}
	if _, err := f.m.RegisterWorker(f.ctx, g); err != nil {
		t.Fatal(err)
	}
	ex = f.explain(gj.ID, &lease.ExplainOptions{AllWorkers: true})
	wantExplained(t, "no GPU worker has lab-z", ex, lease.Reason{Code: lease.ReasonTagsMismatch,
		Message: "no registered worker that supports lora_train with the GPUs it needs has tags lab-a, lab-z"})
	wantVerdictReasons(t, verdict(t, ex, g), lease.Reason{Code: lease.ReasonTagsMismatch,
		Message: "the job needs tags lab-a, lab-z; the worker lacks lab-z"})
	// A worker that lacks the GPUs is judged on them first.
	if v := verdict(t, ex, gpuless); v.Reasons[0].Code != lease.ReasonGPUCount {
		t.Errorf("verdict on a worker without GPUs: %+v", v.Reasons)
	}

	// ExplainLease counts the job among those that do not fit.
	lex := f.explainLease(lease.LeaseRequest{WorkerID: none.ID}, nil)
	wantLeaseReasons(t, "a worker outside the pool", lex, lease.Reason{Code: lease.ReasonNoFittingJob, JobType: "status_check",
		Message: "no queued status_check job fits the worker (1 needs tags it lacks)"})
	if lex.Types[0].Shortfalls[lease.ReasonTagsMismatch] != 1 {
		t.Errorf("shortfalls = %v", lex.Types[0].Shortfalls)
	}

	// A worker with the tag makes the job leasable.
	a := f.taggedWorker("a", "lab-a")
	ex = f.explain(j.ID, nil)
	wantExplained(t, "a worker has lab-a", ex)
	if v := verdict(t, ex, a); !v.Matches || !v.Available {
		t.Errorf("verdict on the tagged worker: %+v", v)
	}
	if lex := f.explainLease(lease.LeaseRequest{WorkerID: a.ID}, nil); !lex.Leasable {
		t.Errorf("ExplainLease for the tagged worker: %+v", lex.Reasons)
	}
}
