package bunstore

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// answerRow is a lease.Answer as stored.
type answerRow struct {
	bun.BaseModel `bun:"table:nodelane_answers"`

	ID        []byte `bun:"id,pk"`
	WorkerID  string `bun:"worker_id"`
	Digest    []byte `bun:"digest"`
	Status    int    `bun:"status"`
	Body      []byte `bun:"body"`
	CreatedAt int64  `bun:"created_at"`
	ExpiresAt int64  `bun:"expires_at"`
}

// putAnswer inserts an answer, or replaces one under the same key that
// expired at or before the new one's created_at: the row count tells
// which, since the WHERE of DO UPDATE leaves a live row alone.
const putAnswer = `INSERT INTO nodelane_answers (id, worker_id, digest, status, body, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET worker_id = excluded.worker_id, digest = excluded.digest,
status = excluded.status, body = excluded.body, created_at = excluded.created_at, expires_at = excluded.expires_at
WHERE nodelane_answers.expires_at <= excluded.created_at`

// PutAnswer implements lease.Store: it returns lease.ErrConflict if a
// live answer is stored under a.Key.
func (s *LeaseStore) PutAnswer(ctx context.Context, a *lease.Answer) error {
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		n, err := affected(idb.NewRaw(putAnswer, a.Key, a.WorkerID, a.Digest, a.Status, a.Body,
			micros(a.CreatedAt), micros(a.ExpiresAt)).Exec(ctx))
		if err == nil && n == 0 {
			err = lease.ErrConflict
		}
		return err
	})
	// s.write marked err as lease.ErrAborted already.
	return failed(err, lease.ErrAborted, "put answer of worker %s", a.WorkerID)
}

// GetAnswer implements lease.Store.
func (s *LeaseStore) GetAnswer(ctx context.Context, key []byte, now time.Time) (*lease.Answer, error) {
	var r answerRow
	err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", key).Where("expires_at > ?", micros(now)).Scan(ctx)
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: answer: %w", lease.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get answer: %w", aborted(err))
	}
	return &lease.Answer{
		Key: r.ID, WorkerID: r.WorkerID, Digest: r.Digest, Status: r.Status, Body: r.Body,
		CreatedAt: fromMicros(r.CreatedAt), ExpiresAt: fromMicros(r.ExpiresAt),
	}, nil
}

// DeleteAnswers implements lease.Store: it deletes up to limit dead
// answers, found through the expiry index, each by its key.
func (s *LeaseStore) DeleteAnswers(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errLimit("delete answers", limit)
	}
	var n int64
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		var err error
		n, err = affected(idb.NewRaw(`DELETE FROM nodelane_answers WHERE id IN (
SELECT id FROM nodelane_answers WHERE expires_at <= ? LIMIT ?)`, micros(now), limit).Exec(ctx))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("bunstore: delete answers: %w", err)
	}
	return int(n), nil
}
