package bunstore

import (
	"context"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/fingerprint"
)

// FingerprintStore is the fingerprint.Store of a DB. Add joins the
// transaction its context carries (see DB.InTx and WithTx); without one it
// runs in its own, run again while the database aborts it (up to three
// times in all).
type FingerprintStore struct {
	db *DB
}

var _ fingerprint.Store = (*FingerprintStore)(nil)

// FingerprintStore returns the fingerprint.Store kept in db.
func (db *DB) FingerprintStore() *FingerprintStore { return &FingerprintStore{db: db} }

// fingerprintRow is a fingerprint.Fingerprint as stored.
type fingerprintRow struct {
	bun.BaseModel `bun:"table:nodelane_secret_fingerprints"`

	Kind        string `bun:"kind,pk"`
	ID          string `bun:"id,pk"`
	Fingerprint string `bun:"fingerprint"`
	CreatedAt   int64  `bun:"created_at"`
}

// Add implements fingerprint.Store: an INSERT ... ON CONFLICT DO NOTHING
// of each, then a SELECT of them all. On PostgreSQL the INSERT of a key
// that a concurrent transaction inserted waits for it to commit, and the
// SELECT, a statement of its own, sees its row.
func (s *FingerprintStore) Add(ctx context.Context, fps []fingerprint.Fingerprint) ([]fingerprint.Fingerprint, error) {
	if err := fingerprint.ValidateAll(fps); err != nil {
		return nil, err
	}
	var rows []fingerprintRow
	err := s.db.retryOwnTx(ctx, func() error {
		return s.db.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			for _, f := range fps {
				r := &fingerprintRow{Kind: string(f.Kind), ID: f.ID, Fingerprint: f.Value, CreatedAt: micros(f.CreatedAt)}
				if _, err := tx.NewInsert().Model(r).On("CONFLICT (kind, id) DO NOTHING").Exec(ctx); err != nil {
					return err
				}
			}
			rows = rows[:0]
			return tx.NewSelect().Model(&rows).Order("kind", "id").Scan(ctx)
		})
	})
	if err != nil {
		return nil, failed(err, fingerprint.ErrAborted, "add secret fingerprints")
	}
	var out []fingerprint.Fingerprint
	for _, r := range rows {
		out = append(out, fingerprint.Fingerprint{Kind: fingerprint.Kind(r.Kind), ID: r.ID, Value: r.Fingerprint, CreatedAt: fromMicros(r.CreatedAt)})
	}
	return out, nil
}
