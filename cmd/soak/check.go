package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// drain waits until every job on the server has ended, or -drain-timeout.
func (s *soak) drain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.drainTimeout)
	defer cancel()
	for {
		all, err := s.allJobs(ctx)
		if err == nil {
			open := 0
			for _, j := range all {
				if !ended(j.State) {
					open++
				}
			}
			if open == 0 {
				return nil
			}
			err = fmt.Errorf("%d of %d jobs have not ended", open, len(all))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("draining for %v: %w", s.cfg.drainTimeout, err)
		case <-time.After(2 * time.Second):
		}
	}
}

// ended reports whether a job in state has ended (docs/PROTOCOL.md §5).
func ended(state string) bool {
	return state == wire.JobStateSucceeded || state == "failed" || state == "canceled"
}

// allJobs reads every job on the server, from the first replica that
// answers.
func (s *soak) allJobs(ctx context.Context) (map[string]wire.Job, error) {
	var err error
	for _, op := range s.ops {
		var out map[string]wire.Job
		if out, err = listAll(ctx, op); err == nil {
			return out, nil
		}
	}
	return nil, err
}

func listAll(ctx context.Context, op *operator.Client) (map[string]wire.Job, error) {
	out := map[string]wire.Job{}
	for j, err := range op.Jobs(ctx, operator.JobQuery{Limit: 1000}) {
		if err != nil {
			return nil, err
		}
		out[j.ID] = j.Job
	}
	return out, nil
}

// result is what the checks found.
type result struct {
	problems     []string
	warnings     []string // -allow-503-queued
	jobs         int      // on the server
	requests     int      // jobs asked for
	dispatched   int      // answered 201
	errAnswers   int      // 429 and 503 answers, tried again
	unanswered   int      // requests that got no answer
	extra        int      // jobs on the server the soak got no 201 for
	retried      int      // jobs that took more than one attempt
	receipts     int64
	checkpoints  int
	pairs        int // checkpoint pairs proven consistent from the log
	serverProofs int // consistency proofs from the server checked
	final        *receipts.Checkpoint
	workerStarts int
	workerExits  int // exits nobody asked for
	serverStarts int
	serverExits  int
}

func (r *result) bad(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// check runs every check after the drain.
func (s *soak) check(ctx context.Context, drainErr error) *result {
	r := &result{}
	s.mu.Lock()
	r.problems = append(r.problems, s.problems...)
	requests := make(map[int64]request, len(s.requests))
	for seq, q := range s.requests {
		requests[seq] = *q
	}
	s.mu.Unlock()
	if drainErr != nil {
		r.bad("%v", drainErr)
	}
	dispatched := s.snapshot()
	r.dispatched = len(dispatched)

	all, err := s.allJobs(ctx)
	if err != nil {
		r.bad("reading the jobs: %v", err)
		return r
	}
	r.jobs = len(all)
	for id := range dispatched {
		if _, ok := all[id]; !ok {
			r.bad("job %s: dispatched (201) but not on the server", id)
		}
	}
	s.checkRequests(r, requests, all)

	log, final, err := s.readLog(ctx, all)
	if err != nil {
		r.bad("reading the receipt log: %v", err)
		return r
	}
	r.final, r.receipts = final, int64(len(log.bodies))

	// Exactly once, counted in the log.
	completed := map[string][]string{} // job id → job_completed receipt ids
	charged := map[string]int{}
	for i, body := range log.bodies {
		rec, err := receipts.Decode(body)
		if err != nil {
			r.bad("receipt %d: %v", i, err)
			continue
		}
		switch rec.Kind {
		case receipts.KindJobCompleted:
			completed[rec.JobID] = append(completed[rec.JobID], rec.ID)
		case receipts.KindJobCharged:
			charged[rec.JobID]++
		}
	}
	for _, id := range slices.Sorted(maps.Keys(all)) {
		j := all[id]
		if _, ok := dispatched[id]; !ok {
			r.extra++
		}
		if j.Attempt > 1 {
			r.retried++
		}
		switch c := completed[id]; {
		case j.State != wire.JobStateSucceeded:
			r.bad("job %s (%s): %s after %d attempts, not succeeded", id, j.JobType, j.State, j.Attempt)
		case len(c) != 1:
			r.bad("job %s: %d job_completed receipts %q", id, len(c), c)
		case charged[id] != 1:
			r.bad("job %s: %d job_charged receipts", id, charged[id])
		case j.ReceiptID == nil || *j.ReceiptID != c[0]:
			r.bad("job %s: receipt_id %v, its job_completed receipt is %s", id, deref(j.ReceiptID), c[0])
		}
	}
	for id, c := range completed {
		if _, ok := all[id]; !ok {
			r.bad("job %s: %d job_completed receipts for a job the server does not list", id, len(c))
		}
	}

	s.checkCheckpoints(ctx, r, log, final)

	for _, w := range s.workers {
		n, u := w.counts()
		r.workerStarts += n
		r.workerExits += u
	}
	for _, sv := range s.servers {
		n, u := sv.counts()
		r.serverStarts += n
		r.serverExits += u
	}
	return r
}

func deref(p *string) string {
	if p == nil {
		return "null"
	}
	return *p
}

// checkRequests ties every job on the server to the request that queued
// it, by its payload's soak_seq: no request may have queued more jobs
// than it had attempts that could (its 201, those not answered and
// those answered 503 with an unknown outcome).
func (s *soak) checkRequests(r *result, requests map[int64]request, all map[string]wire.Job) {
	r.requests = len(requests)
	for _, q := range requests {
		for _, a := range q.attempts {
			switch {
			case a == "503 outcome unknown":
				r.unanswered++
			case strings.HasPrefix(a, "429") || strings.HasPrefix(a, "503"):
				r.errAnswers++
			case strings.HasPrefix(a, "no answer"):
				r.unanswered++
			}
		}
	}
	bySeq := map[int64][]string{}
	for id, j := range all {
		var p struct {
			Seq *int64 `json:"soak_seq"`
		}
		if json.Unmarshal(j.Payload, &p) != nil || p.Seq == nil {
			r.bad("job %s: its payload %s has no soak_seq", id, j.Payload)
			continue
		}
		bySeq[*p.Seq] = append(bySeq[*p.Seq], id)
	}
	for _, seq := range slices.Sorted(maps.Keys(bySeq)) {
		ids := bySeq[seq]
		q, ok := requests[seq]
		switch {
		case !ok:
			r.bad("jobs %q carry soak_seq %d, which the soak never sent", ids, seq)
		case len(ids) > q.mayQueue:
			slices.Sort(ids)
			report := r.bad
			if s.cfg.allow503Queued {
				report = func(format string, args ...any) { r.warnings = append(r.warnings, fmt.Sprintf(format, args...)) }
			}
			report("request %d queued %d jobs %q, but only %d of its attempts %q could have: an error answer queued a job",
				seq, len(ids), ids, q.mayQueue, q.attempts)
		}
	}
}

// receiptLog is the log as read back: each receipt's body, in index order,
// and the stored hashes of its tree.
type receiptLog struct {
	bodies [][]byte
	hashes memHashes
}

// readLog reads the whole receipt log and a checkpoint of exactly its
// size, checks each receipt is canonical and in order, and that the log
// hashes to the checkpoint's root. The completions of the succeeded jobs
// in all may still be waiting to be sequenced: it reads again (within the
// drain timeout) until each is in.
func (s *soak) readLog(ctx context.Context, all map[string]wire.Job) (*receiptLog, *receipts.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.drainTimeout)
	defer cancel()
	want := map[string]bool{}
	for _, j := range all {
		if j.ReceiptID != nil {
			want[*j.ReceiptID] = true
		}
	}
	log := &receiptLog{}
	op := s.ops[0]
	for {
		// The checkpoint first: the log read after it holds at least its
		// receipts.
		cp := s.readCheckpoint(ctx, op)
		if cp == nil {
			return nil, nil, fmt.Errorf("no verifiable checkpoint from %s", s.addrs[0])
		}
		if read := int64(len(log.bodies)); read < cp.Size {
			for wr, err := range op.Receipts(ctx, operator.ReceiptQuery{From: read, Limit: 1000}) {
				if err != nil {
					return nil, nil, err
				}
				n := int64(len(log.bodies))
				if wr.Index == nil || *wr.Index != n {
					return nil, nil, fmt.Errorf("receipt %s comes at position %d with index %v", wr.ID, n, wr.Index)
				}
				rec, err := receipts.Decode(wr.Body)
				if err != nil {
					return nil, nil, fmt.Errorf("receipt %d (%s): %w", n, wr.ID, err)
				}
				if rec.ID != wr.ID || rec.Kind != wr.Kind {
					return nil, nil, fmt.Errorf("receipt %d: listed as %s %s, its body is %s %s", n, wr.Kind, wr.ID, rec.Kind, rec.ID)
				}
				hs, err := tlog.StoredHashesForRecordHash(n, tlog.RecordHash(wr.Body), log.hashes)
				if err != nil {
					return nil, nil, err
				}
				log.hashes = append(log.hashes, hs...)
				log.bodies = append(log.bodies, wr.Body)
				delete(want, wr.ID)
				if int64(len(log.bodies)) == cp.Size {
					break
				}
			}
			if int64(len(log.bodies)) < cp.Size {
				return nil, nil, fmt.Errorf("the log ends at %d receipts, the checkpoint has %d", len(log.bodies), cp.Size)
			}
		}
		// The checkpoint covers the first cp.Size receipts of the log read.
		root, err := tlog.TreeHash(cp.Size, log.hashes)
		if err != nil {
			return nil, nil, err
		}
		if root != cp.Root {
			return nil, nil, fmt.Errorf("the first %d receipts of the log do not hash to the root of the checkpoint of that size", cp.Size)
		}
		if len(want) == 0 && int64(len(log.bodies)) == cp.Size {
			return log, cp, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%d completions are not in the log after %v", len(want), s.cfg.drainTimeout)
		case <-time.After(time.Second):
		}
	}
}

// checkCheckpoints checks every checkpoint seen (see checkSeen), and
// each consecutive pair, and each against the final one, by the
// server's consistency proof.
func (s *soak) checkCheckpoints(ctx context.Context, r *result, log *receiptLog, final *receipts.Checkpoint) {
	s.mu.Lock()
	seen := slices.Clone(s.checkpoints)
	s.mu.Unlock()
	r.checkpoints = len(seen)
	trees, pairs, problems := checkSeen(seen, log.hashes, final)
	r.pairs = pairs
	r.problems = append(r.problems, problems...)
	// The server's own proofs, from each tree to the next and to the final
	// one.
	ftree := receipts.Tree{Size: final.Size, Root: final.Root}
	for i, t := range trees {
		old := receipts.Tree{Size: t.N, Root: t.Hash}
		targets := []receipts.Tree{ftree}
		if i+1 < len(trees) {
			targets = append(targets, receipts.Tree{Size: trees[i+1].N, Root: trees[i+1].Hash})
		}
		for _, nt := range targets {
			if nt.Size < old.Size {
				continue
			}
			proof, err := s.ops[i%len(s.ops)].Consistency(ctx, old.Size, nt.Size)
			if err == nil {
				err = receipts.CheckConsistency(old, nt, proof.Hashes)
			}
			if err != nil {
				r.bad("the server's consistency proof from size %d to %d: %v", old.Size, nt.Size, err)
				continue
			}
			r.serverProofs++
		}
	}
}

// checkSeen checks the checkpoints seen, in the order seen, against the
// stored hashes of the log, which hashes to final's root: none is smaller
// than one seen before it, each is the root of its prefix of the log,
// and each distinct tree is proven consistent with every later one by a
// proof computed from the log. It returns the distinct trees, the pairs
// proven and the problems.
func checkSeen(seen []seenCheckpoint, hashes memHashes, final *receipts.Checkpoint) (trees []tlog.Tree, pairs int, problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for i, sc := range seen {
		cp := sc.cp
		if i > 0 && cp.Size < seen[i-1].cp.Size {
			bad("checkpoint of size %d read at %s after one of size %d", cp.Size, sc.at.UTC().Format(time.RFC3339), seen[i-1].cp.Size)
		}
		if cp.Size > final.Size {
			bad("checkpoint of size %d is larger than the final one, %d", cp.Size, final.Size)
			continue
		}
		root, err := tlog.TreeHash(cp.Size, hashes)
		if err != nil || root != cp.Root {
			bad("checkpoint of size %d read at %s: not the root of the log's first %d receipts (%v)", cp.Size, sc.at.UTC().Format(time.RFC3339), cp.Size, err)
			continue
		}
		t := tlog.Tree{N: cp.Size, Hash: cp.Root}
		if !slices.Contains(trees, t) {
			trees = append(trees, t)
		}
	}
	// Every earlier tree against every later one.
	for j := range trees {
		for i := range j {
			old, new := trees[i], trees[j]
			if old.N > new.N {
				continue // reported above
			}
			p, err := tlog.ProveTree(new.N, old.N, hashes)
			if err == nil {
				err = tlog.CheckTree(p, new.N, new.Hash, old.N, old.Hash)
			}
			if err != nil {
				bad("checkpoint of size %d is not consistent with the later one of size %d: %v", old.N, new.N, err)
				continue
			}
			pairs++
		}
	}
	return trees, pairs, problems
}

// memHashes holds a tree's stored hashes by stored-hash index: a
// tlog.HashReader.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("stored hash %d is not computed", x)
		}
		out[i] = m[x]
	}
	return out, nil
}

// summary prints the figures and the problems.
func (s *soak) summary(r *result, took time.Duration) {
	c := s.cfg
	p := func(format string, args ...any) { fmt.Fprintf(s.out, format+"\n", args...) }
	p("")
	p("soak summary (seed %d, %v soaking, %v in all)", c.seed, c.duration, took.Round(time.Second))
	p("  jobs:        %d on the server, of %d asked for: %d answered 201, %d requests not answered or with an unknown outcome (%d of their jobs queued), %d 429/503 answers tried again; %d jobs took more than one attempt",
		r.jobs, r.requests, r.dispatched, r.unanswered, r.extra, r.errAnswers, r.retried)
	p("  faults:      %d server SIGKILLs, %d worker SIGKILLs, %d worker restarts mid-job (%d found no busy worker), %d PostgreSQL restarts, %d clock-skew turns%s",
		s.serverKills.Load(), s.workerKills.Load(), s.workerRestarts.Load(), s.busyMisses.Load(), s.pgRestarts.Load(), s.skewTurns.Load(), skipNote(s.features, c))
	p("  processes:   %d server starts (%d exits on their own), %d worker starts (%d exits on their own)",
		r.serverStarts, r.serverExits, r.workerStarts, r.workerExits)
	if r.final != nil {
		p("  receipts:    %d in the log, hashing to the root of the final checkpoint (size %d) signed by the verifier key", r.receipts, r.final.Size)
	}
	p("  checkpoints: %d recorded; %d pairs proven consistent from the log, %d server consistency proofs checked", r.checkpoints, r.pairs, r.serverProofs)
	for _, w := range r.warnings {
		p("  WARN: %s", w)
	}
	if len(r.problems) == 0 {
		p("PASS: every job succeeded exactly once, every receipt verifies, every checkpoint is consistent with every other")
		return
	}
	p("FAIL: %d problems", len(r.problems))
	for i, pr := range r.problems {
		if i == 50 {
			p("  ... and %d more", len(r.problems)-50)
			break
		}
		p("  - %s", pr)
	}
}

func skipNote(f features, c *config) string {
	var s []string
	if !f.clockSkew {
		s = append(s, "clock skew skipped: no -clock-skew")
	}
	if !f.heartbeat {
		s = append(s, "worker liveness flags skipped: no -heartbeat-interval/-offline-after")
	}
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s, "; ") + ")"
}
