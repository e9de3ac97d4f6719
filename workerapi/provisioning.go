package workerapi

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Least privilege for nodes: a ban follows the node's key, a provisioning
// credential may be limited in registrations, and a registered node
// renews its own token (POST /workers/token) with its key, so the
// provisioning token need not stay on the machine.

// admitRegistration runs in a registration's transaction before anything
// is created: a key banned under any node id is refused (403
// worker_banned), and a use of the provisioning credential c presented is
// counted, in the same transaction, so that the registrations it
// authorises never exceed its max_registrations (401 token_exhausted).
func (s *Server) admitRegistration(ctx context.Context, c *call, pub ed25519.PublicKey) error {
	if err := s.keyNotBanned(ctx, pub); err != nil {
		return err
	}
	if _, err := s.issuer.Use(ctx, c.credentialID); err != nil {
		return fmt.Errorf("provisioning credential %s: %w", c.credentialID, err)
	}
	return nil
}

// keyNotBanned refuses a node key that a banned principal holds, whatever
// its node id.
func (s *Server) keyNotBanned(ctx context.Context, pub ed25519.PublicKey) error {
	b, err := s.issuer.KeyBan(ctx, pub)
	if err != nil {
		return err
	}
	if b != nil {
		return fmt.Errorf("%w: key %s belongs to banned worker %s", credential.ErrBanned, credential.KeyID(pub), b.ID)
	}
	return nil
}

// logRegistration logs, once the registration has committed, which
// provisioning credential registered the node and which worker token it
// was given (ids only, never a token).
func (s *Server) logRegistration(c *call, w *lease.Worker, pub ed25519.PublicKey, tokenID string) {
	prov, workerID, nodeID := c.credentialID, w.ID, w.NodeID
	c.cleanup(func() {
		if c.committed {
			s.log.Info("worker registered", "request_id", c.reqID, "worker_id", workerID, "node_id", nodeID,
				"key_id", credential.KeyID(pub), "credential", tokenID, "provisioning_credential", prov)
		}
	})
}

// renewToken: POST /workers/token. A registered node renews its worker
// token with that token and its key's signature: the new token has the
// old one's scopes and lives Config.WorkerTokenTTL, and the old one keeps
// working for wire.TokenRenewalGraceSeconds, for requests under way, then
// stops. Renewing again with the old token within that grace (the answer
// was lost) answers the first answer, remembered under the old token
// (answers.go): no second token is minted. A key
// banned under any node id is refused. It mints a credential_minted
// receipt whose actor is the worker.
func (s *Server) renewToken(ctx context.Context, c *call) (int, any, error) {
	var req wire.RenewTokenRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if err := s.keyNotBanned(ctx, c.principal.PublicKey); err != nil {
		return 0, nil, err
	}
	// A repeat with the same bearer token, which keeps working until the
	// renewal's grace ends, gets the first answer: a renewal whose answer
	// was lost mints no second token.
	k, err := keyFor(c, "token", "", c.bearer, req)
	if err != nil {
		return 0, nil, err
	}
	k.byToken = true
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	tok, nc, err := s.issuer.Renew(ctx, c.credentialID, s.cfg.WorkerTokenTTL, wire.TokenRenewalGraceSeconds*time.Second)
	if err != nil {
		return 0, nil, err
	}
	old, err := s.issuer.Credential(ctx, c.credentialID)
	if err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.mintFor(ctx, c, snap, mintedReceipt(nc, c.principal.ID)); err != nil {
		return 0, nil, err
	}
	out := wire.RenewTokenResponse{
		WorkerID:               c.principal.ID,
		WorkerToken:            tok,
		TokenExpiresAt:         nc.ExpiresAt,
		PreviousTokenExpiresAt: old.ExpiresAt,
		ServerTime:             s.now(),
	}
	// Remembered while the previous token works: no repeat can come later.
	if old.ExpiresAt.After(s.now()) {
		if err := s.remember(ctx, c, k, http.StatusOK, out, old.ExpiresAt); err != nil {
			return 0, nil, err
		}
	}
	return http.StatusOK, out, nil
}

// maxRegistrations checks the max_registrations of a mint request and
// returns the credential's limit of uses: 0 (none) when absent; 1 to
// wire.MaxRegistrations, and only with node:register, otherwise.
func maxRegistrations(n *int64, scopes []credential.Scope) (int64, error) {
	switch {
	case n == nil:
		return 0, nil
	case *n < 1 || *n > wire.MaxRegistrations:
		return 0, invalid("max_registrations must be 1 to %d, or absent for no limit", wire.MaxRegistrations)
	case !slices.Contains(scopes, credential.ScopeNodeRegister):
		return 0, invalid("max_registrations limits registrations: it needs the scope %s", credential.ScopeNodeRegister)
	}
	return *n, nil
}

// registrationLimit is a credential's max_registrations on the wire: null
// for none.
func registrationLimit(c *credential.Credential) *int64 {
	if c.MaxUses <= 0 {
		return nil
	}
	n := c.MaxUses
	return &n
}
