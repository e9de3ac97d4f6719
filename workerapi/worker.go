package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
)

// The worker routes of PROTOCOL.md. Each handler runs inside the
// request's transaction (the ctx it is given carries it), after the
// pipeline of http.go checked the framing, the credential, the scope and
// the signature and consumed the nonce; c.principal.ID is the worker id.

// Request validation helpers.

// invalid returns an ErrInvalidRequest with a message.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// object returns raw if it is a JSON object, nil if it is absent or
// null, and ErrInvalidRequest otherwise. The decoder has checked that
// raw is valid JSON.
func object(field string, raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0 || string(t) == "null":
		return nil, nil
	case t[0] != '{':
		return nil, invalid("%s must be a JSON object", field)
	}
	return t, nil
}

// payloadHash is the SHA-256 a receipt carries for a free-form payload
// (receipts.PayloadSHA256; an absent payload is hashed as null).
func payloadHash(raw json.RawMessage) (string, error) {
	h, err := receipts.PayloadSHA256(raw)
	if err != nil {
		return "", invalid("payload is not valid JSON")
	}
	return h, nil
}

// decodeLeased decodes the body into req and returns the lease named by
// *token, a field of req, as leaseRef checks it.
func (c *call) decodeLeased(req any, token *string) (lease.Ref, error) {
	if err := c.decode(req); err != nil {
		return lease.Ref{}, err
	}
	return leaseRef(c, *token)
}

// leaseRef checks that a lease token was given and has the shape of one
// (the lease.Manager checks its checksum), and names the job of the
// route's path under it.
func leaseRef(c *call, token string) (lease.Ref, error) {
	return jobRef(c, c.pathID(), token)
}

// jobRef is leaseRef for job jobID. The shape it checks is the OpenAPI
// document's pattern for a lease token.
func jobRef(c *call, jobID, token string) (lease.Ref, error) {
	if token == "" {
		return lease.Ref{}, invalid("lease_token is required")
	}
	if len(token) != lease.TokenLen || !strings.HasPrefix(token, lease.TokenPrefix) || !isBase62(token[len(lease.TokenPrefix):]) {
		return lease.Ref{}, fmt.Errorf("%w: %w", ErrInvalidRequest, lease.ErrMalformedToken)
	}
	return lease.Ref{JobID: jobID, WorkerID: c.principal.ID, Token: token}, nil
}

// isBase62 reports whether s holds only the digits of base 62.
func isBase62(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// Hooks and receipts.

// jobChanged queues the JobChanged hook of a committed change of j from
// state from, with the job's artifacts when it reached a terminal state.
//
// It also notes the change's INFO log line (logJob) and its
// JobMetrics observation (observeJob), for when the request commits.
func (s *Server) jobChanged(ctx context.Context, c *call, from lease.State, j *lease.Job) error {
	if j.State == from {
		return nil
	}
	jc, event := *j, jobEvent(from, j, c.r.Pattern)
	c.note(func() { s.logJob(event, from, &jc); s.observeJob(from, &jc) })
	if s.cfg.Hooks == nil {
		return nil
	}
	ev := JobEvent{From: from, Job: *j}
	if j.State.Terminal() {
		arts, err := s.jobArtifacts(ctx, j.ID)
		if err != nil {
			return err
		}
		for _, a := range arts {
			ev.Artifacts = append(ev.Artifacts, *a)
		}
	}
	c.after(func(ctx context.Context, h Hooks) { h.JobChanged(ctx, ev) })
	return nil
}

// mintFor mints r under the policy version of snap, in the request's
// transaction, and queues its ReceiptMinted hook.
func (s *Server) mintFor(ctx context.Context, c *call, snap *envelope.Snapshot, r receipts.Receipt) (*receipts.Stored, error) {
	ss, err := s.mintAllFor(ctx, c, snap, r)
	if err != nil {
		return nil, err
	}
	return ss[0], nil
}

// mintAllFor is mintFor for several receipts, minted in one store call
// where the store allows (receipts.Log.MintAll).
func (s *Server) mintAllFor(ctx context.Context, c *call, snap *envelope.Snapshot, rs ...receipts.Receipt) ([]*receipts.Stored, error) {
	for i := range rs {
		rs[i].PolicyVersion = snap.Version()
	}
	ss, err := s.receipts.MintAll(ctx, rs...)
	if err != nil {
		return nil, err
	}
	for _, st := range ss {
		cp := *st
		c.after(func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, cp) })
	}
	return ss, nil
}
