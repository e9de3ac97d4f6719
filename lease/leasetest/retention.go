package leasetest

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

var retentionTests = []test{
	{"DeletesEndedWithRecords", testDeleteEnded},
	{"DeleteLimit", testDeleteLimit},
	{"Prune", testPrune},
	{"ConcurrentDeletes", testConcurrentDeletes},
	{"DeletesWhileJobsEnd", testDeleteWhileJobsEnd},
}

// record gives the job under ref a log line, a status event and an
// artifact.
func (f *fixture) record(ref lease.Ref) {
	f.t.Helper()
	if _, err := f.m.RecordEvents(f.ctx, ref,
		lease.Event{Kind: lease.EventLog, Seq: 1, Message: "line"},
		lease.Event{Kind: lease.EventStatus, Type: "progress", Payload: json.RawMessage(`{"pct":50}`)},
	); err != nil {
		f.t.Fatalf("RecordEvents(%s): %v", ref.JobID, err)
	}
	if _, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{Type: "log", Name: "out.txt"}); err != nil {
		f.t.Fatalf("AddArtifact(%s): %v", ref.JobID, err)
	}
}

// records counts the events and artifacts the store keeps for job id.
func (f *fixture) records(id string) (events, artifacts int) {
	f.t.Helper()
	evs, err := f.store.ListEvents(f.ctx, id, 0, 1000)
	if err != nil {
		f.t.Fatalf("ListEvents(%s): %v", id, err)
	}
	as, err := f.store.ListArtifacts(f.ctx, lease.ArtifactFilter{JobID: id, Limit: 1000})
	if err != nil {
		f.t.Fatalf("ListArtifacts(%s): %v", id, err)
	}
	return len(evs), len(as)
}

// gone checks that job id and its records are deleted.
func (f *fixture) gone(id string) {
	f.t.Helper()
	if _, err := f.store.GetJob(f.ctx, id); !errors.Is(err, lease.ErrNotFound) {
		f.t.Errorf("GetJob(%s) after its deletion: %v, want ErrNotFound", id, err)
	}
	if evs, as := f.records(id); evs != 0 || as != 0 {
		f.t.Errorf("job %s deleted, but %d events and %d artifacts kept", id, evs, as)
	}
}

// kept checks that job id is stored with its events and artifacts.
func (f *fixture) kept(id string, events, artifacts int) {
	f.t.Helper()
	if _, err := f.store.GetJob(f.ctx, id); err != nil {
		f.t.Errorf("GetJob(%s), a job that must be kept: %v", id, err)
	}
	if evs, as := f.records(id); evs != events || as != artifacts {
		f.t.Errorf("job %s kept %d events and %d artifacts, want %d and %d", id, evs, as, events, artifacts)
	}
}

// deleteEnded runs DeleteEnded and checks that it deleted want jobs.
func (f *fixture) deleteEnded(before time.Time, limit, want int) {
	f.t.Helper()
	n, err := f.store.DeleteEnded(f.ctx, before, limit)
	if err != nil || n != want {
		f.t.Fatalf("DeleteEnded(%v, %d) = %d, %v; want %d", before, limit, n, err, want)
	}
}

// canceledJobs enqueues n jobs and cancels them, which ends them at once.
func (f *fixture) canceledJobs(n int) []string {
	f.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = f.cancel(f.enqueue("status_check").ID).ID
	}
	return ids
}

// DeleteEnded deletes the jobs that ended (succeeded, failed, canceled)
// before the cutoff with their events and artifacts; it keeps the jobs
// that ended at or after it, and queued and live jobs whatever their age,
// with theirs.
func testDeleteEnded(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	succeeded := f.enqueue("status_check")
	failed := f.enqueue("status_check")
	_, rs := f.leaseOne(w)
	_, rf := f.leaseOne(w)
	for _, ref := range []lease.Ref{rs, rf} {
		f.accept(ref)
		f.record(ref)
	}
	f.complete(rs, lease.Result{OutputURI: "s3://out"})
	f.fail(rf, lease.Failure{Code: "oom", Message: "out of memory"})
	canceled := f.cancel(f.enqueue("status_check").ID)
	queued := f.enqueue("no_worker_takes_it")
	live := f.enqueue("status_check")
	old := f.now()
	f.clock.Advance(time.Hour)
	_, rl := f.leaseOne(w) // live, the only job w can take
	f.accept(rl)
	f.record(rl)
	young := f.enqueue("status_check")
	_, ry := f.leaseOne(w)
	f.accept(ry)
	f.record(ry)
	f.complete(ry, lease.Result{})
	ended := f.get(young.ID).FinishedAt
	youngEvents, err := f.store.ListEvents(f.ctx, young.ID, 0, 100)
	if err != nil || len(youngEvents) != 2 {
		t.Fatalf("events of %s: %v, %v", young.ID, youngEvents, err)
	}

	f.deleteEnded(old.Add(time.Minute), 100, 3)
	for _, id := range []string{succeeded.ID, failed.ID, canceled.ID} {
		f.gone(id)
	}
	f.kept(live.ID, 2, 1)
	f.kept(young.ID, 2, 1)
	f.kept(queued.ID, 0, 0)
	f.state(live.ID, lease.StateRunning)
	f.deleteEnded(old.Add(time.Minute), 100, 0)

	// The cutoff is exclusive: a job that ended at it is kept.
	f.deleteEnded(*ended, 100, 0)
	f.kept(young.ID, 2, 1)
	f.deleteEnded(ended.Add(time.Microsecond), 100, 1)
	f.gone(young.ID)

	// However late the cutoff, no queued or live job goes.
	f.deleteEnded(f.now().Add(1000*time.Hour), 100, 0)
	f.kept(live.ID, 2, 1)
	f.kept(queued.ID, 0, 0)

	// The live job goes on. Its new event gets an id above every id given
	// before, those of the deleted jobs' events included: a reader paging
	// the job's events by id would miss an event given a reused, lower id.
	evs, err := f.store.ListEvents(f.ctx, live.ID, 0, 100)
	if err != nil || len(evs) != 2 {
		t.Fatalf("events of the live job: %v, %v", evs, err)
	}
	res, err := f.m.RecordEvents(f.ctx, rl, lease.Event{Kind: lease.EventLog, Seq: 2, Message: "after"})
	if err != nil || res.Accepted != 1 {
		t.Fatalf("RecordEvents after a deletion: %+v, %v", res, err)
	}
	after, err := f.store.ListEvents(f.ctx, live.ID, evs[1].ID, 100)
	if err != nil || len(after) != 1 {
		t.Fatalf("events of the live job after id %d: %v, %v; want the new one", evs[1].ID, after, err)
	}
	if last := youngEvents[1].ID; after[0].ID <= last {
		t.Errorf("new event id %d is not above %d, the last id given before the deletions", after[0].ID, last)
	}
}

// A limit caps the jobs deleted, and a limit below 1 is refused and
// deletes nothing.
func testDeleteLimit(t *testing.T, f *fixture) {
	ids := f.canceledJobs(3)
	before := f.now().Add(time.Second)
	for _, limit := range []int{0, -1} {
		n, err := f.store.DeleteEnded(f.ctx, before, limit)
		wantErr(t, fmt.Sprintf("DeleteEnded with limit %d (deleted %d)", limit, n), err, lease.ErrInvalidArgument)
	}
	for _, id := range ids {
		f.kept(id, 0, 0)
	}
	f.deleteEnded(before, 1, 1)
	f.deleteEnded(before, 5, 2)
	for _, id := range ids {
		f.gone(id)
	}
}

// Manager.Prune deletes the jobs that ended more than Config.Retention
// ago, and nothing without Retention.
func testPrune(t *testing.T, f *fixture) {
	retained := lease.NewManager(f.store, &lease.Config{Retention: time.Hour, Now: f.clock.Now, Rand: rand.Reader})
	queued := f.enqueue("status_check")
	ended := f.canceledJobs(3)
	f.clock.Advance(time.Hour) // the last job ended exactly an hour ago
	if n, err := retained.Prune(f.ctx); err != nil || n != 2 {
		t.Fatalf("Prune an hour after = %d, %v; want the 2 jobs that ended earlier", n, err)
	}
	f.gone(ended[0])
	f.gone(ended[1])
	f.kept(ended[2], 0, 0)
	f.clock.Advance(time.Microsecond)
	if n, err := f.m.Prune(f.ctx); err != nil || n != 0 {
		t.Fatalf("Prune without Retention = %d, %v; want 0", n, err)
	}
	if n, err := retained.Prune(f.ctx); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	f.gone(ended[2])
	f.clock.Advance(1000 * time.Hour)
	if n, err := retained.Prune(f.ctx); err != nil || n != 0 {
		t.Fatalf("Prune with only a queued job = %d, %v; want 0", n, err)
	}
	f.kept(queued.ID, 0, 0)
}

// Deleters running at once (replicas' maintainers) delete every ended
// job exactly once between them, without an error.
func testConcurrentDeletes(t *testing.T, f *fixture) {
	const jobs, deleters, limit = 90, 4, 7
	ids := f.canceledJobs(jobs)
	before := f.now().Add(time.Second)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		errs  = make(chan error, deleters)
	)
	for range deleters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := f.store.DeleteEnded(f.ctx, before, limit)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				total += n
				mu.Unlock()
				if n == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A deleter stops on an empty batch, which another's locks may have
	// caused; a last call deletes what they left.
	n, err := f.store.DeleteEnded(f.ctx, before, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if total+n != jobs {
		t.Errorf("deleters counted %d deletions, then %d more; want %d in all", total, n, jobs)
	}
	for _, id := range ids {
		f.gone(id)
	}
}

// A deleter whose cutoff is in the future, running while workers complete
// their jobs, deletes each job once it ended and never one before: every
// completion succeeds.
func testDeleteWhileJobsEnd(t *testing.T, f *fixture) {
	const jobs, workers = 40, 4
	for range jobs {
		f.enqueue("status_check")
	}
	var refs []lease.Ref
	for i := range workers {
		w := f.worker(fmt.Sprintf("w%d", i), nil, []string{"status_check"}, lease.Governor{MaxJobs: jobs})
		for _, g := range f.lease(w, jobs/workers) {
			ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
			f.accept(ref)
			refs = append(refs, ref)
		}
	}
	if len(refs) != jobs {
		t.Fatalf("leased %d jobs, want %d", len(refs), jobs)
	}
	future := f.now().Add(time.Hour)
	var (
		wg      sync.WaitGroup
		done    = make(chan struct{})
		deleted int
		errs    = make(chan error, workers+1)
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			n, err := f.store.DeleteEnded(f.ctx, future, 3)
			if err != nil {
				errs <- err
				return
			}
			deleted += n
			select {
			case <-done:
				if n == 0 {
					return
				}
			default:
			}
		}
	}()
	var cw sync.WaitGroup
	for i := range workers {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for k := i; k < len(refs); k += workers {
				if _, _, err := f.m.Complete(f.ctx, refs[k], lease.Result{}); err != nil {
					errs <- fmt.Errorf("complete %s: %w", refs[k].JobID, err)
				}
			}
		}()
	}
	cw.Wait()
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n, err := f.store.DeleteEnded(f.ctx, future, jobs)
	if err != nil || deleted+n != jobs {
		t.Errorf("deleted %d, then %d (%v); want %d in all", deleted, n, err, jobs)
	}
	for _, ref := range refs {
		f.gone(ref.JobID)
	}
}
