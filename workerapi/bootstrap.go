package workerapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/receipts"
)

// The principals Bootstrap creates.
const (
	// OperatorPrincipal is the well-known id of the first operator. Its
	// existence is what marks a database as bootstrapped.
	OperatorPrincipal = "operator"
	// ProvisionerPrincipal is the well-known id of the principal whose
	// node:register credential provisions new worker nodes.
	ProvisionerPrincipal = "provisioner"
)

// BootstrapTTL is the lifetime of the operator credential Bootstrap
// mints (and the longest MintOperatorToken mints). It is long because
// Bootstrap runs once: an operator replaces it with
// POST /operator/credentials (and revokes it) well before it expires.
// The provisioning credential lives Config.ProvisioningTokenTTL: it is
// copied to every new machine, so it is short-lived and limited in
// registrations, and the operator mints the next one.
const BootstrapTTL = 365 * 24 * time.Hour

// BootstrapResult is what Bootstrap did. The tokens are shown this once
// and never stored: show them to the person setting up, never log them.
type BootstrapResult struct {
	// Created is false when the database was bootstrapped already; the
	// other fields are then empty.
	Created bool
	// OperatorToken carries every scope, for OperatorPrincipal: a
	// credential mints only scopes it holds, so the first operator's holds
	// them all (it mints provisioning tokens, which carry node:register).
	OperatorToken        string
	OperatorCredentialID string
	// ProvisioningToken carries node:register, for ProvisionerPrincipal,
	// and may register Config.ProvisioningRegistrations nodes.
	ProvisioningToken        string
	ProvisioningCredentialID string
	// ExpiresAt is when the operator token expires (BootstrapTTL).
	ExpiresAt time.Time
	// ProvisioningExpiresAt is when the provisioning token expires
	// (Config.ProvisioningTokenTTL).
	ProvisioningExpiresAt time.Time
}

// Bootstrap prepares a new database: when no OperatorPrincipal exists
// yet, it creates it (an operator) with a credential carrying every
// scope, living BootstrapTTL, and ProvisionerPrincipal (an operator-kind
// principal: a program with a bearer token, never a node) with a
// node:register credential living Config.ProvisioningTokenTTL and limited
// to Config.ProvisioningRegistrations registrations, mints their credential_minted receipts (actor "system"),
// all in one transaction, and returns both tokens with Created true.
// Otherwise it changes nothing and returns Created false. It runs
// CheckSecrets first, and returns its error.
//
// Replicas may call it at once on one database: exactly one creates, the
// others see Created false. Once bootstrapped, a database is never
// bootstrapped again, even if every operator credential was revoked:
// recover with MintOperatorToken.
func (s *Server) Bootstrap(ctx context.Context) (*BootstrapResult, error) {
	if err := s.CheckSecrets(ctx); err != nil {
		return nil, err
	}
	switch done, err := s.bootstrapped(ctx); {
	case err != nil:
		return nil, fmt.Errorf("workerapi: bootstrap: %w", err)
	case done:
		return &BootstrapResult{}, nil
	}
	var (
		res    BootstrapResult
		minted []*receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		// Looked at again inside the transaction: on SQLite it serialises
		// every writer, so a replica that waited sees the other's commit.
		if done, err := s.bootstrapped(ctx); err != nil || done {
			return err
		}
		for _, b := range []struct {
			id, name string
			scopes   []credential.Scope
			opt      credential.MintOptions
			token    *string
			credID   *string
			expires  *time.Time
		}{
			// Every scope: the root of delegation (see Issuer.MintAs). Node
			// scopes open no worker route to an operator principal, which
			// has no node key, but node:register lets it mint provisioning
			// tokens.
			{OperatorPrincipal, "operator", credential.AllScopes(), credential.MintOptions{TTL: BootstrapTTL},
				&res.OperatorToken, &res.OperatorCredentialID, &res.ExpiresAt},
			{ProvisionerPrincipal, "node provisioning", []credential.Scope{credential.ScopeNodeRegister},
				credential.MintOptions{TTL: s.cfg.ProvisioningTokenTTL, MaxUses: s.cfg.ProvisioningRegistrations},
				&res.ProvisioningToken, &res.ProvisioningCredentialID, &res.ProvisioningExpiresAt},
		} {
			if _, err := s.issuer.CreatePrincipal(ctx, credential.Principal{ID: b.id, Kind: credential.KindOperator, Name: b.name}); err != nil {
				return err
			}
			token, cred, err := s.issuer.MintWith(ctx, b.id, b.scopes, b.opt)
			if err != nil {
				return err
			}
			*b.token, *b.credID, *b.expires = token, cred.ID, cred.ExpiresAt
			r, err := s.mint(ctx, mintedReceipt(cred, "system"))
			if err != nil {
				return err
			}
			minted = append(minted, r)
		}
		res.Created = true
		return nil
	})
	if errors.Is(err, credential.ErrConflict) {
		// Another replica created the principal first (PostgreSQL: our
		// insert waited for its commit, then hit the unique key).
		if done, derr := s.bootstrapped(ctx); derr == nil && done {
			return &BootstrapResult{}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("workerapi: bootstrap: %w", err)
	}
	if !res.Created {
		return &BootstrapResult{}, nil
	}
	evs := make([]hookEvent, len(minted))
	for i, r := range minted {
		st := *r
		evs[i] = func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, st) }
	}
	s.hooks.emit(evs)
	return &res, nil
}

// bootstrapped reports whether OperatorPrincipal exists.
func (s *Server) bootstrapped(ctx context.Context) (bool, error) {
	_, err := s.issuer.Principal(ctx, OperatorPrincipal)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, credential.ErrNotFound):
		return false, nil
	}
	return false, err
}
