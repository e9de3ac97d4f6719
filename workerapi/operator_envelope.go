package workerapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Envelope.

func (s *Server) opGetEnvelope(ctx context.Context, c *call) (int, any, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.envelopeView(snap.State(), snap.Active()), nil
}

func (s *Server) envelopeView(st envelope.State, active bool) wire.EnvelopeResponse {
	p := s.gate.Policy()
	v := wire.EnvelopeResponse{
		Active:           active,
		PolicyVersion:    st.Version,
		By:               st.By,
		Reason:           st.Reason,
		Until:            st.Until,
		SafeTypes:        append(p.SafeTypes(), st.SafeTypes...),
		BlockedTypes:     p.BlockedTypes(),
		RuntimeSafeTypes: orEmpty(st.SafeTypes),
	}
	if !st.ChangedAt.IsZero() {
		t := st.ChangedAt
		v.ChangedAt = &t
	}
	return v
}

// changeEnvelope runs one change of the envelope in a transaction: change
// applies it and gives the receipt to mint under its new policy version;
// with wake, the long-polls are woken (queued jobs may be leasable now).
// The answer is the envelope as it is after the change, with the
// receipt's id.
func (s *Server) changeEnvelope(ctx context.Context, c *call, wake bool, change func(ctx context.Context) (envelope.State, receipts.Receipt, error)) (int, any, error) {
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var (
			r   receipts.Receipt
			err error
		)
		if st, r, err = change(ctx); err != nil {
			return err
		}
		r.PolicyVersion, r.Actor = st.Version, c.principal.ID
		if minted, err = s.receipts.Mint(ctx, r); err != nil {
			return err
		}
		if !wake {
			return nil
		}
		return s.st.Notifier.Notify(ctx)
	})
	if err != nil {
		return 0, nil, err
	}
	v := s.envelopeView(st, st.Active && (st.Until == nil || s.now().Before(*st.Until)))
	v.ReceiptID = *s.announce(c, minted)
	return http.StatusOK, v, nil
}

// opActivate activates the runtime, mints envelope_activated under the new
// policy version, and wakes long-polls (queued blocked jobs may be
// leasable now), in one transaction.
func (s *Server) opActivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ActivateRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	return s.changeEnvelope(ctx, c, true, func(ctx context.Context) (envelope.State, receipts.Receipt, error) {
		st, err := s.gate.Activate(ctx, c.principal.ID, req.Reason, req.Until)
		r := receipts.Receipt{Kind: receipts.KindEnvelopeActivated, Reason: req.Reason}
		if st.Until != nil {
			r.Until = *st.Until
		}
		return st, r, err
	})
}

// opDeactivate deactivates the runtime and mints envelope_deactivated
// under the new policy version, in one transaction. reason is required.
func (s *Server) opDeactivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	return s.changeEnvelope(ctx, c, false, func(ctx context.Context) (envelope.State, receipts.Receipt, error) {
		st, err := s.gate.Deactivate(ctx, c.principal.ID, req.Reason)
		return st, receipts.Receipt{Kind: receipts.KindEnvelopeDeactivated, Reason: req.Reason}, err
	})
}

// opSetSafeTypes changes the job types operators made safe at run time
// (envelope.Gate.SetSafeTypes) and mints envelope_safe_types_changed under
// the new policy version, with a wake-up of the long-polls (queued jobs
// of a type made safe may be leasable now), in one transaction. A
// canonical blocked type is refused: 400 invalid_request naming it.
func (s *Server) opSetSafeTypes(ctx context.Context, c *call) (int, any, error) {
	var req wire.SafeTypesRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	return s.changeEnvelope(ctx, c, true, func(ctx context.Context) (envelope.State, receipts.Receipt, error) {
		st, before, err := s.gate.SetSafeTypes(ctx, c.principal.ID, req.Reason, req.Add, req.Remove)
		return st, receipts.Receipt{
			Kind: receipts.KindEnvelopeSafeTypesChanged, Reason: req.Reason,
			JobTypes: strings.Join(st.SafeTypes, " "), OldJobTypes: strings.Join(before, " "),
		}, err
	})
}
