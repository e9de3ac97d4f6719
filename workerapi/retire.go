package workerapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// retireBanReason is the ban reason of a retired worker's principal.
const retireBanReason = "retired"

// retiredReceiptID is the id of the worker_retired receipt of a worker:
// one per worker, so that retiring again finds the first answer's.
func retiredReceiptID(workerID string) string { return "rcp_retired_" + workerID }

// opRetireWorker retires a worker for good, in one transaction: the
// worker's status becomes retired (lease.Manager.Retire: it is granted
// nothing again, and its live leases end, their jobs back to the queue),
// every credential of its principal is revoked, the principal is banned
// (reason "retired", so its key cannot register again, §5.1), and a
// worker_retired receipt is minted, with an id derived from the worker's.
// Retiring a retired worker changes nothing and answers as the first
// retirement did. A retired worker cannot be unbanned (setBan).
func (s *Server) opRetireWorker(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decodeOptional(&req); err != nil {
		return 0, nil, err
	}
	var (
		w      *lease.Worker
		minted *receipts.Stored
		ended  []lease.EndedLease
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		minted, ended = nil, nil
		var (
			changed bool
			err     error
		)
		if w, changed, ended, err = s.leases.Retire(ctx, c.pathID(), req.Reason); err != nil || !changed {
			return err
		}
		p, err := s.issuer.Principal(ctx, w.ID)
		switch {
		case errors.Is(err, credential.ErrNotFound):
			// A worker registered in Go without a principal has no
			// credential to revoke.
		case err != nil:
			return err
		default:
			creds, err := s.issuer.Credentials(ctx, p.ID)
			if err != nil {
				return err
			}
			for _, cr := range creds {
				if cr.RevokedAt == nil {
					if _, err := s.issuer.Revoke(ctx, cr.ID); err != nil {
						return err
					}
				}
			}
			if _, err := s.issuer.Ban(ctx, p.ID, retireBanReason); err != nil {
				return err
			}
		}
		if minted, err = s.mint(ctx, receipts.Receipt{
			ID: retiredReceiptID(w.ID), Kind: receipts.KindWorkerRetired,
			WorkerID: w.ID, NodeID: w.NodeID, Actor: c.principal.ID, Reason: req.Reason,
		}); err != nil {
			return err
		}
		for _, e := range ended {
			if err := s.jobChanged(ctx, c, e.From, e.Job); err != nil {
				return err
			}
		}
		if len(ended) > 0 {
			// Their jobs are queued again: wake waiting lease requests.
			return s.st.Notifier.Notify(ctx)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	if minted != nil {
		// The retired worker's open long-polls end at once (403
		// worker_banned).
		s.signalWorkers(c, w.ID)
	}
	code, ans, err := s.workerAnswer(ctx, c, w, minted)
	if err != nil || minted != nil {
		return code, ans, err
	}
	// Retired before: the first answer's receipt.
	out := ans.(wire.WorkerResponse)
	id := retiredReceiptID(w.ID)
	switch _, err := s.receipts.Get(ctx, id); {
	case err == nil:
		out.ReceiptID = &id
	case !errors.Is(err, receipts.ErrNotFound):
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}
