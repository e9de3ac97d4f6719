package leasetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/lease/leasetest"
)

// The suite is only as good as the wrong stores it refuses. Each variant
// below is a MemoryStore with one mistake a real adapter made; the suite,
// run on it in a child process, must fail, and fail in the subtest that
// names the mistake. The last variant is right, though it looks odd: it
// retries its claims, and must pass.

// wrongStoreEnv names, in the child process, the variant to run the suite on.
const wrongStoreEnv = "LEASETEST_WRONG_STORE"

// all is a limit that takes every record a MemoryStore holds.
const all = 1 << 30

type variant struct {
	name     string
	newStore func() lease.Store
	// failing is the subtest of TestWrongStores that must fail, or "" if
	// the suite must pass.
	failing string
}

var variants = []variant{
	{"case-insensitive ids", func() lease.Store { return newFoldingStore(true) }, "Records/IDs"},
	{"ids in locale order", func() lease.Store { return newFoldingStore(false) }, "Records/IDs"},
	{"re-encoded payloads", func() lease.Store { return reencodingStore{lease.NewMemoryStore()} }, "Records/Payloads"},
	{"worker filter keeps finished jobs", func() lease.Store { return lastLeaseStore{lease.NewMemoryStore()} }, "Records/WorkerFilter"},
	{"limit <= 0 accepted", func() lease.Store { return unlimitedStore{lease.NewMemoryStore()} }, "Records/Limits"},
	{"plan called then rolled back", func() lease.Store { return retryingStore{lease.NewMemoryStore()} }, ""},
	{"PutWorker writes the approval", func() lease.Store { return approvalWritingStore{lease.NewMemoryStore()} }, "Approval/StoreKeepsApproval"},
	{"max runtime not stored", func() lease.Store { return runtimeDroppingStore{lease.NewMemoryStore()} }, "Bounds/MaxRuntimeCapsExtensions"},
	{"delete ignores its limit", func() lease.Store { return deleteAllStore{lease.NewMemoryStore()} }, "Retention/DeleteLimit"},
	{"delete includes the cutoff", func() lease.Store { return cutoffStore{lease.NewMemoryStore()} }, "Retention/DeletesEndedWithRecords"},
	{"tags not stored", func() lease.Store { return tagDroppingStore{lease.NewMemoryStore()} }, "Tags/PoolsRestrictLeases"},
	{"descending order ignored", func() lease.Store { return ascendingStore{lease.NewMemoryStore()} }, "Records/ListDescending"},
	{"offline ignores its cutoff", func() lease.Store { return offlineAnyStore{lease.NewMemoryStore()} }, "Liveness/OfflineJobsCutoff"},
	{"offline ignores the lease's time", func() lease.Store { return offlineWorkerStore{lease.NewMemoryStore()} }, "Liveness/OfflineJobsCutoff"},
}

// never is a cutoff after every time a test writes.
var never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// offlineAnyStore's OfflineJobs ignores its cutoff, as a query without
// its time filter does: every live lease of a stored worker.
type offlineAnyStore struct{ *lease.MemoryStore }

func (s offlineAnyStore) OfflineJobs(ctx context.Context, _ time.Time, limit int) ([]*lease.Job, error) {
	return s.MemoryStore.OfflineJobs(ctx, never, limit)
}

// offlineWorkerStore's OfflineJobs filters on the worker's LastSeenAt
// only, not on when the lease was granted or accepted, as a query that
// joins the workers and forgets the jobs' side does.
type offlineWorkerStore struct{ *lease.MemoryStore }

func (s offlineWorkerStore) OfflineJobs(ctx context.Context, cutoff time.Time, limit int) ([]*lease.Job, error) {
	if limit <= 0 {
		return s.MemoryStore.OfflineJobs(ctx, cutoff, limit)
	}
	js, err := s.MemoryStore.OfflineJobs(ctx, never, all)
	if err != nil {
		return nil, err
	}
	var out []*lease.Job
	for _, j := range js {
		w, err := s.MemoryStore.GetWorker(ctx, j.Lease.WorkerID)
		if err != nil {
			return nil, err
		}
		if !w.LastSeenAt.After(cutoff) && len(out) < limit {
			out = append(out, j)
		}
	}
	return out, nil
}

// ascendingStore ignores the Desc of its filters, as an adapter written
// before the field was added does: every list comes oldest first, past
// the cursor from below.
type ascendingStore struct{ *lease.MemoryStore }

func (s ascendingStore) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	f.Desc = false
	return s.MemoryStore.ListJobs(ctx, f)
}

func (s ascendingStore) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) ([]*lease.Artifact, error) {
	f.Desc = false
	return s.MemoryStore.ListArtifacts(ctx, f)
}

func (s ascendingStore) ListWorkers(ctx context.Context, f lease.WorkerFilter) ([]*lease.Worker, error) {
	f.Desc = false
	return s.MemoryStore.ListWorkers(ctx, f)
}

// tagDroppingStore keeps no requirements.tags, as an adapter whose table
// lacks the column does: every job is open to every worker.
type tagDroppingStore struct{ *lease.MemoryStore }

func (s tagDroppingStore) CreateJobs(ctx context.Context, js []*lease.Job) error {
	return s.MemoryStore.CreateJobs(ctx, edited(js, func(c *lease.Job) { c.Requirements.Tags = nil }))
}

// edited is copies of js, each changed by edit.
func edited(js []*lease.Job, edit func(*lease.Job)) []*lease.Job {
	out := make([]*lease.Job, len(js))
	for i, j := range js {
		c := *j
		edit(&c)
		out[i] = &c
	}
	return out
}

// deleteAllStore deletes every ended job before the cutoff, whatever the
// limit, as a DELETE without its LIMIT does.
type deleteAllStore struct{ *lease.MemoryStore }

func (s deleteAllStore) DeleteEnded(ctx context.Context, before time.Time, _ int) (int, error) {
	return s.MemoryStore.DeleteEnded(ctx, before, all)
}

// cutoffStore also deletes the jobs that ended at the cutoff, as
// finished_at <= ? does.
type cutoffStore struct{ *lease.MemoryStore }

func (s cutoffStore) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.MemoryStore.DeleteEnded(ctx, before.Add(time.Microsecond), limit)
}

// runtimeDroppingStore keeps no max_runtime_seconds, as an adapter whose
// table lacks the column does: every job runs for the default.
type runtimeDroppingStore struct{ *lease.MemoryStore }

func (s runtimeDroppingStore) CreateJobs(ctx context.Context, js []*lease.Job) error {
	return s.MemoryStore.CreateJobs(ctx, edited(js, func(c *lease.Job) { c.Requirements.MaxRuntimeSeconds = 0 }))
}

// approvalWritingStore's PutWorker writes the whole record, approval
// included, as an UPSERT that updates every column does: a heartbeat that
// read the worker before an approval undoes it.
type approvalWritingStore struct{ *lease.MemoryStore }

func (s approvalWritingStore) PutWorker(ctx context.Context, w *lease.Worker) error {
	if err := s.MemoryStore.PutWorker(ctx, w); err != nil {
		return err
	}
	stored, err := s.MemoryStore.GetWorker(ctx, w.ID)
	if err != nil {
		return err
	}
	return s.MemoryStore.SetApproval(ctx, w.ID, stored.Approval.At, w.Approval)
}

// TestWrongStores runs the suite on each variant in a child process (the
// test binary again, with wrongStoreEnv set) and checks how it ended.
func TestWrongStores(t *testing.T) {
	t.Parallel()
	if name := os.Getenv(wrongStoreEnv); name != "" {
		i := slices.IndexFunc(variants, func(v variant) bool { return v.name == name })
		if i < 0 {
			t.Fatalf("no variant %q", name)
		}
		leasetest.Run(t, func(*testing.T) lease.Store { return variants[i].newStore() })
		return
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestWrongStores$", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), wrongStoreEnv+"="+v.name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatalf("running the suite on %q: %v", v.name, err)
			}
			if strings.Contains(string(out), "panic:") {
				t.Fatalf("the suite panicked on %q:\n%s", v.name, out)
			}
			if v.failing == "" {
				if err != nil {
					t.Fatalf("the suite refused %q, a right store (%v):\n%s", v.name, err, out)
				}
				if !strings.Contains(string(out), "PASS") {
					t.Fatalf("the suite on %q did not say PASS:\n%s", v.name, out)
				}
				return
			}
			if err == nil || exit.ExitCode() == 0 {
				t.Fatalf("the suite passed %q, a wrong store:\n%s", v.name, out)
			}
			if want := "--- FAIL: TestWrongStores/" + v.failing + " ("; !strings.Contains(string(out), want) {
				t.Fatalf("the suite refused %q, but not in %s:\n%s", v.name, v.failing, out)
			}
		})
	}
}

// foldingStore orders job ids by their lowercase form, as a column with a
// linguistic collation does. Folded, it also compares them so, as a
// case-insensitive collation (MySQL's utf8mb4_general_ci) does: Job-A and
// job-a are one job. Unfolded, ids equal but for case are two jobs, as in
// PostgreSQL's en_US.UTF-8, but still out of byte order.
type foldingStore struct {
	*lease.MemoryStore
	folded bool
	mu     sync.Mutex
	known  map[string]string // folded id -> stored id, when folded
}

func newFoldingStore(folded bool) *foldingStore {
	return &foldingStore{MemoryStore: lease.NewMemoryStore(), folded: folded, known: map[string]string{}}
}

func fold(id string) string { return strings.ToLower(id) }

// compare orders ids by their folded form, then, unless folded, as bytes.
func (s *foldingStore) compare(a, b string) int {
	if c := strings.Compare(fold(a), fold(b)); c != 0 || s.folded {
		return c
	}
	return strings.Compare(a, b)
}

func (s *foldingStore) CreateJobs(ctx context.Context, js []*lease.Job) error {
	if !s.folded {
		return s.MemoryStore.CreateJobs(ctx, js)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range js {
		if _, ok := s.known[fold(j.ID)]; ok {
			return lease.ErrConflict
		}
	}
	if err := s.MemoryStore.CreateJobs(ctx, js); err != nil {
		return err
	}
	for _, j := range js {
		s.known[fold(j.ID)] = j.ID
	}
	return nil
}

func (s *foldingStore) stored(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sid, ok := s.known[fold(id)]; ok {
		return sid
	}
	return id
}

func (s *foldingStore) GetJob(ctx context.Context, id string) (*lease.Job, error) {
	return s.MemoryStore.GetJob(ctx, s.stored(id))
}

func (s *foldingStore) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	if f.Limit <= 0 {
		return nil, lease.ErrInvalidArgument
	}
	after, limit := f.After, f.Limit
	f.After, f.Limit = "", all
	js, err := s.MemoryStore.ListJobs(ctx, f)
	if err != nil {
		return nil, err
	}
	js = slices.DeleteFunc(js, func(j *lease.Job) bool { return s.compare(j.ID, after) <= 0 })
	slices.SortStableFunc(js, func(a, b *lease.Job) int { return s.compare(a.ID, b.ID) })
	return js[:min(limit, len(js))], nil
}

// reencodingStore keeps a job's JSON as a JSON column does, decoded and
// encoded again: compact, keys sorted, duplicates dropped, HTML escaped.
type reencodingStore struct{ *lease.MemoryStore }

func reencode(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

func reencodeJob(j *lease.Job) *lease.Job {
	c := *j
	c.Payload = reencode(j.Payload)
	if j.LastError != nil {
		e := *j.LastError
		e.Payload = reencode(e.Payload)
		c.LastError = &e
	}
	if j.Result != nil {
		r := *j.Result
		r.Metrics = reencode(r.Metrics)
		c.Result = &r
	}
	return &c
}

func (s reencodingStore) CreateJobs(ctx context.Context, js []*lease.Job) error {
	return s.MemoryStore.CreateJobs(ctx, edited(js, func(c *lease.Job) { *c = *reencodeJob(c) }))
}

func (s reencodingStore) UpdateJob(ctx context.Context, j *lease.Job, rev int64) error {
	return s.MemoryStore.UpdateJob(ctx, reencodeJob(j), rev)
}

// lastLeaseStore filters by worker on the job's last lease, whatever the
// job's state: WHERE lease_worker_id = ?, without the state.
type lastLeaseStore struct{ *lease.MemoryStore }

func (s lastLeaseStore) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	if f.WorkerID == "" || f.Limit <= 0 {
		return s.MemoryStore.ListJobs(ctx, f)
	}
	worker, limit := f.WorkerID, f.Limit
	f.WorkerID, f.Limit = "", all
	js, err := s.MemoryStore.ListJobs(ctx, f)
	if err != nil {
		return nil, err
	}
	js = slices.DeleteFunc(js, func(j *lease.Job) bool { return j.Lease == nil || j.Lease.WorkerID != worker })
	return js[:min(limit, len(js))], nil
}

// unlimitedStore reads a limit <= 0 as "no limit", and claims nothing
// with one.
type unlimitedStore struct{ *lease.MemoryStore }

func unlimited(limit int) int {
	if limit <= 0 {
		return all
	}
	return limit
}

func (s unlimitedStore) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	f.Limit = unlimited(f.Limit)
	return s.MemoryStore.ListJobs(ctx, f)
}

func (s unlimitedStore) ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*lease.Job, error) {
	return s.MemoryStore.ExpiredJobs(ctx, now, unlimited(limit))
}

func (s unlimitedStore) OfflineJobs(ctx context.Context, cutoff time.Time, limit int) ([]*lease.Job, error) {
	return s.MemoryStore.OfflineJobs(ctx, cutoff, unlimited(limit))
}

func (s unlimitedStore) ListEvents(ctx context.Context, jobID string, after int64, limit int) ([]*lease.Event, error) {
	return s.MemoryStore.ListEvents(ctx, jobID, after, unlimited(limit))
}

func (s unlimitedStore) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) ([]*lease.Artifact, error) {
	f.Limit = unlimited(f.Limit)
	return s.MemoryStore.ListArtifacts(ctx, f)
}

func (s unlimitedStore) ListWorkers(ctx context.Context, f lease.WorkerFilter) ([]*lease.Worker, error) {
	f.Limit = unlimited(f.Limit)
	return s.MemoryStore.ListWorkers(ctx, f)
}

func (s unlimitedStore) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	return s.MemoryStore.ClaimLeases(ctx, workerID, func(w *lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
		q, c, ok, err := plan(w)
		return q, c, ok && q.Limit > 0, err
	})
}

// retryingStore claims as a store does that retries after the database
// aborted its transaction (a deadlock on InnoDB): a first attempt calls
// plan, then is rolled back (here: its plan is dropped), and a second
// attempt plans again and claims for real. That is allowed, and the suite
// must pass it.
type retryingStore struct{ *lease.MemoryStore }

func (s retryingStore) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	w, err := s.MemoryStore.GetWorker(ctx, workerID)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := plan(w); err != nil {
		return nil, err
	}
	return s.MemoryStore.ClaimLeases(ctx, workerID, plan)
}
