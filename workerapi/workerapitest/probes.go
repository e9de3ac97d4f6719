package workerapitest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi"
)

// epoch is the time of every record, truncated to microseconds as the
// Managers truncate.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC)

// limit is the page size of every list the suite reads: more than any
// case stores.
const limit = 100

// groups lists the stores and their write methods, in the order of
// workerapi.Stores.
var groups = []group{
	{"Leases", []write{
		{"CreateJobs", probeCreateJob},
		{"UpdateJob", probeUpdateJob},
		{"ClaimLeases", probeClaimLeases},
		{"AcceptLeased", probeAcceptLeased},
		{"CompleteRunning", probeCompleteRunning},
		{"AddEvents", probeAddEvents},
		{"AddArtifact", probeAddArtifact},
		{"PutWorker", probePutWorker},
		{"SetApproval", probeSetApproval},
		{"DeleteEnded", probeDeleteEnded},
		{"PutAnswer", probePutAnswer},
		{"DeleteAnswers", probeDeleteAnswers},
		{"SetDrain", probeSetDrain},
		{"Heartbeat", probeHeartbeat},
	}},
	{"Credentials", []write{
		{"CreatePrincipal", probeCreatePrincipal},
		{"UpdatePrincipal", probeUpdatePrincipal},
		{"CreateCredential", probeCreateCredential},
		{"UpdateCredential", probeUpdateCredential},
		{"ChargeQuota", probeChargeQuota},
	}},
	{"Nonces", []write{
		{"Insert", probeInsert},
		{"Collect", probeCollect},
	}},
	{"Envelope", []write{
		{"Apply", probeApply},
	}},
	{"Receipts", []write{
		{"AddReceipt", probeAddReceipt},
		{"AddReceipts", probeAddReceipts},
		{"Sequence", probeSequence},
		{"AddCheckpoint", probeAddCheckpoint},
	}},
	{"Fingerprints", []write{
		{"Add", probeAdd},
	}},
}

// name returns a record name of instance i: "workerapitest-job-a".
func name(kind string, i int) string { return fmt.Sprintf("workerapitest-%s-%c", kind, 'a'+i) }

// present turns the error of a read by key into whether it found the
// record: notFound is the store's ErrNotFound.
func present(err, notFound error) (bool, error) {
	if errors.Is(err, notFound) {
		return false, nil
	}
	return err == nil, err
}

// always accepts any record that a read found.
func always[T any](*T) bool { return true }

// ---- lease.Store

// newJob returns a queued job of type typ, as lease.Manager.Enqueue
// makes one.
func newJob(id, typ string) *lease.Job {
	return &lease.Job{
		ID: id, Type: typ, State: lease.StateQueued, Attempt: 1, MaxAttempts: 3,
		CreatedAt: epoch, ScheduledAt: epoch, Rev: 1,
	}
}

// createJob commits a queued job for a write that needs one.
func createJob(ctx context.Context, s lease.Store, i int) (string, error) {
	id := name("job", i)
	if err := s.CreateJobs(ctx, []*lease.Job{newJob(id, "status_check")}); err != nil {
		return "", fmt.Errorf("CreateJobs: %w", err)
	}
	return id, nil
}

// getJob checks, through GetJob, for a job that satisfies ok.
func getJob(s lease.Store, id string, ok func(*lease.Job) bool) check {
	return check{"GetJob", func(ctx context.Context) (bool, error) {
		j, err := s.GetJob(ctx, id)
		exists, err := present(err, lease.ErrNotFound)
		return exists && ok(j), err
	}}
}

// listJobs checks, through ListJobs with filter f, for job id.
func listJobs(s lease.Store, read string, f lease.JobFilter, id string) check {
	return check{read, func(ctx context.Context) (bool, error) {
		js, err := s.ListJobs(ctx, f)
		return slices.ContainsFunc(js, func(j *lease.Job) bool { return j.ID == id }), err
	}}
}

func probeCreateJob(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, id := st.Leases, name("job", i)
	return &probe{
		do: func(ctx context.Context) error { return s.CreateJobs(ctx, []*lease.Job{newJob(id, "status_check")}) },
		checks: []check{
			getJob(s, id, always),
			listJobs(s, "ListJobs", lease.JobFilter{Limit: limit}, id),
		},
	}, nil
}

func probeUpdateJob(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Leases
	id, err := createJob(ctx, s, i)
	if err != nil {
		return nil, err
	}
	return &probe{
		// An operator's cancel of a queued job.
		do: func(ctx context.Context) error {
			j := newJob(id, "status_check")
			at := epoch
			j.State, j.FinishedAt, j.Rev = lease.StateCanceled, &at, 2
			return s.UpdateJob(ctx, j, 1)
		},
		checks: []check{
			getJob(s, id, func(j *lease.Job) bool { return j.State == lease.StateCanceled && j.Rev == 2 }),
			listJobs(s, "ListJobs(State)", lease.JobFilter{State: lease.StateCanceled, Limit: limit}, id),
		},
	}, nil
}

func probeClaimLeases(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Leases
	// A job type and a worker of the instance's own, so that the claims
	// of two instances take one job each.
	id, typ, worker := name("job", i), name("type", i), name("worker", i)
	if err := s.CreateJobs(ctx, []*lease.Job{newJob(id, typ)}); err != nil {
		return nil, fmt.Errorf("CreateJobs: %w", err)
	}
	if err := s.PutWorker(ctx, &lease.Worker{ID: worker, NodeID: name("claimer-node", i), RegisteredAt: epoch, LastSeenAt: epoch}); err != nil {
		return nil, fmt.Errorf("PutWorker: %w", err)
	}
	return &probe{
		do: func(ctx context.Context) error {
			js, err := s.ClaimLeases(ctx, worker, claimPlan(worker, typ, i, false))
			if err != nil {
				return err
			}
			if len(js) != 1 || js[0].ID != id {
				return fmt.Errorf("ClaimLeases claimed %d jobs, want the one queued job %s", len(js), id)
			}
			return nil
		},
		checks: []check{
			getJob(s, id, func(j *lease.Job) bool {
				return j.State == lease.StateLeased && j.Lease != nil && j.Lease.WorkerID == worker
			}),
			listJobs(s, "ListJobs(WorkerID)", lease.JobFilter{WorkerID: worker, Limit: limit}, id),
			{"ExpiredJobs", func(ctx context.Context) (bool, error) {
				js, err := s.ExpiredJobs(ctx, epoch.Add(time.Hour), limit)
				return slices.ContainsFunc(js, func(j *lease.Job) bool { return j.ID == id }), err
			}},
		},
	}, nil
}

// claimPlan is the plan of a claim of one job of type typ for worker,
// under instance i's lease, whose token hash is leaseHash(i).
func claimPlan(worker, typ string, i int, accept bool) func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
	return func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
		return lease.ClaimQuery{WorkerID: worker, Types: []string{typ}, Fits: []lease.Fit{{}}, MaxActive: 1, Limit: 1, Now: epoch},
			lease.LeaseClaim{Accept: accept, MaxRuntime: time.Hour, Leases: []lease.Lease{{ID: name("lease", i), WorkerID: worker,
				TokenHash: leaseHash(i), ExpiresAt: epoch.Add(10 * time.Minute), AcceptBy: epoch.Add(time.Minute), PolicyVersion: envelope.InitialVersion}}}, true, nil
	}
}

// leaseHash is the token hash of instance i's lease.
func leaseHash(i int) []byte {
	h := sha256.Sum256([]byte(name("token", i)))
	return h[:]
}

// claimJob commits a job of instance i claimed by a worker of its own,
// running if accept, and returns the guard of its lease at epoch.
func claimJob(ctx context.Context, s lease.Store, i int, accept bool) (lease.Guard, error) {
	id, worker := name("job", i), name("worker", i)
	if err := s.CreateJobs(ctx, []*lease.Job{newJob(id, "status_check")}); err != nil {
		return lease.Guard{}, fmt.Errorf("CreateJobs: %w", err)
	}
	if err := s.PutWorker(ctx, &lease.Worker{ID: worker, NodeID: name("node", i), RegisteredAt: epoch, LastSeenAt: epoch}); err != nil {
		return lease.Guard{}, fmt.Errorf("PutWorker: %w", err)
	}
	js, err := s.ClaimLeases(ctx, worker, claimPlan(worker, "status_check", i, accept))
	if err == nil && len(js) != 1 {
		err = fmt.Errorf("claimed %d jobs, want 1", len(js))
	}
	if err != nil {
		return lease.Guard{}, fmt.Errorf("ClaimLeases: %w", err)
	}
	return lease.Guard{JobID: id, WorkerID: worker, TokenHash: leaseHash(i), Now: epoch}, nil
}

// guardedProbe is the probe of a guarded write that takes the job of g
// into state want.
func guardedProbe(s lease.Store, g lease.Guard, want lease.State, write func(ctx context.Context) ([]*lease.Job, error)) *probe {
	return &probe{
		do: func(ctx context.Context) error {
			js, err := write(ctx)
			if err == nil && (len(js) != 1 || js[0] == nil) {
				err = fmt.Errorf("the write's guard did not hold: %v", js)
			}
			return err
		},
		checks: []check{
			getJob(s, g.JobID, func(j *lease.Job) bool { return j.State == want }),
			listJobs(s, "ListJobs(State)", lease.JobFilter{State: want, Limit: limit}, g.JobID),
		},
	}
}

func probeAcceptLeased(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	g, err := claimJob(ctx, st.Leases, i, false)
	if err != nil {
		return nil, err
	}
	return guardedProbe(st.Leases, g, lease.StateRunning, func(ctx context.Context) ([]*lease.Job, error) {
		return st.Leases.AcceptLeased(ctx, []lease.AcceptWrite{{Guard: g, TTL: time.Minute, MaxRuntime: time.Hour}})
	}), nil
}

func probeCompleteRunning(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	g, err := claimJob(ctx, st.Leases, i, true)
	if err != nil {
		return nil, err
	}
	return guardedProbe(st.Leases, g, lease.StateSucceeded, func(ctx context.Context) ([]*lease.Job, error) {
		return st.Leases.CompleteRunning(ctx, []lease.CompleteWrite{{Guard: g, MaxRuntime: time.Hour}})
	}), nil
}

func probeAddEvents(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Leases
	id, err := createJob(ctx, s, i)
	if err != nil {
		return nil, err
	}
	return &probe{
		do: func(ctx context.Context) error {
			n, err := s.AddEvents(ctx, []*lease.Event{{JobID: id, Kind: lease.EventLog, Message: "probe", Seq: 1, CreatedAt: epoch}})
			if err == nil && n != 1 {
				err = fmt.Errorf("AddEvents stored %d events, want 1", n)
			}
			return err
		},
		checks: []check{{"ListEvents", func(ctx context.Context) (bool, error) {
			evs, err := s.ListEvents(ctx, id, 0, limit)
			return len(evs) > 0, err
		}}},
	}, nil
}

func probeAddArtifact(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Leases
	job, err := createJob(ctx, s, i)
	if err != nil {
		return nil, err
	}
	id := name("artifact", i)
	return &probe{
		do: func(ctx context.Context) error {
			return s.AddArtifact(ctx, &lease.Artifact{
				ID: id, JobID: job, WorkerID: name("worker", i), Epoch: 1, Type: "adapter", Name: "adapter.safetensors",
				URI: "file:///adapter.safetensors", CreatedAt: epoch,
			})
		},
		checks: []check{{"ListArtifacts", func(ctx context.Context) (bool, error) {
			as, err := s.ListArtifacts(ctx, lease.ArtifactFilter{JobID: job, Limit: limit})
			return slices.ContainsFunc(as, func(a *lease.Artifact) bool { return a.ID == id }), err
		}}},
	}, nil
}

func probeDeleteEnded(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, id := st.Leases, name("job", i)
	// A job canceled i hours after epoch, with an event and an artifact;
	// instance i deletes the one job that ended before its cutoff and
	// that no earlier instance deleted.
	j := newJob(id, "status_check")
	ended := epoch.Add(time.Duration(i) * time.Hour)
	j.State, j.FinishedAt = lease.StateCanceled, &ended
	if err := s.CreateJobs(ctx, []*lease.Job{j}); err != nil {
		return nil, fmt.Errorf("CreateJobs: %w", err)
	}
	if _, err := s.AddEvents(ctx, []*lease.Event{{JobID: id, Kind: lease.EventStatus, Type: "canceled", CreatedAt: ended}}); err != nil {
		return nil, fmt.Errorf("AddEvents: %w", err)
	}
	if err := s.AddArtifact(ctx, &lease.Artifact{ID: name("artifact", i), JobID: id, Type: "log", Name: "out.txt", CreatedAt: ended}); err != nil {
		return nil, fmt.Errorf("AddArtifact: %w", err)
	}
	return &probe{
		do: func(ctx context.Context) error {
			n, err := s.DeleteEnded(ctx, ended.Add(time.Minute), 1)
			if err == nil && n != 1 {
				err = fmt.Errorf("DeleteEnded deleted %d jobs, want the one job %s", n, id)
			}
			return err
		},
		// Each check sees the write when the record is gone.
		checks: []check{
			{"GetJob", func(ctx context.Context) (bool, error) {
				_, err := s.GetJob(ctx, id)
				exists, err := present(err, lease.ErrNotFound)
				return !exists && err == nil, err
			}},
			{"ListEvents", func(ctx context.Context) (bool, error) {
				evs, err := s.ListEvents(ctx, id, 0, limit)
				return len(evs) == 0 && err == nil, err
			}},
			{"ListArtifacts", func(ctx context.Context) (bool, error) {
				as, err := s.ListArtifacts(ctx, lease.ArtifactFilter{JobID: id, Limit: limit})
				return len(as) == 0 && err == nil, err
			}},
		},
	}, nil
}

func probePutWorker(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, id, node := st.Leases, name("worker", i), name("node", i)
	return &probe{
		do: func(ctx context.Context) error {
			return s.PutWorker(ctx, &lease.Worker{
				ID: id, NodeID: node, Name: node, Hostname: node, Role: "gpu", Version: "1",
				HeartbeatInterval: 30, Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}},
				Governor: lease.Governor{MaxJobs: 1}, PolicyVersion: envelope.InitialVersion, Status: "idle",
				RegisteredAt: epoch, LastSeenAt: epoch,
			})
		},
		checks: workerChecks(s, id, node, always),
	}, nil
}

// workerChecks checks, through every read of workers, for worker id, of
// node node, that satisfies ok.
func workerChecks(s lease.Store, id, node string, ok func(*lease.Worker) bool) []check {
	return []check{
		{"GetWorker", func(ctx context.Context) (bool, error) {
			w, err := s.GetWorker(ctx, id)
			exists, err := present(err, lease.ErrNotFound)
			return exists && ok(w), err
		}},
		{"WorkerByNode", func(ctx context.Context) (bool, error) {
			w, err := s.WorkerByNode(ctx, node)
			exists, err := present(err, lease.ErrNotFound)
			return exists && ok(w), err
		}},
		{"ListWorkers", func(ctx context.Context) (bool, error) {
			ws, err := s.ListWorkers(ctx, lease.WorkerFilter{Limit: limit})
			return slices.ContainsFunc(ws, func(w *lease.Worker) bool { return w.ID == id && ok(w) }), err
		}},
	}
}

func probeSetApproval(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, id, node := st.Leases, name("approved", i), name("approved-node", i)
	if err := s.PutWorker(ctx, &lease.Worker{
		ID: id, NodeID: node, Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}},
		RegisteredAt: epoch, LastSeenAt: epoch, Approval: lease.Approval{Pending: true},
	}); err != nil {
		return nil, fmt.Errorf("PutWorker: %w", err)
	}
	at := epoch
	approved := func(w *lease.Worker) bool { return !w.Approval.Pending && w.Approval.At != nil }
	return &probe{
		// An operator's approval of a pending node.
		do: func(ctx context.Context) error {
			return s.SetApproval(ctx, id, nil, lease.Approval{At: &at, By: "operator", JobTypes: []string{"status_check"}})
		},
		checks: workerChecks(s, id, node, approved),
	}, nil
}

// newAnswer returns instance i's answer, given at epoch under a key of
// its own and forgotten at expires.
func newAnswer(i int, expires time.Time) *lease.Answer {
	key, digest := sha256.Sum256([]byte(name("answer", i))), sha256.Sum256([]byte(name("request", i)))
	return &lease.Answer{
		Key: key[:], WorkerID: name("worker", i), Digest: digest[:], Status: 200, Body: []byte("sealed"),
		CreatedAt: epoch, ExpiresAt: expires,
	}
}

func probePutAnswer(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, a := st.Leases, newAnswer(i, epoch.Add(time.Hour))
	return &probe{
		do: func(ctx context.Context) error { return s.PutAnswer(ctx, a) },
		checks: []check{{"GetAnswer", func(ctx context.Context) (bool, error) {
			_, err := s.GetAnswer(ctx, a.Key, epoch)
			return present(err, lease.ErrNotFound)
		}}},
	}, nil
}

// probeDeleteAnswers gives instance i an answer that expires i+1 hours
// after epoch, and deletes, at that time, the one answer that expired and
// that no earlier instance deleted. The answer is gone when GetAnswer at
// epoch, before any expired, does not find it.
func probeDeleteAnswers(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, a := st.Leases, newAnswer(i, epoch.Add(time.Duration(i+1)*time.Hour))
	if err := s.PutAnswer(ctx, a); err != nil {
		return nil, fmt.Errorf("PutAnswer: %w", err)
	}
	return &probe{
		do: func(ctx context.Context) error {
			n, err := s.DeleteAnswers(ctx, a.ExpiresAt, limit)
			if err == nil && n != 1 {
				err = fmt.Errorf("DeleteAnswers deleted %d answers, want the one that expired", n)
			}
			return err
		},
		checks: []check{{"GetAnswer", func(ctx context.Context) (bool, error) {
			_, err := s.GetAnswer(ctx, a.Key, epoch)
			exists, err := present(err, lease.ErrNotFound)
			return !exists && err == nil, err
		}}},
	}, nil
}

// probeSetDrain requests that instance i's worker drain, as an operator
// does, when the store is a lease.DrainStore.
func probeSetDrain(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	ds, ok := st.Leases.(lease.DrainStore)
	if !ok {
		return nil, &notImplemented{"lease.DrainStore"}
	}
	s, id, node := st.Leases, name("drained", i), name("drained-node", i)
	if err := s.PutWorker(ctx, &lease.Worker{ID: id, NodeID: node, RegisteredAt: epoch, LastSeenAt: epoch}); err != nil {
		return nil, fmt.Errorf("PutWorker: %w", err)
	}
	return &probe{
		do: func(ctx context.Context) error {
			return ds.SetDrain(ctx, id, &lease.DrainRequest{At: epoch, By: "operator"})
		},
		checks: workerChecks(s, id, node, func(w *lease.Worker) bool { return w.Drain != nil }),
	}, nil
}

// probeHeartbeat records a heartbeat of instance i's worker, a minute
// after it registered idle, when the store is a lease.HeartbeatStore.
func probeHeartbeat(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	hs, ok := st.Leases.(lease.HeartbeatStore)
	if !ok {
		return nil, &notImplemented{"lease.HeartbeatStore"}
	}
	s, id, node := st.Leases, name("beating", i), name("beating-node", i)
	if err := s.PutWorker(ctx, &lease.Worker{ID: id, NodeID: node, Status: "idle", RegisteredAt: epoch, LastSeenAt: epoch}); err != nil {
		return nil, fmt.Errorf("PutWorker: %w", err)
	}
	at := epoch.Add(time.Minute)
	beat := func(w *lease.Worker) bool { return w.Status == "busy" && w.LastSeenAt.Equal(at) }
	return &probe{
		do: func(ctx context.Context) error {
			w, err := hs.Heartbeat(ctx, id, "busy", nil, at)
			if err == nil && !beat(w) {
				err = fmt.Errorf("the worker that Heartbeat returned is %s, last seen at %v, want busy, last seen at %v", w.Status, w.LastSeenAt, at)
			}
			return err
		},
		checks: workerChecks(s, id, node, beat),
	}, nil
}

// ---- credential.Store

func newPrincipal(i int) *credential.Principal {
	return &credential.Principal{ID: name("principal", i), Kind: credential.KindOperator, Name: "probe", CreatedAt: epoch, Rev: 1}
}

func newCredential(i int) *credential.Credential {
	digest := sha256.Sum256([]byte(name("secret", i)))
	return &credential.Credential{
		ID: fmt.Sprintf("%032x", 0xa0+i), PrincipalID: name("principal", i), Scopes: []credential.Scope{credential.ScopeOperatorJobs},
		Digest: digest[:], PepperVersion: 1, CreatedAt: epoch, ExpiresAt: epoch.Add(24 * time.Hour), Rev: 1,
	}
}

func getPrincipal(s credential.Store, id string, ok func(*credential.Principal) bool) check {
	return check{"GetPrincipal", func(ctx context.Context) (bool, error) {
		p, err := s.GetPrincipal(ctx, id)
		exists, err := present(err, credential.ErrNotFound)
		return exists && ok(p), err
	}}
}

func credentialChecks(s credential.Store, c *credential.Credential, ok func(*credential.Credential) bool) []check {
	return []check{
		{"GetCredential", func(ctx context.Context) (bool, error) {
			got, err := s.GetCredential(ctx, c.ID)
			exists, err := present(err, credential.ErrNotFound)
			return exists && ok(got), err
		}},
		{"ListCredentials", func(ctx context.Context) (bool, error) {
			cs, err := s.ListCredentials(ctx, credential.CredentialFilter{PrincipalID: c.PrincipalID, Limit: 1000})
			return slices.ContainsFunc(cs, func(got *credential.Credential) bool { return got.ID == c.ID && ok(got) }), err
		}},
	}
}

func probeCreatePrincipal(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, p := st.Credentials, newPrincipal(i)
	return &probe{
		do:     func(ctx context.Context) error { return s.CreatePrincipal(ctx, p) },
		checks: []check{getPrincipal(s, p.ID, always)},
	}, nil
}

func probeUpdatePrincipal(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, p := st.Credentials, newPrincipal(i)
	if err := s.CreatePrincipal(ctx, p); err != nil {
		return nil, fmt.Errorf("CreatePrincipal: %w", err)
	}
	return &probe{
		// A ban.
		do: func(ctx context.Context) error {
			b := *p
			at := epoch
			b.Banned, b.BanReason, b.BannedAt, b.Rev = true, "probe", &at, 2
			return s.UpdatePrincipal(ctx, &b, 1)
		},
		checks: []check{getPrincipal(s, p.ID, func(p *credential.Principal) bool { return p.Banned && p.Rev == 2 })},
	}, nil
}

func probeCreateCredential(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, c := st.Credentials, newCredential(i)
	if err := s.CreatePrincipal(ctx, newPrincipal(i)); err != nil {
		return nil, fmt.Errorf("CreatePrincipal: %w", err)
	}
	return &probe{
		do:     func(ctx context.Context) error { return s.CreateCredential(ctx, c) },
		checks: credentialChecks(s, c, always),
	}, nil
}

func probeUpdateCredential(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, c := st.Credentials, newCredential(i)
	if err := s.CreatePrincipal(ctx, newPrincipal(i)); err != nil {
		return nil, fmt.Errorf("CreatePrincipal: %w", err)
	}
	if err := s.CreateCredential(ctx, c); err != nil {
		return nil, fmt.Errorf("CreateCredential: %w", err)
	}
	return &probe{
		// A revocation.
		do: func(ctx context.Context) error {
			r := *c
			at := epoch
			r.RevokedAt, r.Rev = &at, 2
			return s.UpdateCredential(ctx, &r, 1)
		},
		checks: credentialChecks(s, c, func(c *credential.Credential) bool { return c.RevokedAt != nil && c.Rev == 2 }),
	}, nil
}

// probeChargeQuota charges instance i's quota of one unit an hour, which
// no charge used yet, with its one unit. A credential.Store has no read
// of quotas: a charge of one more unit, at the same time, is the read,
// which sees the write when it does not fit. (When it fits, it counts
// its unit, and a later read sees that unit as the write's; but a read
// that missed the write has failed its case already, and no case reads
// a rolled-back write twice.)
func probeChargeQuota(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Credentials
	c := credential.QuotaCharge{PrincipalID: name("principal", i), Name: "workerapitest", N: 1, Limit: 1, Window: time.Hour, Now: epoch}
	return &probe{
		do: func(ctx context.Context) error {
			q, ok, err := s.ChargeQuota(ctx, c)
			if err == nil && (!ok || q.Used != 1) {
				err = fmt.Errorf("ChargeQuota of the first unit of a quota of 1 returned ok %v with %d units used, want true with 1", ok, q.Used)
			}
			return err
		},
		checks: []check{{"ChargeQuota of one more unit", func(ctx context.Context) (bool, error) {
			q, ok, err := s.ChargeQuota(ctx, c)
			return err == nil && !ok && q.Used == 1, err
		}}},
	}, nil
}

// ---- replay.Store

// A NonceStore has no read method: Insert of a pair it holds is the read.

// insertAgain checks for a live nonce by inserting it again: a store that
// holds it answers replay.ErrReplayedNonce.
func insertAgain(s replay.Store, node, nonce string, expires, now time.Time) check {
	return check{"Insert of the same nonce", func(ctx context.Context) (bool, error) {
		err := s.Insert(ctx, node, nonce, expires, now)
		if errors.Is(err, replay.ErrReplayedNonce) {
			return true, nil
		}
		return false, err
	}}
}

func probeInsert(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, node, nonce := st.Nonces, name("node", i), name("nonce", i)
	expires := epoch.Add(5 * time.Minute)
	return &probe{
		do:     func(ctx context.Context) error { return s.Insert(ctx, node, nonce, expires, epoch) },
		checks: []check{insertAgain(s, node, nonce, expires, epoch)},
	}, nil
}

// probeCollect gives each instance a window of its own: instance i's nonce
// expires at epoch + 2i+1 minutes and is collected at epoch + 2i+2
// minutes, so that collecting it leaves instance i+1's nonce alone.
func probeCollect(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Nonces
	expires := epoch.Add(time.Duration(2*i+1) * time.Minute)
	at := expires.Add(time.Minute)
	if err := s.Insert(ctx, name("node", i), name("nonce", i), expires, epoch); err != nil {
		return nil, fmt.Errorf("calling Insert: %w", err)
	}
	return &probe{
		do: func(ctx context.Context) error {
			n, err := s.Collect(ctx, at)
			if err == nil && n != 1 {
				err = fmt.Errorf("the store's Collect deleted %d nonces, want the 1 that expired", n)
			}
			return err
		},
		// Collecting again at the same time finds nothing if the first
		// Collect's deletion is seen. (After a rollback it deletes the
		// nonce again, which ends the case.)
		checks: []check{{"Collect at the same time", func(ctx context.Context) (bool, error) {
			n, err := s.Collect(ctx, at)
			return n == 0, err
		}}},
	}, nil
}

// ---- envelope.Store

// probeApply activates the runtime from whatever version the transaction
// sees, so that a nested instance applies on top of the outer one.
func probeApply(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, reason := st.Envelope, name("activation", i)
	var version int64 // the version the write made
	return &probe{
		do: func(ctx context.Context) error {
			cur, err := s.State(ctx)
			if err != nil {
				return fmt.Errorf("calling State: %w", err)
			}
			version = cur.Version + 1
			next := envelope.State{Version: version, Active: true, By: "workerapitest", Reason: reason, ChangedAt: epoch}
			rec := envelope.Record{Version: version, Action: envelope.ActionActivate, By: "workerapitest", Reason: reason, At: epoch}
			return s.Apply(ctx, cur.Version, next, rec)
		},
		checks: []check{
			{"State", func(ctx context.Context) (bool, error) {
				cur, err := s.State(ctx)
				return cur.Version >= version, err
			}},
			{"History", func(ctx context.Context) (bool, error) {
				rs, err := s.History(ctx, 0, limit)
				return slices.ContainsFunc(rs, func(r envelope.Record) bool { return r.Version == version && r.Reason == reason }), err
			}},
		},
	}, nil
}

// ---- receipts.Store

// newLog returns a Log over s that mints at epoch.
func newLog(s receipts.Store) *receipts.Log {
	return receipts.NewLog(s, &receipts.Config{Now: func() time.Time { return epoch }})
}

// newReceipt returns instance i's receipt: an operator's deactivation, a
// kind with few fields.
func newReceipt(i int) receipts.Receipt {
	return receipts.Receipt{
		ID: fmt.Sprintf("rcp_%032x", 0xa0+i), Kind: receipts.KindEnvelopeDeactivated,
		PolicyVersion: envelope.InitialVersion, Actor: "workerapitest", Reason: name("receipt", i),
	}
}

func getReceipt(s receipts.Store, id string, ok func(*receipts.Stored) bool) check {
	return check{"GetReceipt", func(ctx context.Context) (bool, error) {
		r, err := s.GetReceipt(ctx, id)
		exists, err := present(err, receipts.ErrNotFound)
		return exists && ok(r), err
	}}
}

func probeAddReceipt(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, r := st.Receipts, newReceipt(i)
	return &probe{
		do: func(ctx context.Context) error {
			_, err := newLog(s).Mint(ctx, r)
			return err
		},
		checks: []check{getReceipt(s, r.ID, always)},
	}, nil
}

// probeAddReceipts adds instance i's two receipts, 2i and 2i+1, in one
// AddReceipts call, when the store is a receipts.BatchAdder.
func probeAddReceipts(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	b, ok := st.Receipts.(receipts.BatchAdder)
	if !ok {
		return nil, &notImplemented{"receipts.BatchAdder"}
	}
	var ss []*receipts.Stored
	for _, r := range []receipts.Receipt{newReceipt(2 * i), newReceipt(2*i + 1)} {
		// As Log.Mint prepares a receipt.
		r.ServerTime = epoch
		body, err := r.Encode()
		if err != nil {
			return nil, err
		}
		ss = append(ss, &receipts.Stored{ID: r.ID, Kind: r.Kind, Body: body})
	}
	// Each receipt is a check of its own: a store that kept one of them
	// would be seen by one check and missed by the other.
	first, second := getReceipt(st.Receipts, ss[0].ID, always), getReceipt(st.Receipts, ss[1].ID, always)
	first.read, second.read = "GetReceipt of the first", "GetReceipt of the second"
	return &probe{
		do:     func(ctx context.Context) error { return b.AddReceipts(ctx, ss) },
		checks: []check{first, second},
	}, nil
}

// sequenceOne integrates the oldest pending receipt into the log of s.
func sequenceOne(ctx context.Context, s receipts.Store) error {
	n := 0
	err := s.Sequence(ctx, 1, func(t receipts.Tree, pending []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
		n = len(pending)
		return integrate(t, pending, r)
	})
	if err == nil && n != 1 {
		err = fmt.Errorf("the store's Sequence integrated %d receipts, want the 1 pending", n)
	}
	return err
}

// integrate appends pending to the RFC 6962 tree t, as receipts.Sequencer
// does.
func integrate(t receipts.Tree, pending []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
	base := tlog.StoredHashCount(t.Size)
	var added []tlog.Hash
	read := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			if x >= base {
				if x-base >= int64(len(added)) {
					return nil, fmt.Errorf("stored hash %d is not computed yet", x)
				}
				out[i] = added[x-base]
				continue
			}
			h, err := r.ReadHashes([]int64{x})
			if err != nil {
				return nil, err
			}
			out[i] = h[0]
		}
		return out, nil
	})
	for i, s := range pending {
		hs, err := tlog.StoredHashesForRecordHash(t.Size+int64(i), tlog.RecordHash(s.Body), read)
		if err != nil {
			return nil, err
		}
		added = append(added, hs...)
	}
	size := t.Size + int64(len(pending))
	root, err := tlog.TreeHash(size, read)
	if err != nil {
		return nil, err
	}
	return &receipts.Batch{Tree: receipts.Tree{Size: size, Root: root}, Hashes: added}, nil
}

// probeSequence sequences instance i's receipt, which is the log's i-th:
// a nested instance's receipt is minted after the outer one's.
func probeSequence(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, r := st.Receipts, newReceipt(i)
	if _, err := newLog(s).Mint(ctx, r); err != nil {
		return nil, fmt.Errorf("calling Mint: %w", err)
	}
	index := int64(i)
	return &probe{
		do: func(ctx context.Context) error { return sequenceOne(ctx, s) },
		checks: []check{
			getReceipt(s, r.ID, func(r *receipts.Stored) bool { return r.Sequenced && r.Index == index }),
			{"ListReceipts", func(ctx context.Context) (bool, error) {
				rs, err := s.ListReceipts(ctx, index, limit)
				return slices.ContainsFunc(rs, func(got *receipts.Stored) bool { return got.ID == r.ID }), err
			}},
			{"Tree", func(ctx context.Context) (bool, error) {
				t, err := s.Tree(ctx)
				return t.Size > index, err
			}},
			{"ReadHashes", func(ctx context.Context) (bool, error) {
				_, err := s.ReadHashes(ctx, []int64{tlog.StoredHashIndex(0, index)})
				return present(err, receipts.ErrNotFound)
			}},
		},
	}, nil
}

// probeAddCheckpoint stores a checkpoint of a tree of i receipts:
// instance 0 the empty tree, instance 1 the tree after one receipt, which
// it mints and sequences first.
func probeAddCheckpoint(ctx context.Context, st workerapi.Stores, i int) (*probe, error) {
	s := st.Receipts
	if i > 0 {
		if _, err := newLog(s).Mint(ctx, newReceipt(i)); err != nil {
			return nil, fmt.Errorf("calling Mint: %w", err)
		}
		if err := sequenceOne(ctx, s); err != nil {
			return nil, fmt.Errorf("calling Sequence: %w", err)
		}
	}
	var t receipts.Tree
	if i == 0 {
		t = receipts.EmptyTree()
	} else {
		var err error
		if t, err = s.Tree(ctx); err != nil {
			return nil, fmt.Errorf("calling Tree: %w", err)
		}
	}
	signer, err := newSigner()
	if err != nil {
		return nil, err
	}
	cp, err := receipts.SignCheckpoint(signer, receipts.DefaultOrigin, t)
	if err != nil {
		return nil, err
	}
	return &probe{
		do: func(ctx context.Context) error { return s.AddCheckpoint(ctx, cp) },
		checks: []check{{"LatestCheckpoint", func(ctx context.Context) (bool, error) {
			c, err := s.LatestCheckpoint(ctx)
			exists, err := present(err, receipts.ErrNotFound)
			return exists && c.Size >= cp.Size, err
		}}},
	}, nil
}

// newSigner returns the signer of the suite's checkpoints, a key made
// from a fixed seed, so that every run stores the same bytes.
func newSigner() (note.Signer, error) {
	key, _, err := receipts.GenerateKey(bytes.NewReader(make([]byte, 64)), receipts.DefaultOrigin)
	if err != nil {
		return nil, err
	}
	return note.NewSigner(key)
}

// ---- fingerprint.Store

// newFingerprint returns instance i's fingerprint: that of credential
// pepper version i+1, whose Kind and ID no other instance has.
func newFingerprint(i int) fingerprint.Fingerprint {
	sum := sha256.Sum256([]byte(name("pepper", i)))
	return fingerprint.Fingerprint{Kind: fingerprint.KindPepper, ID: strconv.Itoa(i + 1), Value: hex.EncodeToString(sum[:]), CreatedAt: epoch}
}

// probeAdd adds instance i's fingerprint. Add returns every stored
// fingerprint, so Add of none is the read.
func probeAdd(_ context.Context, st workerapi.Stores, i int) (*probe, error) {
	s, f := st.Fingerprints, newFingerprint(i)
	has := func(fps []fingerprint.Fingerprint) bool {
		return slices.ContainsFunc(fps, func(g fingerprint.Fingerprint) bool { return g.Kind == f.Kind && g.ID == f.ID && g.Value == f.Value })
	}
	return &probe{
		do: func(ctx context.Context) error {
			fps, err := s.Add(ctx, []fingerprint.Fingerprint{f})
			if err == nil && !has(fps) {
				err = fmt.Errorf("the store's Add returned %d fingerprints, without the one it added", len(fps))
			}
			return err
		},
		checks: []check{{"Add(nil)", func(ctx context.Context) (bool, error) {
			fps, err := s.Add(ctx, nil)
			return has(fps), err
		}}},
	}, nil
}
