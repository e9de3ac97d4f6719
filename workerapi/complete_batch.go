package workerapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The batch complete: POST /workers/jobs/complete completes up to
// wire.MaxBatchComplete jobs in one signed request, for workers that
// finish many short jobs. Each job is completed by completeJob, exactly as
// POST /workers/jobs/{id}/complete completes it, and answered with what
// that route would have answered for it alone; a refused completion costs
// the others nothing.
//
// The request's own transaction holds only its nonce (one signed request,
// one nonce): the completions run after it commits (c.then). They are
// tried first all in one transaction, one commit for the whole batch; if
// any of them fails, that transaction is rolled back and each completion
// runs again in a transaction of its own, so that a refusal takes back its
// own work and nothing else's. A completion is idempotent under its lease
// token, so a batch sent again (its answer was lost) answers the same.

// batchItem is one completion of a batch as it moves through it.
type batchItem struct {
	ref lease.Ref
	res lease.Result
	// wait is the completion's wait_for_proofs.
	wait bool
	// Once completed: out, or err, why it was refused.
	out *wire.CompleteResponse
	err error
}

// completeBatch: POST /workers/jobs/complete. A body that the complete of
// each job would refuse as malformed (no completion or more than
// wire.MaxBatchComplete, a completion without job_id or lease_token, a
// token not of a token's shape, metrics that are not an object, a field
// over its limit) is refused whole with 400, before any completion is
// looked at: the OpenAPI document's request schema refuses it too. The
// rest is answered completion by completion.
func (s *Server) completeBatch(ctx context.Context, c *call) (int, any, error) {
	var req wire.CompleteBatchRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if n := len(req.Completions); n == 0 || n > wire.MaxBatchComplete {
		return 0, nil, invalid("completions holds %d completions; it must hold 1 to %d", n, wire.MaxBatchComplete)
	}
	items := make([]batchItem, len(req.Completions))
	for i := range req.Completions {
		cp := &req.Completions[i]
		var err error
		switch {
		case cp.JobID == "":
			err = invalid("job_id is required")
		default:
			err = checkText("job_id", cp.JobID, wire.MaxNameBytes)
		}
		if err == nil {
			err = checkLimits(&cp.CompleteRequest)
		}
		if err == nil {
			items[i].ref, err = jobRef(c, cp.JobID, cp.LeaseToken)
		}
		if err == nil {
			items[i].res, err = completeResult(&cp.CompleteRequest)
		}
		items[i].wait = cp.WaitForProofs
		if err != nil {
			return 0, nil, itemInvalid("completions", i, err)
		}
	}
	c.then = func(ctx context.Context) (int, any, error) {
		return http.StatusOK, s.runBatch(ctx, c, items), nil
	}
	return http.StatusOK, nil, nil
}

// itemInvalid names item i of the array field in a refusal of the whole
// request: "invalid request: completions[3]: lease_token is required".
func itemInvalid(field string, i int, err error) error {
	msg := strings.TrimPrefix(err.Error(), ErrInvalidRequest.Error()+": ")
	return fmt.Errorf("%w: %s[%d]: %s", ErrInvalidRequest, field, i, msg)
}

// runBatch completes the valid items, once the request's nonce has
// committed, and answers each item in order.
func (s *Server) runBatch(ctx context.Context, c *call, items []batchItem) *wire.CompleteBatchResponse {
	todo := make([]int, len(items))
	for i := range todo {
		todo[i] = i
	}
	// The jobs are written in the order of their ids, as concurrent
	// requests that touch several jobs should, so that they do not wait on
	// each other's row locks in a cycle.
	slices.SortStableFunc(todo, func(a, b int) int { return strings.Compare(items[a].ref.JobID, items[b].ref.JobID) })
	if len(todo) < 2 || !s.completeTogether(ctx, c, items, todo) {
		for _, i := range todo {
			s.completeAlone(ctx, c, &items[i])
		}
	}
	// The completions that ask for proofs wait for them, and those whose
	// receipts are sequenced already (repeats) get them too, all against
	// one checkpoint; the others are answered with their receipts alone.
	var (
		outs []*wire.CompleteResponse
		wait bool
	)
	for _, it := range items {
		if it.out != nil && (it.wait || sequenced(it.out)) {
			outs = append(outs, it.out)
			wait = wait || it.wait
		}
	}
	s.proofs(ctx, wait, outs...)
	resp := &wire.CompleteBatchResponse{Results: make([]wire.CompletionResult, len(items))}
	for i, it := range items {
		r := &resp.Results[i]
		r.JobID = it.ref.JobID
		if it.out == nil {
			r.Status, r.Error = s.itemError(c, it.err)
			continue
		}
		r.OK, r.Status = true, http.StatusOK
		r.Completed = &wire.CompletedJob{
			ReceiptID: it.out.ReceiptID, ActualMS: it.out.ActualMS, ActualHours: it.out.ActualHours,
			ActualCostUSD: it.out.ActualCostUSD, Receipts: it.out.Receipts, Proofs: it.out.Proofs,
			Checkpoint: it.out.Checkpoint,
		}
	}
	return resp
}

// itemCall is a call for one completion of c's batch: it shares c's
// request and caller, and collects the hooks of that completion alone, so
// that they are delivered only if its transaction commits.
func itemCall(c *call) *call {
	return &call{r: c.r, w: c.w, principal: c.principal, credentialID: c.credentialID, reqID: c.reqID}
}

// completeTogether completes the items todo, in that order, in one
// transaction (completeJobs: one write of the jobs, one of their
// receipts), and reports whether it committed. If any completion fails,
// nothing is kept and it returns false: each is then to run alone. A
// refusal that commits (job_canceled) is kept with the others.
func (s *Server) completeTogether(ctx context.Context, c *call, items []batchItem, todo []int) bool {
	var (
		ic   *call
		cs   []lease.Completion
		outs []*wire.CompleteResponse
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		ic, cs = itemCall(c), make([]lease.Completion, len(todo))
		for k, i := range todo {
			cs[k] = lease.Completion{Ref: items[i].ref, Result: items[i].res}
		}
		var err error
		outs, err = s.completeJobs(ctx, ic, cs)
		return err
	})
	if err != nil {
		s.log.Debug("a batch complete runs its completions one by one", "request_id", c.reqID, "err", err)
		return false
	}
	for k, i := range todo {
		items[i].out, items[i].err = outs[k], cs[k].Err
	}
	c.hooks = append(c.hooks, ic.hooks...)
	c.notes = append(c.notes, ic.notes...)
	return true
}

// completeAlone completes one item in a transaction of its own.
func (s *Server) completeAlone(ctx context.Context, c *call, it *batchItem) {
	ic := itemCall(c)
	var (
		out     *wire.CompleteResponse
		refusal error
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		out, refusal, err = s.completeJob(ctx, ic, it.ref, it.res)
		return err
	})
	switch {
	case err != nil:
		it.err = err
	case refusal != nil:
		it.err = refusal
		c.hooks = append(c.hooks, ic.hooks...)
		c.notes = append(c.notes, ic.notes...)
	default:
		it.out = out
		c.hooks = append(c.hooks, ic.hooks...)
		c.notes = append(c.notes, ic.notes...)
	}
}

// itemError is the status and error a refused completion is answered
// with: those complete of its job alone would answer (see fail), a job
// that does not exist answered as one the caller holds no lease on.
func (s *Server) itemError(c *call, err error) (int, *wire.ErrorDetail) {
	err = sameForEveryProbe(err)
	st := statusOf(err)
	msg := publicMessage(err.Error())
	if st.http == http.StatusServiceUnavailable {
		if !clientGone(c.r) {
			s.log.Error("a completion of a batch failed", "request_id", c.reqID, "err", err)
		}
		msg = "a store cannot answer; this completion was not accepted"
	}
	return st.http, &wire.ErrorDetail{Code: st.code, Message: msg, ServerTime: s.now()}
}
