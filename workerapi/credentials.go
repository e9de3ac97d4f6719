package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Principals and credentials (PROTOCOL.md §13): the listing, the minting
// and the revoking of credentials.

// defaultCredentialPage is the page of GET /operator/credentials without
// limit=.
const defaultCredentialPage = credential.DefaultListLimit

// opCreatePrincipal creates a named operator principal, with no
// credential: POST /operator/credentials then gives it some, within the
// scopes the minting credential holds. It mints principal_created, in the
// transaction that creates the principal. An id that is taken, by an
// operator or by a node, is 409 principal_exists and changes nothing.
func (s *Server) opCreatePrincipal(ctx context.Context, c *call) (int, any, error) {
	var req wire.CreatePrincipalRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.ID == "":
		return 0, nil, fmt.Errorf("%w: id is required", ErrInvalidRequest)
	case len(req.ID) > wire.MaxPrincipalIDLen:
		// Checked here so that the answer never echoes a long id.
		return 0, nil, fmt.Errorf("%w: id is longer than %d bytes", ErrInvalidRequest, wire.MaxPrincipalIDLen)
	case len(req.Name) > wire.MaxPrincipalNameLen:
		return 0, nil, fmt.Errorf("%w: name is longer than %d bytes", ErrInvalidRequest, wire.MaxPrincipalNameLen)
	}
	var (
		p      *credential.Principal
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		p, err = s.issuer.CreatePrincipal(ctx, credential.Principal{ID: req.ID, Kind: credential.KindOperator, Name: req.Name})
		if errors.Is(err, credential.ErrConflict) {
			return fmt.Errorf("%w: a principal with id %q exists already", ErrPrincipalExists, req.ID)
		}
		if err != nil {
			return err
		}
		minted, err = s.mint(ctx, receipts.Receipt{
			Kind: receipts.KindPrincipalCreated, PrincipalID: p.ID, Actor: c.principal.ID, Name: p.Name,
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.CreatePrincipalResponse{
		ID: p.ID, Kind: string(p.Kind), Name: p.Name, CreatedAt: p.CreatedAt, ReceiptID: *s.announce(c, minted),
	}, nil
}

// opListCredentials lists credentials, of one principal or of all, in
// byte order of their ids: what each may do and until when, never a
// token, a secret or a digest. An unknown principal is a 404, not an
// empty list.
func (s *Server) opListCredentials(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	principal, err := qString(q, "principal")
	if err != nil {
		return 0, nil, err
	}
	after, err := qString(q, "after")
	if err != nil {
		return 0, nil, err
	}
	limit, err := qLimit(q)
	if err != nil {
		return 0, nil, err
	}
	if limit == 0 {
		limit = defaultCredentialPage
	}
	desc, err := qDesc(q)
	if err != nil {
		return 0, nil, err
	}
	cs, next, err := s.issuer.ListCredentials(ctx, credential.CredentialFilter{PrincipalID: principal, After: after, Limit: limit, Desc: desc})
	if err != nil {
		return 0, nil, err
	}
	out := wire.CredentialListResponse{Credentials: make([]wire.CredentialView, len(cs))}
	for i, cr := range cs {
		out.Credentials[i] = wire.CredentialView{
			CredentialID:     cr.ID,
			Principal:        cr.PrincipalID,
			Scopes:           scopeStrings(cr.Scopes),
			CreatedAt:        cr.CreatedAt,
			ExpiresAt:        cr.ExpiresAt,
			RevokedAt:        cr.RevokedAt,
			Registrations:    cr.Uses,
			MaxRegistrations: registrationLimit(cr),
		}
	}
	if next != "" {
		out.Next = &next
	}
	return http.StatusOK, out, nil
}

// Minting and revoking.

// maxCredentialTTL bounds ttl_seconds: ten years.
const maxCredentialTTL = 10 * 366 * 24 * 3600

// opMintCredential mints a credential for an existing principal (404 for
// an unknown one: a typo must not create an identity; principals are
// created by registration, Bootstrap, POST /operator/principals, or in Go
// with Server.Issuer), with scopes the caller's credential holds itself
// (403 otherwise). A node principal may not be given operator scopes: a
// worker machine's token must never open the operator routes.
func (s *Server) opMintCredential(ctx context.Context, c *call) (int, any, error) {
	var req wire.MintCredentialRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.Principal == "":
		return 0, nil, fmt.Errorf("%w: principal is required", ErrInvalidRequest)
	case len(req.Scopes) == 0:
		return 0, nil, fmt.Errorf("%w: scopes must name at least one scope", ErrInvalidRequest)
	case req.TTLSeconds < 0 || req.TTLSeconds > maxCredentialTTL:
		return 0, nil, fmt.Errorf("%w: ttl_seconds must be 0 (30 days) to %d", ErrInvalidRequest, maxCredentialTTL)
	}
	scopes := make([]credential.Scope, len(req.Scopes))
	operatorScope := false
	for i, sc := range req.Scopes {
		p, err := credential.ParseScope(sc)
		if err != nil {
			return 0, nil, err
		}
		scopes[i] = p
		operatorScope = operatorScope || strings.HasPrefix(sc, "operator:")
	}
	maxUses, err := maxRegistrations(req.MaxRegistrations, scopes)
	if err != nil {
		return 0, nil, err
	}
	var (
		token  string
		cred   *credential.Credential
		minted *receipts.Stored
	)
	err = s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		p, err := s.issuer.Principal(ctx, req.Principal)
		if err != nil {
			return err
		}
		if p.Kind == credential.KindNode && operatorScope {
			return fmt.Errorf("%w: a node principal may not hold operator scopes", ErrInvalidRequest)
		}
		// MintAs refuses scopes the caller's own credential lacks (403):
		// no credential mints one more powerful than itself.
		opt := credential.MintOptions{TTL: time.Duration(req.TTLSeconds) * time.Second, MaxUses: maxUses}
		if token, cred, err = s.issuer.MintAs(ctx, c.credentialID, p.ID, scopes, opt); err != nil {
			return err
		}
		minted, err = s.mint(ctx, mintedReceipt(cred, c.principal.ID))
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	out := wire.MintCredentialResponse{
		CredentialID: cred.ID,
		Token:        token,
		Principal:    cred.PrincipalID,
		Scopes:       scopeStrings(cred.Scopes),
		ExpiresAt:    cred.ExpiresAt,
		ReceiptID:    *s.announce(c, minted),
	}
	out.MaxRegistrations = registrationLimit(cred)
	return http.StatusCreated, out, nil
}

func mintedReceipt(cred *credential.Credential, actor string) receipts.Receipt {
	return receipts.Receipt{
		Kind:         receipts.KindCredentialMinted,
		CredentialID: cred.ID,
		PrincipalID:  cred.PrincipalID,
		Scopes:       strings.Join(scopeStrings(cred.Scopes), " "),
		Actor:        actor,
		ExpiresAt:    cred.ExpiresAt,
	}
}

func scopeStrings(sc []credential.Scope) []string {
	out := make([]string, len(sc))
	for i, s := range sc {
		out[i] = string(s)
	}
	return out
}

func (s *Server) opRevokeCredential(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decodeOptional(&req); err != nil {
		return 0, nil, err
	}
	var (
		cred   *credential.Credential
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		before, err := s.issuer.Credential(ctx, c.pathID())
		if err != nil {
			return err
		}
		if cred, err = s.issuer.Revoke(ctx, before.ID); err != nil || cred.Rev == before.Rev {
			return err
		}
		minted, err = s.mint(ctx, receipts.Receipt{
			Kind: receipts.KindCredentialRevoked, CredentialID: cred.ID, PrincipalID: cred.PrincipalID,
			Actor: c.principal.ID, Reason: req.Reason,
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	out := wire.RevokeCredentialResponse{CredentialID: cred.ID, Principal: cred.PrincipalID, RevokedAt: *cred.RevokedAt}
	if minted != nil {
		out.ReceiptID = s.announce(c, minted)
	}
	return http.StatusOK, out, nil
}
