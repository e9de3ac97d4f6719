package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Receipts.

// maxKindScan bounds how many receipts one page of GET
// /operator/receipts?kind= reads: a page ends early, with next set to the
// last index read, once it has read this many (wire.MaxReceiptKindScan).
const maxKindScan = wire.MaxReceiptKindScan

func (s *Server) opListReceipts(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, set, err := qInt(q, "after", 0, receipts.MaxInt-1)
	if err != nil {
		return 0, nil, err
	}
	limit, err := qLimit(q)
	if err != nil {
		return 0, nil, err
	}
	kind, err := qString(q, "kind")
	if err != nil {
		return 0, nil, err
	}
	if _, given := q["kind"]; given && !receipts.Kind(kind).Valid() {
		return 0, nil, fmt.Errorf("%w: kind %q is not a receipt kind", ErrInvalidRequest, kind)
	}
	desc, err := qDesc(q)
	if err != nil {
		return 0, nil, err
	}
	page := limit
	if page == 0 {
		page = 100
	}
	// read reads up to n receipts of the log past the cursor cur (the
	// last index read, -1 before any) in the order asked.
	read := func(cur int64, n int) ([]*receipts.Stored, error) {
		if desc {
			return s.receipts.ListDesc(ctx, cur, n)
		}
		return s.receipts.List(ctx, cur+1, n)
	}
	cur := int64(-1)
	if set {
		cur = after
	}
	if desc && cur == 0 {
		// Nothing is below index 0; ListDesc reads -1 as "from the newest".
		return http.StatusOK, wire.ReceiptListResponse{Receipts: []receipts.WireReceipt{}}, nil
	}
	if kind == "" {
		rs, err := read(cur, page)
		if err != nil {
			return 0, nil, err
		}
		out := wire.ReceiptListResponse{Receipts: make([]receipts.WireReceipt, len(rs))}
		for i, r := range rs {
			out.Receipts[i] = r.Wire()
		}
		if next := int64(-1); len(rs) == page {
			if next = rs[len(rs)-1].Index; !desc || next > 0 {
				out.Next = &next
			}
		}
		return http.StatusOK, out, nil
	}
	// The receipts of one kind: read the log in the order asked and keep
	// those, until the page is full, the log ends, or maxKindScan
	// receipts were read (next is then the last index read).
	out := wire.ReceiptListResponse{Receipts: []receipts.WireReceipt{}}
	scanned, last, ended := 0, int64(-1), false
	for !ended && len(out.Receipts) < page && scanned < maxKindScan {
		want := min(maxPage, maxKindScan-scanned)
		rs, err := read(cur, want)
		if err != nil {
			return 0, nil, err
		}
		ended = len(rs) < want
		for _, r := range rs {
			scanned++
			last = r.Index
			if r.Kind != receipts.Kind(kind) {
				continue
			}
			if out.Receipts = append(out.Receipts, r.Wire()); len(out.Receipts) == page {
				ended = false // a full page has a next one
				break
			}
		}
		if last == 0 && desc {
			ended = true // index 0 read: nothing is older
		}
		cur = last
	}
	if !ended && last >= 0 {
		out.Next = &last
	}
	return http.StatusOK, out, nil
}

// opGetReceipt answers a receipt with its inclusion proof. A receipt the
// store cannot prove yet (not sequenced, or sequenced under a checkpoint
// not signed yet) is waited for, within Config.ProofWait (see
// awaitProofs), so that a receipt minted a moment ago comes with its
// proof; if sequencing fails or takes too long, it comes without one.
func (s *Server) opGetReceipt(ctx context.Context, c *call) (int, any, error) {
	r, err := s.receipts.Get(ctx, c.pathID())
	if err != nil {
		return 0, nil, err
	}
	out := wire.ReceiptResponse{Receipt: r.Wire()}
	got, proof, cp, err := s.receipts.Prove(ctx, r.ID)
	if errors.Is(err, receipts.ErrNotSequenced) {
		// Not sequenced yet, or sequenced and its checkpoint not signed
		// yet (a sequencer between its batch's commit and its
		// checkpoint): wait for both, within ProofWait.
		ss, ps, signed, aerr := s.awaitProofs(ctx, []string{r.ID})
		if aerr == nil {
			got, proof, cp = ss[0], ps[0], signed
		}
		if err = aerr; errors.Is(err, receipts.ErrNotSequenced) {
			s.log.Warn("sequencing receipts for a proof", "request_id", c.reqID, "err", err)
		}
	}
	switch {
	case errors.Is(err, receipts.ErrNotSequenced):
	case err != nil:
		return 0, nil, err
	default:
		note := string(cp.Note)
		out.Receipt, out.Proof, out.Checkpoint = got.Wire(), &proof, &note
	}
	return http.StatusOK, out, nil
}

// opCheckpoint answers the latest signed checkpoint as text. On a log
// that has none yet it publishes the first.
func (s *Server) opCheckpoint(ctx context.Context, c *call) (int, any, error) {
	cp, err := s.receipts.Checkpoint(ctx)
	if errors.Is(err, receipts.ErrNotFound) {
		cp, err = s.Sequence(ctx)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, rawText(cp.Note), nil
}

func (s *Server) opConsistency(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	oldSize, oldSet, err := qInt(q, "old", 0, receipts.MaxInt)
	if err != nil {
		return 0, nil, err
	}
	newSize, newSet, err := qInt(q, "new", 0, receipts.MaxInt)
	if err != nil {
		return 0, nil, err
	}
	if !oldSet || !newSet {
		return 0, nil, fmt.Errorf("%w: old and new are required", ErrInvalidRequest)
	}
	if oldSize > newSize {
		return 0, nil, fmt.Errorf("%w: old %d is greater than new %d", ErrInvalidRequest, oldSize, newSize)
	}
	hs, err := s.receipts.ConsistencyProof(ctx, oldSize, newSize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ConsistencyResponse{Hashes: hs}, nil
}

// mint mints r under the policy version in force, in ctx's transaction.
func (s *Server) mint(ctx context.Context, r receipts.Receipt) (*receipts.Stored, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	r.PolicyVersion = snap.Version()
	return s.receipts.Mint(ctx, r)
}

// announce queues the ReceiptMinted hook of a committed receipt and
// returns its id.
func (s *Server) announce(c *call, r *receipts.Stored) *string {
	st := *r
	c.after(func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, st) })
	id := r.ID
	return &id
}
