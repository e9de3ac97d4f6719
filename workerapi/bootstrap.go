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

// BootstrapTTL is the lifetime of the credentials Bootstrap mints. It is
// long because Bootstrap runs once: an operator replaces these with
// POST /operator/credentials (and revokes them) well before they expire.
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
	// ProvisioningToken carries node:register, for ProvisionerPrincipal.
	ProvisioningToken        string
	ProvisioningCredentialID string
	// ExpiresAt is when both tokens expire.
	ExpiresAt time.Time
}

// Bootstrap prepares a new database: when no OperatorPrincipal exists
// yet, it creates it (an operator) with a credential carrying every
// scope, and ProvisionerPrincipal (an operator-kind principal: a
// program with a bearer token, never a node) with a node:register
// credential, mints their credential_minted receipts (actor "system"),
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
			token    *string
			credID   *string
		}{
			// Every scope: the root of delegation (see Issuer.MintAs). Node
			// scopes open no worker route to an operator principal, which
			// has no node key, but node:register lets it mint provisioning
			// tokens.
			{OperatorPrincipal, "operator", credential.AllScopes(), &res.OperatorToken, &res.OperatorCredentialID},
			{ProvisionerPrincipal, "node provisioning", []credential.Scope{credential.ScopeNodeRegister}, &res.ProvisioningToken, &res.ProvisioningCredentialID},
		} {
			if _, err := s.issuer.CreatePrincipal(ctx, credential.Principal{ID: b.id, Kind: credential.KindOperator, Name: b.name}); err != nil {
				return err
			}
			token, cred, err := s.issuer.Mint(ctx, b.id, b.scopes, BootstrapTTL)
			if err != nil {
				return err
			}
			*b.token, *b.credID, res.ExpiresAt = token, cred.ID, cred.ExpiresAt
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
