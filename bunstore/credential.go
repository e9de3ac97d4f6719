package bunstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/credential"
)

// CredentialStore is the credential.Store of a DB. Every method joins the
// transaction its context carries (see DB.InTx and WithTx). When
// PostgreSQL aborts a transaction (a serialization failure or a deadlock),
// a method returns an error that matches credential.ErrAborted; a write
// whose context carries no transaction first runs again, up to three
// times in all.
//
// Its rows hold what a credential.Credential holds and nothing more: the
// id, the keyed digest of the secret, the scopes, the principal, the times
// and the revocation, never a token or a secret.
type CredentialStore struct {
	db *DB
}

var _ credential.Store = (*CredentialStore)(nil)

// CredentialStore returns the credential.Store kept in db.
func (db *DB) CredentialStore() *CredentialStore { return &CredentialStore{db: db} }

// principalRow is a credential.Principal as stored.
type principalRow struct {
	bun.BaseModel `bun:"table:nodelane_principals"`

	ID        string `bun:"id,pk"`
	Kind      string `bun:"kind"`
	Name      string `bun:"name"`
	PublicKey []byte `bun:"public_key"`
	KeyID     string `bun:"key_id"`
	Banned    bool   `bun:"banned"`
	BanReason string `bun:"ban_reason"`
	BannedAt  *int64 `bun:"banned_at"`
	CreatedAt int64  `bun:"created_at"`
	Rev       int64  `bun:"rev"`
}

func newPrincipalRow(p *credential.Principal) *principalRow {
	r := &principalRow{
		ID:        p.ID,
		Kind:      string(p.Kind),
		Name:      p.Name,
		KeyID:     p.KeyID,
		Banned:    p.Banned,
		BanReason: p.BanReason,
		BannedAt:  microsPtr(p.BannedAt),
		CreatedAt: micros(p.CreatedAt),
		Rev:       p.Rev,
	}
	// No key is NULL, not an empty BLOB.
	if len(p.PublicKey) > 0 {
		r.PublicKey = p.PublicKey
	}
	return r
}

func (r *principalRow) principal() *credential.Principal {
	p := &credential.Principal{
		ID:        r.ID,
		Kind:      credential.Kind(r.Kind),
		Name:      r.Name,
		KeyID:     r.KeyID,
		Banned:    r.Banned,
		BanReason: r.BanReason,
		BannedAt:  fromMicrosPtr(r.BannedAt),
		CreatedAt: fromMicros(r.CreatedAt),
		Rev:       r.Rev,
	}
	if len(r.PublicKey) > 0 {
		p.PublicKey = r.PublicKey
	}
	return p
}

// credentialRow is a credential.Credential as stored.
type credentialRow struct {
	bun.BaseModel `bun:"table:nodelane_credentials"`

	ID            string `bun:"id,pk"`
	PrincipalID   string `bun:"principal_id"`
	Scopes        string `bun:"scopes"`
	Digest        []byte `bun:"digest"`
	PepperVersion int    `bun:"pepper_version"`
	CreatedAt     int64  `bun:"created_at"`
	ExpiresAt     int64  `bun:"expires_at"`
	RevokedAt     *int64 `bun:"revoked_at"`
	RotatedTo     string `bun:"rotated_to"`
	MaxUses       int64  `bun:"max_uses"`
	Uses          int64  `bun:"uses"`
	Rev           int64  `bun:"rev"`
}

func newCredentialRow(c *credential.Credential) (*credentialRow, error) {
	scopes, err := joinScopes(c.Scopes)
	if err != nil {
		return nil, err
	}
	digest := c.Digest
	if digest == nil {
		// The column is NOT NULL; an empty digest matches no secret.
		digest = []byte{}
	}
	return &credentialRow{
		ID:            c.ID,
		PrincipalID:   c.PrincipalID,
		Scopes:        scopes,
		Digest:        digest,
		PepperVersion: c.PepperVersion,
		CreatedAt:     micros(c.CreatedAt),
		ExpiresAt:     micros(c.ExpiresAt),
		RevokedAt:     microsPtr(c.RevokedAt),
		RotatedTo:     c.RotatedTo,
		MaxUses:       c.MaxUses,
		Uses:          c.Uses,
		Rev:           c.Rev,
	}, nil
}

func (r *credentialRow) credential() *credential.Credential {
	c := &credential.Credential{
		ID:            r.ID,
		PrincipalID:   r.PrincipalID,
		Scopes:        splitScopes(r.Scopes),
		PepperVersion: r.PepperVersion,
		CreatedAt:     fromMicros(r.CreatedAt),
		ExpiresAt:     fromMicros(r.ExpiresAt),
		RevokedAt:     fromMicrosPtr(r.RevokedAt),
		RotatedTo:     r.RotatedTo,
		MaxUses:       r.MaxUses,
		Uses:          r.Uses,
		Rev:           r.Rev,
	}
	if len(r.Digest) > 0 {
		c.Digest = r.Digest
	}
	return c
}

// joinScopes writes scopes as one string, separated by single spaces, as
// an OAuth scope string is. A scope that is empty or holds white space
// could not be read back as it was given, so it is refused; no valid scope
// is either.
func joinScopes(scopes []credential.Scope) (string, error) {
	var b strings.Builder
	for i, s := range scopes {
		if s == "" || strings.ContainsFunc(string(s), unicode.IsSpace) {
			return "", fmt.Errorf("%w: scope %q cannot be stored", credential.ErrInvalidArgument, s)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(s))
	}
	return b.String(), nil
}

func splitScopes(s string) []credential.Scope {
	if s == "" {
		return nil
	}
	out := make([]credential.Scope, 0, strings.Count(s, " ")+1)
	for f := range strings.SplitSeq(s, " ") {
		out = append(out, credential.Scope(f))
	}
	return out
}

// CreatePrincipal inserts p. It returns credential.ErrConflict if the id
// is taken.
func (s *CredentialStore) CreatePrincipal(ctx context.Context, p *credential.Principal) error {
	err := s.insert(ctx, principalKey(p.ID), newPrincipalRow(p))
	return failed(err, credential.ErrAborted, "create principal %s", p.ID)
}

// GetPrincipal returns the principal with that id. It returns
// credential.ErrNotFound if there is none.
func (s *CredentialStore) GetPrincipal(ctx context.Context, id string) (*credential.Principal, error) {
	r, err := cachedRead(ctx, s.db, principalKey(id), func() (principalRow, error) {
		var r principalRow
		err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", id).Scan(ctx)
		return r, err
	})
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: principal %s: %w", id, credential.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get principal %s: %w", id, markAborted(err, credential.ErrAborted))
	}
	p := r.principal()
	p.PublicKey = bytes.Clone(p.PublicKey) // the cache keeps r
	return p, nil
}

// UpdatePrincipal replaces principal p.ID with p if its stored revision
// is rev. It returns credential.ErrConflict if the revision differs and
// credential.ErrNotFound if there is no such principal.
func (s *CredentialStore) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) error {
	err := s.update(ctx, principalKey(p.ID), newPrincipalRow(p), (*principalRow)(nil), p.ID, rev)
	return failed(err, credential.ErrAborted, "update principal %s", p.ID)
}

// PrincipalsByKey returns every principal whose key id is keyID, in id
// order (an index on key_id serves it); none for a key no one holds.
func (s *CredentialStore) PrincipalsByKey(ctx context.Context, keyID string) ([]*credential.Principal, error) {
	var rows []principalRow
	err := s.db.idb(ctx).NewSelect().Model(&rows).Where("key_id = ?", keyID).OrderExpr("id").Scan(ctx)
	if err != nil {
		return nil, fmt.Errorf("bunstore: principals of key %s: %w", keyID, markAborted(err, credential.ErrAborted))
	}
	return mapRows(rows, (*principalRow).principal), nil
}

// CreateCredential inserts c. It returns credential.ErrConflict if the id
// is taken, and credential.ErrInvalidArgument if a scope is empty or holds
// white space (no valid scope does), which the scopes column cannot hold.
func (s *CredentialStore) CreateCredential(ctx context.Context, c *credential.Credential) error {
	r, err := newCredentialRow(c)
	if err == nil {
		err = s.insert(ctx, credentialKey(c.ID), r)
	}
	return failed(err, credential.ErrAborted, "create credential %s", c.ID)
}

// GetCredential returns the credential with that id. It returns
// credential.ErrNotFound if there is none.
func (s *CredentialStore) GetCredential(ctx context.Context, id string) (*credential.Credential, error) {
	r, err := cachedRead(ctx, s.db, credentialKey(id), func() (credentialRow, error) {
		var r credentialRow
		err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", id).Scan(ctx)
		return r, err
	})
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: credential %s: %w", id, credential.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get credential %s: %w", id, markAborted(err, credential.ErrAborted))
	}
	c := r.credential()
	c.Digest = bytes.Clone(c.Digest) // the cache keeps r
	return c, nil
}

// UpdateCredential replaces credential c.ID with c if its stored revision
// is rev. It returns credential.ErrConflict if the revision differs and
// credential.ErrNotFound if there is no such credential; scopes as in
// CreateCredential.
func (s *CredentialStore) UpdateCredential(ctx context.Context, c *credential.Credential, rev int64) error {
	r, err := newCredentialRow(c)
	if err == nil {
		err = s.update(ctx, credentialKey(c.ID), r, (*credentialRow)(nil), c.ID, rev)
	}
	return failed(err, credential.ErrAborted, "update credential %s", c.ID)
}

// ListCredentials returns up to f.Limit credentials with an id above
// f.After (below it when f.Desc), of f.PrincipalID or of every principal
// when it is "", in byte order of the ids (descending when f.Desc) (the primary key, or the index on principal_id and id,
// serves each page). It returns credential.ErrInvalidArgument if f.Limit
// is below 1.
func (s *CredentialStore) ListCredentials(ctx context.Context, f credential.CredentialFilter) ([]*credential.Credential, error) {
	if f.Limit < 1 {
		return nil, fmt.Errorf("bunstore: list credentials: %w: limit %d is below 1", credential.ErrInvalidArgument, f.Limit)
	}
	var rows []credentialRow
	if err := credentialPage(s.db.idb(ctx), &rows, f).Scan(ctx); err != nil {
		return nil, fmt.Errorf("bunstore: list credentials: %w", markAborted(err, credential.ErrAborted))
	}
	return mapRows(rows, (*credentialRow).credential), nil
}

// credentialPage is the query of ListCredentials, into rows.
func credentialPage(idb bun.IDB, rows *[]credentialRow, f credential.CredentialFilter) *bun.SelectQuery {
	q := idb.NewSelect().Model(rows)
	if f.PrincipalID != "" {
		q = q.Where("principal_id = ?", f.PrincipalID)
	}
	if f.After != "" && f.Desc {
		q = q.Where("id < ?", f.After)
	} else if f.After != "" {
		q = q.Where("id > ?", f.After)
	}
	return q.OrderExpr(idOrder(f.Desc)).Limit(int64(f.Limit))
}

// insert writes row, the new entry key, with ON CONFLICT (id) DO NOTHING
// rather than letting a unique violation abort a PostgreSQL transaction
// the caller may go on with, and returns credential.ErrConflict if the id
// was taken.
func (s *CredentialStore) insert(ctx context.Context, key string, row any) error {
	return s.db.retryOwnTx(ctx, func() error {
		return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
			s.db.created(ctx, key)
			n, err := affected(idb.NewInsert().Model(row).On("CONFLICT (id) DO NOTHING").Exec(ctx))
			if err == nil && n == 0 {
				err = credential.ErrConflict
			}
			return err
		})
	})
}

// update writes row over the entry key, the row with that id, if its
// revision is rev: one conditional UPDATE, in one transaction with the
// announcement of the change (cache.go). When no row matches it looks for
// the id in the table of empty, a nil pointer of row's type, only to tell
// credential.ErrNotFound from credential.ErrConflict (no row is ever
// deleted).
func (s *CredentialStore) update(ctx context.Context, key string, row, empty any, id string, rev int64) error {
	return s.db.retryOwnTx(ctx, func() error {
		return s.db.inTx(ctx, func(ctx context.Context, idb bun.IDB) error {
			return s.db.updateCached(ctx, idb, key, func() error {
				n, err := affected(idb.NewUpdate().Model(row).WherePK().Where("rev = ?", rev).Exec(ctx))
				if err != nil || n == 1 {
					return err
				}
				exists, err := idb.NewSelect().Model(empty).Where("id = ?", id).Exists(ctx)
				if err != nil {
					return err
				}
				if !exists {
					return credential.ErrNotFound
				}
				return fmt.Errorf("%w: revision is not %d", credential.ErrConflict, rev)
			})
		})
	})
}
