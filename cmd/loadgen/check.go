package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// stateSucceeded is the state of a job that completed.
const stateSucceeded = "succeeded"

// snapshot returns the ids of the jobs dispatched, and a copy of every
// record, for the checks.
func (l *load) snapshot() ([]string, map[string]jobRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	recs := make(map[string]jobRecord, len(l.jobs))
	for id, r := range l.jobs {
		recs[id] = *r
	}
	return slices.Clone(l.ours), recs
}

// exactlyOnce checks that every job dispatched was completed once, as
// the nodes counted the complete answers, and that the server lists it
// succeeded with the receipt id of that answer.
func (l *load) exactlyOnce(ctx context.Context) checkResult {
	ours, recs := l.snapshot()
	var res checkResult
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	releases := 0
	for _, id := range ours {
		r := recs[id]
		if len(r.leasedAt) > 1 {
			releases++
		}
		switch {
		case r.completes == 0 && r.err != nil:
			bad("job %s: not completed: %v", id, r.err)
		case r.completes == 0:
			bad("job %s: not completed: %v", id, errNotLeased)
		case r.completes > 1:
			bad("job %s: completed %d times", id, r.completes)
		case r.answer.Job.ID != id || r.answer.Job.State != stateSucceeded:
			bad("job %s: the complete answer has job %s in state %s", id, r.answer.Job.ID, r.answer.Job.State)
		}
	}
	listed, err := l.listJobs(ctx, ours)
	if err != nil {
		bad("reading the jobs back: %v", err)
	} else {
		for _, id := range ours {
			j, ok := listed[id]
			r := recs[id]
			switch {
			case !ok:
				bad("job %s: not listed by GET /operator/jobs", id)
			case j.State != stateSucceeded:
				bad("job %s: %s on the server", id, j.State)
			case r.answer != nil && (j.ReceiptID == nil || *j.ReceiptID != r.answer.ReceiptID):
				bad("job %s: receipt_id %s on the server, %s in the complete answer", id, deref(j.ReceiptID), r.answer.ReceiptID)
			}
		}
	}
	res.summary = fmt.Sprintf("%d jobs dispatched, each completed once and listed succeeded by the server with the receipt_id of its completion; %d leased more than once", len(ours), releases)
	return res
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// listJobs reads back the jobs ids through GET /operator/jobs. Job ids
// are time-ordered, so it pages from just below the smallest to the
// largest.
func (l *load) listJobs(ctx context.Context, ids []string) (map[string]wire.Job, error) {
	out := map[string]wire.Job{}
	if len(ids) == 0 {
		return out, nil
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	lo, hi := slices.Min(ids), slices.Max(ids)
	after := lo[:len(lo)-1] // a prefix sorts before the id itself
	for j, err := range l.op.Jobs(ctx, operator.JobQuery{JobType: l.cfg.jobType, After: after, Limit: 1000}) {
		if err != nil {
			return nil, err
		}
		if want[j.ID] {
			out[j.ID] = j.Job
		}
		if j.ID >= hi {
			break
		}
	}
	return out, nil
}

// verifyReceipts checks both receipts of every completion: that they are
// the job_completed and job_charged receipts the answer names, that each
// is in the tree of a checkpoint signed by the receipt key (the proofs of
// the answer, or of GET /operator/receipts/{id} when the answer had
// none), that its body is canonical and names the job, the worker and
// the lease, and that every checkpoint seen is consistent with the
// latest one.
func (l *load) verifyReceipts(ctx context.Context) checkResult {
	ours, recs := l.snapshot()
	var res checkResult
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	key, origin := l.cfg.tokens.receiptKey, l.cfg.origin
	opened := map[string]*receipts.Checkpoint{} // by note
	bySize := map[int64]*receipts.Checkpoint{}
	open := func(note string) (*receipts.Checkpoint, error) {
		if cp, ok := opened[note]; ok {
			return cp, nil
		}
		cp, err := receipts.OpenCheckpoint([]byte(note), key, origin)
		if err != nil {
			return nil, err
		}
		opened[note] = cp
		if other, ok := bySize[cp.Size]; ok && other.Root != cp.Root {
			return nil, fmt.Errorf("%w: two checkpoints of size %d with different roots", receipts.ErrFork, cp.Size)
		}
		bySize[cp.Size] = cp
		return cp, nil
	}
	verified, fetched := 0, 0
	for _, id := range ours {
		r := recs[id]
		a := r.answer
		if a == nil {
			continue // exactly once reports it
		}
		rs := a.Receipts
		if len(rs) != 2 || rs[0].ID != a.ReceiptID || rs[0].Kind != receipts.KindJobCompleted ||
			rs[1].ID != a.ReceiptID+".charge" || rs[1].Kind != receipts.KindJobCharged {
			var got []string
			for _, w := range rs {
				got = append(got, string(w.Kind)+" "+w.ID)
			}
			bad("job %s: the complete answer (receipt_id %s) carries %q, not its job_completed and job_charged receipts", id, a.ReceiptID, got)
			continue
		}
		withProofs := len(a.Proofs) == len(rs) && a.Checkpoint != ""
		for i, wr := range rs {
			var (
				proof receipts.Proof
				note  string
			)
			if withProofs {
				proof, note = a.Proofs[i], a.Checkpoint
			} else {
				fetched++
				got, err := l.op.Receipt(ctx, wr.ID)
				switch {
				case err != nil:
					bad("receipt %s of job %s: %v", wr.ID, id, err)
					continue
				case got.Proof == nil || got.Checkpoint == nil:
					bad("receipt %s of job %s: not sequenced yet", wr.ID, id)
					continue
				case !bytes.Equal(got.Receipt.Body, wr.Body):
					bad("receipt %s of job %s: GET /operator/receipts/{id} answers another body than complete", wr.ID, id)
					continue
				}
				wr, proof, note = got.Receipt, *got.Proof, *got.Checkpoint
			}
			if err := verifyOne(wr, proof, note, open, id, r); err != nil {
				bad("receipt %s of job %s: %v", wr.ID, id, err)
				continue
			}
			verified++
		}
	}

	latestNote, err := l.op.Checkpoint(ctx)
	var latest *receipts.Checkpoint
	if err == nil {
		latest, err = open(string(latestNote))
	}
	if err != nil {
		bad("the latest checkpoint: %v", err)
	} else {
		for _, p := range l.consistent(ctx, latest, slices.Sorted(maps.Keys(bySize)), bySize) {
			bad("%s", p)
		}
	}
	res.summary = fmt.Sprintf("%d receipts of %d completions verified against %d signed checkpoints (%d proofs read from GET /operator/receipts/{id}), each consistent with the latest",
		verified, len(ours), len(bySize), fetched)
	if latest != nil {
		res.summary += fmt.Sprintf(", of tree size %d", latest.Size)
	}
	return res
}

// verifyOne checks one receipt of job id against its proof and signed
// checkpoint.
func verifyOne(wr receipts.WireReceipt, proof receipts.Proof, note string, open func(string) (*receipts.Checkpoint, error), id string, r jobRecord) error {
	cp, err := open(note)
	if err != nil {
		return err
	}
	if wr.Index != nil && *wr.Index != proof.Index {
		return fmt.Errorf("index %d, its proof is for %d", *wr.Index, proof.Index)
	}
	if err := receipts.CheckInclusion(cp, wr.Body, proof); err != nil {
		return err
	}
	rec, err := receipts.Decode(wr.Body)
	if err != nil {
		return err
	}
	switch {
	case rec.ID != wr.ID || rec.Kind != wr.Kind:
		return fmt.Errorf("the body is %s %s", rec.Kind, rec.ID)
	case rec.JobID != id || rec.WorkerID != r.workerID || rec.LeaseID != r.leaseID:
		return fmt.Errorf("the body names job %s, worker %s, lease %s; the completion was of job %s by %s under %s",
			rec.JobID, rec.WorkerID, rec.LeaseID, id, r.workerID, r.leaseID)
	}
	return nil
}

// consistent checks that each checkpoint of sizes is consistent with
// latest, reading the consistency proofs 8 at a time, and returns the
// problems.
func (l *load) consistent(ctx context.Context, latest *receipts.Checkpoint, sizes []int64, bySize map[int64]*receipts.Checkpoint) []string {
	var (
		mu       sync.Mutex
		problems []string
		wg       sync.WaitGroup
		sem      = make(chan struct{}, 8)
	)
	for _, size := range sizes {
		cp := bySize[size]
		if size >= latest.Size {
			if err := receipts.CheckConsistency(cp.Tree(), latest.Tree(), nil); err != nil {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("checkpoint of size %d: %v", size, err))
				mu.Unlock()
			}
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			proof, err := l.op.Consistency(ctx, size, latest.Size)
			if err == nil {
				err = receipts.CheckConsistency(cp.Tree(), latest.Tree(), proof.Hashes)
			}
			if err != nil {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("checkpoint of size %d against the latest, of %d: %v", size, latest.Size, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return problems
}
