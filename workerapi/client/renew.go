package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// RenewToken renews the worker token (POST /workers/token): the request
// carries the current token and is signed by the node's key, so no
// provisioning token is needed. The new token replaces the old one in
// the identity and, if it has a file, in that file; the old one keeps
// working for wire.TokenRenewalGraceSeconds at most, for requests under
// way. If saving fails, RenewToken returns the answer together with the
// error, and the Client goes on with the new token. A token that no
// longer verifies (expired, revoked) cannot be renewed: the node must
// register again.
func (c *Client) RenewToken(ctx context.Context) (*wire.RenewTokenResponse, error) {
	if c.id.Token() == "" {
		return nil, errors.New("client: renew needs a worker token: register first")
	}
	var out wire.RenewTokenResponse
	if _, err := c.do(ctx, wire.PathToken, wire.RenewTokenRequest{}, &out, callOpts{}); err != nil {
		return nil, err
	}
	if out.WorkerToken == "" {
		return nil, &APIError{Status: http.StatusOK, Route: wire.PathToken, Message: "the answer has no worker_token"}
	}
	workerID := out.WorkerID
	if workerID == "" {
		workerID = c.id.WorkerID()
	}
	if err := c.id.setRegistration(c.id.NodeID(), workerID, out.WorkerToken, out.TokenExpiresAt); err != nil {
		return &out, fmt.Errorf("client: renewed the worker token, but %w", err)
	}
	return &out, nil
}

// tokenDead reports whether err says the token used can no longer be
// renewed, so that only a new registration gives the node a token: it
// expired, was revoked or is unknown, or the server has no renewal route
// (404 from a control plane older than it).
func tokenDead(err error) bool {
	switch ErrorCode(err) {
	case wire.CodeTokenExpired, wire.CodeTokenRevoked, wire.CodeInvalidToken, wire.CodeNotFound:
		return true
	}
	return false
}

// refreshLocked gets the worker a new token, with renewMu held: it renews
// the current one (RenewToken) while it still verifies, and registers
// again with RunnerConfig.ProvisioningToken only when there is no token,
// or the one held can no longer be renewed.
func (w *Runner) refreshLocked(ctx context.Context) error {
	if w.c.id.Token() == "" {
		return w.registerLocked(ctx, nil)
	}
	w.lastTry = w.c.ServerNow()
	out, err := w.c.RenewToken(ctx)
	if out != nil {
		w.scheduleRenewal(out.TokenExpiresAt, out.ServerTime)
		w.log.Info("renewed the worker token", "worker_id", out.WorkerID, "token_expires_at", out.TokenExpiresAt)
		if err != nil {
			w.log.Error("saving the identity", "err", err)
		}
		return nil
	}
	if w.cfg.ProvisioningToken == "" || !tokenDead(err) {
		return err
	}
	w.log.Warn("the worker token cannot be renewed: registering again", "err", err)
	return w.registerLocked(ctx, nil)
}

// scheduleRenewal sets when the token that expires at exp (server time)
// should be renewed: TokenRenewBefore before exp, or a third of its
// lifetime before, if that is sooner. issued is the server_time of the
// answer that gave it, or zero. renewMu is held.
func (w *Runner) scheduleRenewal(exp, issued time.Time) {
	if exp.IsZero() {
		return
	}
	life := exp.Sub(issued)
	if issued.IsZero() {
		life = w.c.until(exp)
	}
	w.renewAt = exp.Add(-min(w.cfg.TokenRenewBefore, life/3))
}
