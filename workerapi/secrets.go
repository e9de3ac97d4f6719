package workerapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/receipts"
)

// ErrNotBootstrapped is returned by MintOperatorToken on a database that
// Bootstrap never prepared: there is no OperatorPrincipal to mint for.
var ErrNotBootstrapped = errors.New("workerapi: the database is not bootstrapped (no operator principal): start the server to bootstrap it")

// CheckSecrets makes sure that this Server holds the secrets every other
// replica on the database holds (see package fingerprint): it stores the
// fingerprints of Config.Peppers and of the receipt signing key that the
// database lacks (the first replica's win, also when replicas start at
// once), and compares the others; a replica whose secrets differ adds
// none of its own (see fingerprint.Check). If a secret differs it returns an
// error that names it (errors.As finds a *fingerprint.MismatchError;
// errors.Is(err, fingerprint.ErrMismatch) holds) and shows fingerprints,
// never a secret: a replica with another pepper would verify none of the
// others' tokens, and one with another receipt signing key would sign
// checkpoints of the shared log that fail verification with the
// published key.
//
// A pepper version the database does not know is added (a pepper
// rotation, see package credential); one it knows with another value is
// refused. A version the database knows that Config.Peppers lacks is
// logged, not refused, so that a retired pepper can be dropped; tokens
// minted under it fail here.
//
// Start, Bootstrap and MintOperatorToken call it first; a host that
// serves Handler without Start should call it before it serves. Once it
// succeeded it returns nil at once.
func (s *Server) CheckSecrets(ctx context.Context) error {
	s.secrets.Lock()
	defer s.secrets.Unlock()
	if s.secrets.ok {
		return nil
	}
	now := s.now()
	have := make([]fingerprint.Fingerprint, 0, len(s.cfg.Peppers)+1)
	for _, v := range slices.Sorted(maps.Keys(s.cfg.Peppers)) {
		f := fingerprint.Pepper(v, s.cfg.Peppers[v])
		f.CreatedAt = now
		have = append(have, f)
	}
	rk := fingerprint.ReceiptKey(s.verifierKey)
	rk.CreatedAt = now
	have = append(have, rk)
	unheld, err := fingerprint.Check(ctx, s.st.Fingerprints, have)
	if err != nil {
		return fmt.Errorf("workerapi: %w", err)
	}
	for _, f := range unheld {
		s.log.Warn("a secret the database knows is not configured here: credentials that depend on it fail on this replica",
			"secret", f.Name(), "fingerprint", f.Value[:min(16, len(f.Value))])
	}
	s.secrets.ok = true
	return nil
}

// OperatorToken is a credential MintOperatorToken minted. The token is
// shown this once and never stored: show it to the operator, never log
// it.
type OperatorToken struct {
	Token        string
	CredentialID string
	ExpiresAt    time.Time
	// ReceiptID is the id of its credential_minted receipt.
	ReceiptID string
}

// MintOperatorToken is the way back in for an operator who lost every
// operator token (the break-glass): after CheckSecrets, it mints for
// OperatorPrincipal a credential with every scope, as Bootstrap does,
// living ttl, and its credential_minted receipt (actor "system"), in one
// transaction. It needs the database and the secrets, nothing else: a
// host runs it from a command on the server's machine, never from a
// route. ErrNotBootstrapped on a database without OperatorPrincipal; an
// error that wraps credential.ErrInvalidArgument for a ttl that is not
// positive or is over BootstrapTTL; an error for a banned
// OperatorPrincipal, whose credentials would not verify.
func (s *Server) MintOperatorToken(ctx context.Context, ttl time.Duration) (*OperatorToken, error) {
	if ttl <= 0 || ttl > BootstrapTTL {
		return nil, fmt.Errorf("workerapi: mint operator token: %w: ttl %v is not in (0, %v]", credential.ErrInvalidArgument, ttl, BootstrapTTL)
	}
	if err := s.CheckSecrets(ctx); err != nil {
		return nil, err
	}
	var (
		res    OperatorToken
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		p, err := s.issuer.Principal(ctx, OperatorPrincipal)
		switch {
		case errors.Is(err, credential.ErrNotFound):
			return ErrNotBootstrapped
		case err != nil:
			return err
		case p.Banned:
			return fmt.Errorf("principal %q is banned (%s): its credentials would not verify", OperatorPrincipal, p.BanReason)
		}
		token, cred, err := s.issuer.Mint(ctx, OperatorPrincipal, credential.AllScopes(), ttl)
		if err != nil {
			return err
		}
		if minted, err = s.mint(ctx, mintedReceipt(cred, "system")); err != nil {
			return err
		}
		res = OperatorToken{Token: token, CredentialID: cred.ID, ExpiresAt: cred.ExpiresAt, ReceiptID: minted.ID}
		return nil
	})
	if errors.Is(err, ErrNotBootstrapped) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("workerapi: mint operator token: %w", err)
	}
	st := *minted
	s.hooks.emit([]hookEvent{func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, st) }})
	return &res, nil
}
