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

// opActivate activates the runtime, mints envelope_activated under the new
// policy version, and wakes long-polls (queued blocked jobs may be
// leasable now), in one transaction.
func (s *Server) opActivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ActivateRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if st, err = s.gate.Activate(ctx, c.principal.ID, req.Reason, req.Until); err != nil {
			return err
		}
		r := receipts.Receipt{Kind: receipts.KindEnvelopeActivated, PolicyVersion: st.Version, Actor: c.principal.ID, Reason: req.Reason}
		if st.Until != nil {
			r.Until = *st.Until
		}
		if minted, err = s.receipts.Mint(ctx, r); err != nil {
			return err
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

// opDeactivate deactivates the runtime and mints envelope_deactivated
// under the new policy version, in one transaction. reason is required.
func (s *Server) opDeactivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if st, err = s.gate.Deactivate(ctx, c.principal.ID, req.Reason); err != nil {
			return err
		}
		minted, err = s.receipts.Mint(ctx, receipts.Receipt{
			Kind: receipts.KindEnvelopeDeactivated, PolicyVersion: st.Version, Actor: c.principal.ID, Reason: req.Reason,
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	v := s.envelopeView(st, false)
	v.ReceiptID = *s.announce(c, minted)
	return http.StatusOK, v, nil
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
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var (
			before []string
			err    error
		)
		if st, before, err = s.gate.SetSafeTypes(ctx, c.principal.ID, req.Reason, req.Add, req.Remove); err != nil {
			return err
		}
		minted, err = s.receipts.Mint(ctx, receipts.Receipt{
			Kind: receipts.KindEnvelopeSafeTypesChanged, PolicyVersion: st.Version, Actor: c.principal.ID, Reason: req.Reason,
			JobTypes: strings.Join(st.SafeTypes, " "), OldJobTypes: strings.Join(before, " "),
		})
		if err != nil {
			return err
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
