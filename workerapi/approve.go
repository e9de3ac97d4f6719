package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Node approval. With Config.ApproveNodes a new node registers pending
// and lease.Manager grants it nothing until an operator approves it here;
// an approval may also pin the job types a worker may be granted (which
// narrow the types it registers) and the tags the operator vouches for.
// A pending node's lease request answers 200 with no job and a message
// that says it awaits approval, rather than an error: the node is
// authenticated and registered, the state is expected and temporary, and
// a worker that keeps polling as usual gets jobs as soon as it is
// approved, while a 403 would stop the usual worker loops (they take a
// 403 as final) and need a code old workers do not know.

// opApproveWorker: POST /operator/workers/{id}/approve. The approval, its
// worker_approved receipt and a wake-up of long-polls (the approved node
// may lease at once) commit in one transaction. Approving a worker
// already approved with the same pins changes and mints nothing.
func (s *Server) opApproveWorker(ctx context.Context, c *call) (int, any, error) {
	var req wire.ApproveRequest
	if err := decodeStrict(c, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Reason) > wire.MaxApprovalReasonBytes {
		return 0, nil, invalid("reason is %d bytes, over the limit of %d", len(req.Reason), wire.MaxApprovalReasonBytes)
	}
	// Under ApproveNodes an approval covers what the worker has now
	// (lease.Approval.Exact): a widening it registers later waits for
	// another approval.
	a := lease.Approval{By: c.principal.ID, Reason: req.Reason, Exact: s.cfg.ApproveNodes}
	var err error
	if a.JobTypes, err = approvalPins("job_types", req.JobTypes); err != nil {
		return 0, nil, err
	}
	if a.Tags, err = approvalPins("tags", req.Tags); err != nil {
		return 0, nil, err
	}
	var (
		w       *lease.Worker
		changed bool
		minted  *receipts.Stored
	)
	id := c.pathID()
	err = s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		w, changed, err = s.leases.Approve(ctx, id, a)
		if errors.Is(err, lease.ErrNotFound) {
			return fmt.Errorf("%w: no worker %q", ErrNotFound, id)
		}
		if err != nil || !changed {
			return err
		}
		if minted, err = s.mint(ctx, receipts.Receipt{
			Kind: receipts.KindWorkerApproved, WorkerID: w.ID, NodeID: w.NodeID, Actor: c.principal.ID,
			Reason: req.Reason, JobTypes: strings.Join(w.Approval.JobTypes, " "), Tags: strings.Join(w.Approval.Tags, " "),
		}); err != nil {
			return err
		}
		return s.st.Notifier.Notify(ctx)
	})
	if err != nil {
		return 0, nil, err
	}
	return s.workerAnswer(ctx, c, w, minted)
}

// decodeStrict is decodeOptional that refuses unknown fields: the
// protocol ignores them elsewhere, but an approval that ignored a
// misspelled "job_type" would approve the node with no pin at all.
func decodeStrict(c *call, v any) error {
	if strings.TrimSpace(string(c.body)) == "" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(c.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return invalid("unknown field %s: an approval refuses fields it does not know", f)
		}
		return fmt.Errorf("%w: %s", ErrInvalidRequest, jsonProblem(err))
	}
	if dec.More() {
		return invalid("trailing data after the JSON body")
	}
	return checkChars(v)
}

// approvalPins checks what an approval pins, in the caller's terms
// (lease.Manager.Approve checks it again): absent pins nothing, an empty
// array is refused so that no one pins "nothing" thinking it pins none.
func approvalPins(field string, vs *[]string) ([]string, error) {
	switch {
	case vs == nil:
		return nil, nil
	case len(*vs) == 0:
		return nil, invalid("%s must name at least one value, or be absent to pin none", field)
	case len(*vs) > wire.MaxApprovalPins:
		return nil, invalid("%s holds %d values, over the limit of %d", field, len(*vs), wire.MaxApprovalPins)
	}
	for i, v := range *vs {
		if v == "" || len(v) > wire.MaxApprovalPinBytes || !utf8.ValidString(v) {
			return nil, invalid("%s[%d] must be 1 to %d bytes of UTF-8", field, i, wire.MaxApprovalPinBytes)
		}
		if strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			return nil, invalid("%s[%d] must hold no whitespace or control character", field, i)
		}
	}
	return *vs, nil
}

// approvalView sets the approval fields of a worker view, and the live
// leases the worker may hold.
func (s *Server) approvalView(v *wire.WorkerView, w *lease.Worker) {
	a := w.Approval
	switch {
	case a.Pending:
		v.Approval = wire.ApprovalPending
	case a.At != nil:
		v.Approval = wire.ApprovalApproved
	default:
		v.Approval = wire.ApprovalNotRequired
	}
	if a.At != nil {
		at, by := *a.At, a.By
		v.ApprovedAt, v.ApprovedBy = &at, &by
	}
	v.ApprovedJobTypes, v.ApprovedTags = orEmpty(a.JobTypes), orEmpty(a.Tags)
	types, tags := w.PendingApproval()
	v.PendingJobTypes, v.PendingTags = orEmpty(types), orEmpty(tags)
	v.MaxLeases = s.leases.MaxLeases(w)
}
