package bunstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/envelope"
)

// EnvelopeStore is the envelope.Store of a DB. Every method joins the
// transaction its context carries (see DB.InTx and WithTx). When
// PostgreSQL aborts a transaction (a serialization failure or a deadlock),
// a method returns an error that matches envelope.ErrAborted; Apply, when
// its context carries no transaction, first runs again, up to three times
// in all.
type EnvelopeStore struct {
	db *DB
}

var _ envelope.Store = (*EnvelopeStore)(nil)

// EnvelopeStore returns the envelope.Store kept in db.
func (db *DB) EnvelopeStore() *EnvelopeStore { return &EnvelopeStore{db: db} }

// envelopeStateID is the key of the one row of nodelane_envelope.
const envelopeStateID = 1

// envelopeStateRow is the current envelope.State as stored.
type envelopeStateRow struct {
	bun.BaseModel `bun:"table:nodelane_envelope"`

	ID        int64  `bun:"id,pk"`
	Version   int64  `bun:"version"`
	Active    bool   `bun:"active"`
	Actor     string `bun:"actor"`
	Reason    string `bun:"reason"`
	Deadline  *int64 `bun:"deadline"`
	ChangedAt int64  `bun:"changed_at"`
	SafeTypes string `bun:"safe_types"`
}

// envelopeRecordRow is an envelope.Record as stored.
type envelopeRecordRow struct {
	bun.BaseModel `bun:"table:nodelane_envelope_history"`

	Version   int64  `bun:"version,pk"`
	Action    string `bun:"action"`
	Actor     string `bun:"actor"`
	Reason    string `bun:"reason"`
	Deadline  *int64 `bun:"deadline"`
	ChangedAt int64  `bun:"changed_at"`
	SafeTypes string `bun:"safe_types"`
	WasActive bool   `bun:"was_active"`
}

func (r *envelopeRecordRow) record() envelope.Record {
	return envelope.Record{
		Version:   r.Version,
		Action:    envelope.Action(r.Action),
		By:        r.Actor,
		Reason:    r.Reason,
		Until:     fromMicrosPtr(r.Deadline),
		At:        fromMicros(r.ChangedAt),
		SafeTypes: splitTypes(r.SafeTypes),
		WasActive: r.WasActive,
	}
}

// joinTypes and splitTypes store a list of job types (which hold no
// whitespace) as one space-separated column, ” for none.
func joinTypes(ts []string) string { return strings.Join(ts, " ") }

func splitTypes(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, " ")
}

// State returns the current state, or envelope.InitialState() if no
// change was ever applied.
func (s *EnvelopeStore) State(ctx context.Context) (envelope.State, error) {
	// The cache keeps the row (nil: no change applied yet), which each
	// call turns into a State of its own.
	r, err := cachedRead(ctx, s.db, envelopeKey, func() (*envelopeStateRow, error) {
		var r envelopeStateRow
		err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", envelopeStateID).Scan(ctx)
		if isNoRows(err) {
			return nil, nil
		}
		return &r, err
	})
	if err != nil {
		return envelope.State{}, fmt.Errorf("bunstore: envelope state: %w", markAborted(err, envelope.ErrAborted))
	}
	if r == nil {
		return envelope.InitialState(), nil
	}
	return envelope.State{
		Version:   r.Version,
		Active:    r.Active,
		By:        r.Actor,
		Reason:    r.Reason,
		Until:     fromMicrosPtr(r.Deadline),
		ChangedAt: fromMicros(r.ChangedAt),
		SafeTypes: splitTypes(r.SafeTypes),
	}, nil
}

// Apply makes next the current state and appends rec to the history, in
// one transaction (the context's, if it carries one), only if the current
// version is prev. It returns envelope.ErrConflict if the version differs.
//
// The state row is written by one conditional statement, so of two
// writers at the same version exactly one matches it: on PostgreSQL the
// other waits for the row (or, for the first change, the key) and then
// finds it changed; on SQLite writers are serialised anyway.
func (s *EnvelopeStore) Apply(ctx context.Context, prev int64, next envelope.State, rec envelope.Record) error {
	row := &envelopeStateRow{
		ID:        envelopeStateID,
		Version:   next.Version,
		Active:    next.Active,
		Actor:     next.By,
		Reason:    next.Reason,
		Deadline:  microsPtr(next.Until),
		ChangedAt: micros(next.ChangedAt),
		SafeTypes: joinTypes(next.SafeTypes),
	}
	hist := &envelopeRecordRow{
		Version:   rec.Version,
		Action:    string(rec.Action),
		Actor:     rec.By,
		Reason:    rec.Reason,
		Deadline:  microsPtr(rec.Until),
		ChangedAt: micros(rec.At),
		SafeTypes: joinTypes(rec.SafeTypes),
		WasActive: rec.WasActive,
	}
	err := s.db.retryOwnTx(ctx, func() error { return s.apply(ctx, prev, row, hist) })
	return failed(err, envelope.ErrAborted, "apply envelope version %d at version %d", next.Version, prev)
}

func (s *EnvelopeStore) apply(ctx context.Context, prev int64, row *envelopeStateRow, hist *envelopeRecordRow) error {
	return s.db.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		n, err := affected(tx.NewUpdate().Model(row).WherePK().Where("version = ?", prev).Exec(ctx))
		if err == nil && n == 0 && prev == envelope.InitialVersion {
			// The first change inserts the row. DO NOTHING rather than a
			// unique violation, which would abort a PostgreSQL transaction
			// the caller may want to go on with after the conflict.
			n, err = affected(tx.NewInsert().Model(row).On("CONFLICT (id) DO NOTHING").Exec(ctx))
		}
		if err != nil {
			return err
		}
		if n == 0 {
			s.db.forget(envelopeKey) // what this DB holds is stale
			return envelope.ErrConflict
		}
		if _, err = tx.NewInsert().Model(hist).Exec(ctx); err != nil {
			return err
		}
		return s.db.changed(ctx, tx, envelopeKey)
	})
}

// History returns the records with a version above after in ascending
// version order, at most limit of them. It returns
// envelope.ErrInvalidArgument if limit is not positive.
func (s *EnvelopeStore) History(ctx context.Context, after int64, limit int) ([]envelope.Record, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("bunstore: envelope history: %w: limit %d is not positive", envelope.ErrInvalidArgument, limit)
	}
	var rows []envelopeRecordRow
	q := s.db.idb(ctx).NewSelect().Model(&rows).Where("version > ?", after).OrderExpr("version").Limit(int64(limit))
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("bunstore: envelope history: %w", markAborted(err, envelope.ErrAborted))
	}
	return mapRows(rows, (*envelopeRecordRow).record), nil
}
