package leasetest

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// descending returns ids sorted as bytes, highest first.
func descending(ids []string) []string {
	out := slices.Sorted(slices.Values(ids))
	slices.Reverse(out)
	return out
}

// pageAll follows a list's cursor from after, limit records a page, until
// a page comes back short, and returns every id listed.
func pageAll[T any](t *testing.T, what string, after string, limit int, id func(T) string, list func(after string) ([]T, error)) []string {
	t.Helper()
	var got []string
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatalf("%s: more than 20 pages", what)
		}
		page, err := list(after)
		if err != nil {
			t.Fatalf("%s after %q: %v", what, after, err)
		}
		for _, v := range page {
			got = append(got, id(v))
		}
		if len(page) < limit {
			return got
		}
		after = id(page[len(page)-1])
	}
}

// testListDescending: JobFilter.Desc, ArtifactFilter.Desc and
// WorkerFilter.Desc list in descending id order, the cursor After then an
// exclusive upper bound (empty: from the highest id), filters combining
// with the order as they do ascending; paging down gives every record
// once, the reverse of paging up.
func testListDescending(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	var all, lora []string
	for i := range 7 {
		typ := "status_check"
		if i%2 == 1 {
			typ = "lora_train"
		}
		j := f.enqueue(typ)
		all = append(all, j.ID)
		if typ == "lora_train" {
			lora = append(lora, j.ID)
		}
	}
	_, ref := f.leaseOne(w)
	f.accept(ref)
	var arts []string
	for range 5 {
		a, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{Type: "log", Name: "out.txt"})
		if err != nil {
			t.Fatalf("AddArtifact: %v", err)
		}
		arts = append(arts, a.ID)
	}
	workers := []string{w.ID}
	for _, n := range []string{"w2", "w3", "w4"} {
		workers = append(workers, f.defaultWorker(n).ID)
	}

	jobID := func(j *lease.Job) string { return j.ID }
	cases := []struct {
		name  string
		jf    lease.JobFilter
		after string
		want  []string
	}{
		{"all", lease.JobFilter{}, "", descending(all)},
		{"all, 1 a page", lease.JobFilter{Limit: 1}, "", descending(all)},
		{"type", lease.JobFilter{Type: "lora_train"}, "", descending(lora)},
		{"type and state", lease.JobFilter{Type: "status_check", State: lease.StateQueued}, "", descending(slices.DeleteFunc(slices.Clone(all), func(id string) bool {
			return slices.Contains(lora, id) || id == ref.JobID
		}))},
		{"below the 4th", lease.JobFilter{}, all[3], descending(all[:3])},
		{"below the first", lease.JobFilter{}, all[0], nil},
		{"below an id above all", lease.JobFilter{}, all[6] + "z", descending(all)},
	}
	for _, c := range cases {
		jf := c.jf
		jf.Desc = true
		if jf.Limit == 0 {
			jf.Limit = 3
		}
		got := pageAll(t, "ListJobs("+c.name+")", c.after, jf.Limit, jobID, func(after string) ([]*lease.Job, error) {
			jf.After = after
			return f.store.ListJobs(f.ctx, jf)
		})
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("ListJobs(%s, Desc) (-want +got):\n%s", c.name, d)
		}
	}
	// Manager.List's next cursor pages down the same way.
	var got []string
	for jf := (lease.JobFilter{Desc: true, Limit: 2}); ; {
		page, next, err := f.m.List(f.ctx, jf)
		if err != nil {
			t.Fatalf("List(Desc): %v", err)
		}
		for _, j := range page {
			got = append(got, j.ID)
		}
		if next == "" {
			break
		}
		jf.After = next
	}
	if d := cmp.Diff(descending(all), got); d != "" {
		t.Errorf("Manager.List(Desc) pages (-want +got):\n%s", d)
	}
	// Ascending is unchanged by the field's existence.
	if got := pageAll(t, "ListJobs(asc)", "", 3, jobID, func(after string) ([]*lease.Job, error) {
		return f.store.ListJobs(f.ctx, lease.JobFilter{After: after, Limit: 3})
	}); !slices.Equal(got, all) {
		t.Errorf("ListJobs ascending = %v, want %v", got, all)
	}

	artID := func(a *lease.Artifact) string { return a.ID }
	for _, c := range []struct {
		name  string
		af    lease.ArtifactFilter
		after string
		want  []string
	}{
		{"all", lease.ArtifactFilter{}, "", descending(arts)},
		{"of the job", lease.ArtifactFilter{JobID: ref.JobID}, "", descending(arts)},
		{"of another job", lease.ArtifactFilter{JobID: all[6]}, "", nil},
		{"below the 3rd highest", lease.ArtifactFilter{}, descending(arts)[2], descending(arts)[3:]},
	} {
		af := c.af
		af.Desc, af.Limit = true, 2
		got := pageAll(t, "ListArtifacts("+c.name+")", c.after, af.Limit, artID, func(after string) ([]*lease.Artifact, error) {
			af.After = after
			return f.store.ListArtifacts(f.ctx, af)
		})
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("ListArtifacts(%s, Desc) (-want +got):\n%s", c.name, d)
		}
	}

	wID := func(w *lease.Worker) string { return w.ID }
	for _, c := range []struct {
		name  string
		after string
		want  []string
	}{
		{"all", "", descending(workers)},
		{"below the 2nd highest", descending(workers)[1], descending(workers)[2:]},
	} {
		got := pageAll(t, "ListWorkers("+c.name+")", c.after, 3, wID, func(after string) ([]*lease.Worker, error) {
			return f.store.ListWorkers(f.ctx, lease.WorkerFilter{After: after, Limit: 3, Desc: true})
		})
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("ListWorkers(%s, Desc) (-want +got):\n%s", c.name, d)
		}
		mgot, err := f.m.Workers(f.ctx, lease.WorkerFilter{After: c.after, Desc: true})
		if err != nil {
			t.Fatalf("Manager.Workers(Desc): %v", err)
		}
		if d := cmp.Diff(c.want, pageIDs(mgot, wID), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("Manager.Workers(%s, Desc) (-want +got):\n%s", c.name, d)
		}
	}
}

func pageIDs[T any](vs []T, id func(T) string) []string {
	var out []string
	for _, v := range vs {
		out = append(out, id(v))
	}
	return out
}
