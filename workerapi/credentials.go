package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Principals and the listing of credentials (PROTOCOL.md §13). Minting
// and revoking are in operator.go.

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
	cs, next, err := s.issuer.ListCredentials(ctx, credential.CredentialFilter{PrincipalID: principal, After: after, Limit: limit})
	if err != nil {
		return 0, nil, err
	}
	out := wire.CredentialListResponse{Credentials: make([]wire.CredentialView, len(cs))}
	for i, cr := range cs {
		out.Credentials[i] = wire.CredentialView{
			CredentialID: cr.ID,
			Principal:    cr.PrincipalID,
			Scopes:       scopeStrings(cr.Scopes),
			CreatedAt:    cr.CreatedAt,
			ExpiresAt:    cr.ExpiresAt,
			RevokedAt:    cr.RevokedAt,
		}
	}
	if next != "" {
		out.Next = &next
	}
	return http.StatusOK, out, nil
}
