package bunstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// LeaseStore is the lease.Store of a DB. Every method joins the
// transaction its context carries (see DB.InTx and WithTx).
//
// A transaction the database aborts (on PostgreSQL a serialization
// failure, 40001, or a deadlock, 40P01; on SQLite SQLITE_BUSY_SNAPSHOT)
// gives an error matching lease.ErrAborted. A method that runs in a
// transaction of its own runs again, up to abortTries times in all;
// inside the context's transaction it never does.
type LeaseStore struct {
	db *DB
}

// aborted returns err, marked as lease.ErrAborted if the database aborted
// the transaction.
func aborted(err error) error { return markAborted(err, lease.ErrAborted) }

// write runs fn as DB.write does, and inTx as DB.inTx does; when the
// context carries no transaction and the database aborts the one they
// ran fn in, they run fn again, up to abortTries times in all. fn must
// start from scratch each time.
func (s *LeaseStore) write(ctx context.Context, fn func(ctx context.Context, idb bun.IDB) error) error {
	return aborted(s.db.retryOwnTx(ctx, func() error { return s.db.write(ctx, fn) }))
}

func (s *LeaseStore) inTx(ctx context.Context, fn func(ctx context.Context, tx bun.IDB) error) error {
	return aborted(s.db.retryOwnTx(ctx, func() error { return s.db.inTx(ctx, fn) }))
}

// errLimit is the error for a limit below 1, which lease.Store forbids.
func errLimit(what string, limit int) error {
	return fmt.Errorf("bunstore: %s: limit %d, want at least 1: %w", what, limit, lease.ErrInvalidArgument)
}

var _ lease.Store = (*LeaseStore)(nil)

// LeaseStore returns the lease.Store kept in db.
func (db *DB) LeaseStore() *LeaseStore { return &LeaseStore{db: db} }

// liveStates lists the states of a job that holds a lease, for "IN (?)".
func liveStates() any { return bun.List([]lease.State{lease.StateLeased, lease.StateRunning}) }

// endedStates lists the terminal states, for "IN (?)", in the order of
// the predicate of nodelane_jobs_ended_idx, which a query must repeat for
// SQLite's planner to use the index.
func endedStates() any {
	return bun.List([]lease.State{lease.StateSucceeded, lease.StateFailed, lease.StateCanceled})
}

// jobRow is a lease.Job as stored. The optional structs are flattened into
// column groups, each absent when its first column is NULL.
type jobRow struct {
	bun.BaseModel `bun:"table:nodelane_jobs"`

	ID              string  `bun:"id,pk"`
	Type            string  `bun:"type"`
	Payload         *string `bun:"payload"`
	GPUSKU          string  `bun:"gpu_sku"`
	GPUCount        int     `bun:"gpu_count"`
	MinVRAMMB       int     `bun:"min_vram_mb"`
	MaxRuntime      int     `bun:"max_runtime_seconds"`
	Tags            string  `bun:"tags"` // tagsText
	Priority        int     `bun:"priority"`
	MaxAttempts     int     `bun:"max_attempts"`
	State           string  `bun:"state"`
	Attempt         int     `bun:"attempt"`
	CreatedAt       int64   `bun:"created_at"`
	ScheduledAt     int64   `bun:"scheduled_at"`
	LeasedAt        *int64  `bun:"leased_at"`
	AcceptedAt      *int64  `bun:"accepted_at"`
	FinishedAt      *int64  `bun:"finished_at"`
	ReceiptID       string  `bun:"receipt_id"`
	CancelRequested bool    `bun:"cancel_requested"`

	LastErrorCode    *string `bun:"last_error_code"`
	LastErrorMessage *string `bun:"last_error_message"`
	LastErrorPayload *string `bun:"last_error_payload"`
	LastErrorAttempt *int    `bun:"last_error_attempt"`
	LastErrorAt      *int64  `bun:"last_error_at"`

	ResultOutputURI    *string `bun:"result_output_uri"`
	ResultMetrics      *string `bun:"result_metrics"`
	ResultFinalMessage *string `bun:"result_final_message"`

	LeaseID            *string `bun:"lease_id"`
	LeaseJobID         *string `bun:"lease_job_id"`
	LeaseWorkerID      *string `bun:"lease_worker_id"`
	LeaseEpoch         *int64  `bun:"lease_epoch"`
	LeaseTokenHash     []byte  `bun:"lease_token_hash"`
	LeaseExpiresAt     *int64  `bun:"lease_expires_at"`
	LeaseAcceptBy      *int64  `bun:"lease_accept_by"`
	LeaseSKU           *string `bun:"lease_sku"`
	LeasePriceMicroUSD *int64  `bun:"lease_price_micro_usd"`
	LeasePolicyVersion *int64  `bun:"lease_policy_version"`

	Rev int64 `bun:"rev"`
}

func newJobRow(j *lease.Job) *jobRow {
	r := &jobRow{
		ID:              j.ID,
		Type:            j.Type,
		Payload:         text(j.Payload),
		GPUSKU:          j.Requirements.GPUSKU,
		GPUCount:        j.Requirements.GPUCount,
		MinVRAMMB:       j.Requirements.MinVRAMMB,
		MaxRuntime:      j.Requirements.MaxRuntimeSeconds,
		Tags:            tagsText(j.Requirements.Tags),
		Priority:        j.Priority,
		MaxAttempts:     j.MaxAttempts,
		State:           string(j.State),
		Attempt:         j.Attempt,
		CreatedAt:       micros(j.CreatedAt),
		ScheduledAt:     micros(j.ScheduledAt),
		LeasedAt:        microsPtr(j.LeasedAt),
		AcceptedAt:      microsPtr(j.AcceptedAt),
		FinishedAt:      microsPtr(j.FinishedAt),
		ReceiptID:       j.ReceiptID,
		CancelRequested: j.CancelRequested,
		Rev:             j.Rev,
	}
	if e := j.LastError; e != nil {
		r.LastErrorCode = &e.Code
		r.LastErrorMessage = &e.Message
		r.LastErrorPayload = text(e.Payload)
		r.LastErrorAttempt = &e.Attempt
		r.LastErrorAt = microsPtr(&e.At)
	}
	if res := j.Result; res != nil {
		r.ResultOutputURI = &res.OutputURI
		r.ResultMetrics = text(res.Metrics)
		r.ResultFinalMessage = &res.FinalMessage
	}
	if l := j.Lease; l != nil {
		r.LeaseID = &l.ID
		r.LeaseJobID = &l.JobID
		r.LeaseWorkerID = &l.WorkerID
		r.LeaseEpoch = &l.Epoch
		r.LeaseTokenHash = l.TokenHash
		r.LeaseExpiresAt = microsPtr(&l.ExpiresAt)
		r.LeaseAcceptBy = microsPtr(&l.AcceptBy)
		r.LeaseSKU = &l.SKU
		r.LeasePriceMicroUSD = &l.PriceMicroUSD
		r.LeasePolicyVersion = &l.PolicyVersion
	}
	return r
}

func (r *jobRow) job() *lease.Job {
	j := &lease.Job{
		ID:      r.ID,
		Type:    r.Type,
		Payload: raw(r.Payload),
		Requirements: lease.Requirements{
			GPUSKU:            r.GPUSKU,
			GPUCount:          r.GPUCount,
			MinVRAMMB:         r.MinVRAMMB,
			MaxRuntimeSeconds: r.MaxRuntime,
			Tags:              tagsFrom(r.Tags),
		},
		Priority:        r.Priority,
		MaxAttempts:     r.MaxAttempts,
		State:           lease.State(r.State),
		Attempt:         r.Attempt,
		CreatedAt:       fromMicros(r.CreatedAt),
		ScheduledAt:     fromMicros(r.ScheduledAt),
		LeasedAt:        fromMicrosPtr(r.LeasedAt),
		AcceptedAt:      fromMicrosPtr(r.AcceptedAt),
		FinishedAt:      fromMicrosPtr(r.FinishedAt),
		ReceiptID:       r.ReceiptID,
		CancelRequested: r.CancelRequested,
		Rev:             r.Rev,
	}
	if r.LastErrorCode != nil {
		j.LastError = &lease.JobError{
			Code:    *r.LastErrorCode,
			Message: deref(r.LastErrorMessage),
			Payload: raw(r.LastErrorPayload),
			Attempt: deref(r.LastErrorAttempt),
			At:      fromMicros(deref(r.LastErrorAt)),
		}
	}
	if r.ResultOutputURI != nil {
		j.Result = &lease.Result{
			OutputURI:    *r.ResultOutputURI,
			Metrics:      raw(r.ResultMetrics),
			FinalMessage: deref(r.ResultFinalMessage),
		}
	}
	if r.LeaseID != nil {
		j.Lease = &lease.Lease{
			ID:            *r.LeaseID,
			JobID:         deref(r.LeaseJobID),
			WorkerID:      deref(r.LeaseWorkerID),
			Epoch:         deref(r.LeaseEpoch),
			TokenHash:     r.LeaseTokenHash,
			ExpiresAt:     fromMicros(deref(r.LeaseExpiresAt)),
			AcceptBy:      fromMicros(deref(r.LeaseAcceptBy)),
			SKU:           deref(r.LeaseSKU),
			PriceMicroUSD: deref(r.LeasePriceMicroUSD),
			PolicyVersion: deref(r.LeasePolicyVersion),
		}
	}
	return j
}

// listRows returns, in id order, up to limit of the rows of R that where
// selects, each made a T by conv; what names the listing in its errors.
// It returns lease.ErrInvalidArgument if limit < 1.
func listRows[R, T any](ctx context.Context, idb bun.IDB, what string, limit int,
	conv func(*R) T, where func(*bun.SelectQuery) *bun.SelectQuery) ([]T, error) {
	return listRowsOrder(ctx, idb, what, limit, false, conv, where)
}

// listRowsOrder is listRows in descending id order when desc.
func listRowsOrder[R, T any](ctx context.Context, idb bun.IDB, what string, limit int, desc bool,
	conv func(*R) T, where func(*bun.SelectQuery) *bun.SelectQuery) ([]T, error) {
	if limit <= 0 {
		return nil, errLimit(what, limit)
	}
	var rows []R
	if err := where(idb.NewSelect().Model(&rows)).OrderExpr(idOrder(desc)).Limit(int64(limit)).Scan(ctx); err != nil {
		return nil, fmt.Errorf("bunstore: %s: %w", what, aborted(err))
	}
	out := make([]T, len(rows))
	for i := range rows {
		out[i] = conv(&rows[i])
	}
	return out, nil
}

// idOrder is the ORDER BY of a list: ascending ids, or descending when
// desc. The id columns' binary collation makes either order the bytes'.
func idOrder(desc bool) string {
	if desc {
		return "id DESC"
	}
	return "id"
}

// whereCursor adds the paging cursor after to q: ids above it, or below
// it when desc; an empty cursor selects from the first id of the order.
func whereCursor(q *bun.SelectQuery, after string, desc bool) *bun.SelectQuery {
	if desc {
		return whereSet(q, "id < ?", after)
	}
	return whereSet(q, "id > ?", after)
}

// whereSet adds the condition cond on v to q, unless v is empty: a filter
// left unset.
func whereSet[V ~string](q *bun.SelectQuery, cond string, v V) *bun.SelectQuery {
	if v == "" {
		return q
	}
	return q.Where(cond, v)
}

// CreateJobs inserts new jobs in one statement, all or none. It returns
// lease.ErrConflict if an id is taken, and then, in the caller's
// transaction, the caller must not commit.
func (s *LeaseStore) CreateJobs(ctx context.Context, js []*lease.Job) error {
	if len(js) == 0 {
		return nil
	}
	rows := make([]*jobRow, len(js))
	for i, j := range js {
		rows[i] = newJobRow(j)
	}
	// ON CONFLICT DO NOTHING rather than a unique violation, which would
	// abort a PostgreSQL transaction the caller may want to go on with.
	// Several rows go in a transaction, which a conflict rolls back.
	run := s.write
	if len(rows) > 1 {
		run = s.inTx
	}
	err := run(ctx, func(ctx context.Context, idb bun.IDB) error {
		return insertNew(ctx, idb.NewInsert().Model(&rows), int64(len(rows)))
	})
	if err != nil {
		return fmt.Errorf("bunstore: create %d jobs, the first %s: %w", len(js), js[0].ID, err)
	}
	return nil
}

// insertNew runs q, which inserts n rows, with ON CONFLICT (id) DO
// NOTHING and returns lease.ErrConflict if an id was taken.
func insertNew(ctx context.Context, q *bun.InsertQuery, n int64) error {
	got, err := affected(q.On("CONFLICT (id) DO NOTHING").Exec(ctx))
	if err == nil && got != n {
		err = lease.ErrConflict
	}
	return err
}

// missed is the error of a conditional write that wrote nothing: q
// selects its target row, and lease.ErrConflict if it exists,
// lease.ErrNotFound if not.
func missed(ctx context.Context, q *bun.SelectQuery) error {
	exists, err := q.Exists(ctx)
	switch {
	case err != nil:
		return err
	case exists:
		return lease.ErrConflict
	}
	return lease.ErrNotFound
}

// GetJob returns a job. It returns lease.ErrNotFound if there is none.
func (s *LeaseStore) GetJob(ctx context.Context, id string) (*lease.Job, error) {
	var r jobRow
	err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", id).Scan(ctx)
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: job %s: %w", id, lease.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get job %s: %w", id, aborted(err))
	}
	return r.job(), nil
}

// ListJobs returns the jobs matching f in ascending id order (descending
// when f.Desc), at most f.Limit of them. It returns
// lease.ErrInvalidArgument if f.Limit < 1.
func (s *LeaseStore) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	return listRowsOrder(ctx, s.db.idb(ctx), "list jobs", f.Limit, f.Desc, (*jobRow).job, func(q *bun.SelectQuery) *bun.SelectQuery {
		q = whereSet(q, "state = ?", f.State)
		q = whereSet(q, "type = ?", f.Type)
		if f.WorkerID != "" {
			q = q.Where("lease_worker_id = ?", f.WorkerID).Where("state IN (?)", liveStates())
		}
		q = whereSet(q, "lease_worker_id = ?", f.LastWorkerID)
		if f.Tag != "" {
			q = q.Where(s.db.tagsContain(), tagsArg([]string{f.Tag}))
		}
		return whereCursor(q, f.After, f.Desc)
	})
}

// UpdateJob replaces job j.ID with j if its stored revision is rev. It
// returns lease.ErrConflict if the revision differs and lease.ErrNotFound
// if there is no such job.
func (s *LeaseStore) UpdateJob(ctx context.Context, j *lease.Job, rev int64) error {
	// No transaction of its own: the write is one conditional UPDATE, and
	// the existence check after a miss only chooses the error (a job is
	// deleted only once ended, by DeleteEnded: if it was deleted after
	// the UPDATE missed, lease.ErrNotFound is as true as ErrConflict).
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		n, err := affected(idb.NewUpdate().Model(newJobRow(j)).WherePK().Where("rev = ?", rev).Exec(ctx))
		if err != nil || n == 1 {
			return err
		}
		return missed(ctx, idb.NewSelect().Model((*jobRow)(nil)).Where("id = ?", j.ID))
	})
	switch {
	case errors.Is(err, lease.ErrConflict):
		return fmt.Errorf("bunstore: update job %s at revision %d: %w", j.ID, rev, err)
	case err != nil:
		return fmt.Errorf("bunstore: update job %s: %w", j.ID, err)
	}
	return nil
}

// ExpiredJobs returns up to limit live jobs whose lease expired at or
// before now, or that are still leased at or after their accept deadline,
// in id order. It returns lease.ErrInvalidArgument if limit < 1.
func (s *LeaseStore) ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*lease.Job, error) {
	t := micros(now)
	return listRows(ctx, s.db.idb(ctx), "expired jobs", limit, (*jobRow).job, func(q *bun.SelectQuery) *bun.SelectQuery {
		return q.Where("state IN (?)", liveStates()).WhereGroup(" AND ", func(q *bun.SelectQuery) *bun.SelectQuery {
			return q.Where("lease_expires_at <= ?", t).WhereOr("state = ? AND lease_accept_by <= ?", lease.StateLeased, t)
		})
	})
}

// DeleteEnded deletes up to limit ended jobs that finished before
// before, oldest first, with their events and artifacts, in one
// transaction (the context's, if it carries one). The candidates come from
// nodelane_jobs_ended_idx (migration 0015) in finished_at order, so that
// a call reads about limit rows however many jobs the table keeps. On
// PostgreSQL they are locked FOR UPDATE SKIP LOCKED: calls on several
// replicas delete disjoint jobs and never wait for each other, nor for a
// request that holds a job's row (the job is deleted by a later call);
// and a row locked after a concurrent write is checked against the
// predicate again, so a job that is not ended at the time of the delete
// is never deleted. The events and artifacts go first, by job id through
// their indexes, then the jobs. No other writer locks an ended job's
// events or artifacts, and no writer of a live job waits for an ended
// one, so a delete and the hot path cannot deadlock. On PostgreSQL it
// sets deleteEndedSettings for the rest of its transaction (the
// context's, when it joins one). It returns lease.ErrInvalidArgument if
// limit < 1.
func (s *LeaseStore) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errLimit("delete ended jobs", limit)
	}
	deleted := 0
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		deleted = 0
		if s.db.postgres() {
			if _, err := tx.ExecContext(ctx, deleteEndedSettings); err != nil {
				return err
			}
		}
		var ids []string
		if err := s.db.endedJobs(tx, before, limit).Scan(ctx, &ids); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		in := bun.List(ids)
		if _, err := tx.NewDelete().Model((*eventRow)(nil)).Where("job_id IN (?)", in).Exec(ctx); err != nil {
			return err
		}
		if _, err := tx.NewDelete().Model((*artifactRow)(nil)).Where("job_id IN (?)", in).Exec(ctx); err != nil {
			return err
		}
		n, err := affected(tx.NewDelete().Model((*jobRow)(nil)).Where("id IN (?)", in).Exec(ctx))
		if err != nil {
			return err
		}
		if n != int64(len(ids)) {
			// Impossible under the row locks (PostgreSQL) or the write
			// lock (SQLite); refuse rather than count wrong.
			return fmt.Errorf("deleted %d of the %d jobs selected", n, len(ids))
		}
		deleted = len(ids)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("bunstore: delete ended jobs: %w", err)
	}
	return deleted, nil
}

// deleteEndedSettings are the planner settings of DeleteEnded's
// transaction on PostgreSQL (SET LOCAL: they end with it). With a table
// never analyzed, or a burst of jobs ended since, the planner estimates a
// handful of ended jobs and would gather every one of them (a bitmap of
// the ended index) and sort them to keep the oldest few; without a sort
// or a bitmap, it walks nodelane_jobs_ended_idx in order and stops at the
// limit (TestDeleteEndedPlanWalksEndedIndex), as the claim's settings
// (claim.go) do for claims.
const deleteEndedSettings = "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)"

// endedJobs selects the ids of up to limit ended jobs that finished
// before before, oldest first, from nodelane_jobs_ended_idx: on
// PostgreSQL under deleteEndedSettings, locking them; on SQLite INDEXED BY
// it, since the planner, without statistics, would rather read every
// ended job through the index on state and sort them.
func (db *DB) endedJobs(idb bun.IDB, before time.Time, limit int) *bun.SelectQuery {
	q := idb.NewSelect().Model((*jobRow)(nil)).Column("id").
		Where("state IN (?)", endedStates()).
		Where("finished_at < ?", micros(before)).
		OrderExpr("finished_at").
		Limit(int64(limit))
	if db.postgres() {
		q = q.For("UPDATE SKIP LOCKED")
	} else {
		q = q.ModelTableExpr("nodelane_jobs AS job_row INDEXED BY nodelane_jobs_ended_idx")
	}
	return q
}

// OfflineJobs returns up to limit live jobs whose lease's worker was last
// seen at or before cutoff, leased (and accepted, if it was) then too,
// in id order: one statement, which reads the workers not seen after
// cutoff through nodelane_workers_last_seen_idx and their live jobs
// through nodelane_jobs_worker_live_idx. It returns
// lease.ErrInvalidArgument if limit < 1.
func (s *LeaseStore) OfflineJobs(ctx context.Context, cutoff time.Time, limit int) ([]*lease.Job, error) {
	t := micros(cutoff)
	return listRows(ctx, s.db.idb(ctx), "offline jobs", limit, (*jobRow).job, func(q *bun.SelectQuery) *bun.SelectQuery {
		return q.Where("state IN (?)", liveStates()).
			Where("lease_worker_id IN (SELECT id FROM nodelane_workers WHERE last_seen_at <= ?)", t).
			Where("COALESCE(accepted_at, leased_at) <= ?", t)
	})
}

type eventRow struct {
	bun.BaseModel `bun:"table:nodelane_job_events"`

	ID        int64   `bun:"id,pk,autoincrement"`
	JobID     string  `bun:"job_id"`
	Kind      string  `bun:"kind"`
	Epoch     int64   `bun:"epoch"`
	Type      string  `bun:"type"`
	Message   string  `bun:"message"`
	Payload   *string `bun:"payload"`
	Seq       int64   `bun:"seq"`
	CreatedAt int64   `bun:"created_at"`
}

func (r *eventRow) event() *lease.Event {
	return &lease.Event{
		ID:        r.ID,
		JobID:     r.JobID,
		Kind:      lease.EventKind(r.Kind),
		Epoch:     r.Epoch,
		Type:      r.Type,
		Message:   r.Message,
		Payload:   raw(r.Payload),
		Seq:       r.Seq,
		CreatedAt: fromMicros(r.CreatedAt),
	}
}

// AddEvents stores evs in order, in one transaction, and sets their IDs.
// A log event whose (JobID, Seq) is already stored, or repeats one earlier
// in evs, is skipped with its ID left zero. It returns how many it stored.
func (s *LeaseStore) AddEvents(ctx context.Context, evs []*lease.Event) (int, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	stored := 0
	ids := make([]int64, len(evs))
	err := s.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		stored = 0
		clear(ids)
		for i, e := range evs {
			r := &eventRow{
				JobID:     e.JobID,
				Kind:      string(e.Kind),
				Epoch:     e.Epoch,
				Type:      e.Type,
				Message:   e.Message,
				Payload:   text(e.Payload),
				Seq:       e.Seq,
				CreatedAt: micros(e.CreatedAt),
			}
			// The unique index on (job_id, seq) covers log events only,
			// so DO NOTHING skips exactly the duplicate log lines.
			err := tx.NewInsert().Model(r).ExcludeColumn("id").
				On("CONFLICT DO NOTHING").Returning("id").Scan(ctx, &ids[i])
			if isNoRows(err) {
				continue
			}
			if err != nil {
				return err
			}
			stored++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("bunstore: add events: %w", err)
	}
	// Set the IDs only once the events are committed (or joined the
	// caller's transaction), so a failed call leaves evs as they were.
	for i, e := range evs {
		e.ID = ids[i]
	}
	return stored, nil
}

// ListEvents returns a job's events with ID > after in ID order, at most
// limit of them. It returns lease.ErrInvalidArgument if limit < 1.
func (s *LeaseStore) ListEvents(ctx context.Context, jobID string, after int64, limit int) ([]*lease.Event, error) {
	return listRows(ctx, s.db.idb(ctx), "list events of "+jobID, limit, (*eventRow).event, func(q *bun.SelectQuery) *bun.SelectQuery {
		return q.Where("job_id = ?", jobID).Where("id > ?", after)
	})
}

type artifactRow struct {
	bun.BaseModel `bun:"table:nodelane_artifacts"`

	ID        string  `bun:"id,pk"`
	JobID     string  `bun:"job_id"`
	WorkerID  string  `bun:"worker_id"`
	Epoch     int64   `bun:"epoch"`
	Type      string  `bun:"type"`
	Name      string  `bun:"name"`
	URI       string  `bun:"uri"`
	SHA256    string  `bun:"sha256"`
	SizeBytes int64   `bun:"size_bytes"`
	Metadata  *string `bun:"metadata"`
	Object    string  `bun:"object"`
	PartSize  int64   `bun:"part_size"`
	ReceiptID string  `bun:"receipt_id"`
	CreatedAt int64   `bun:"created_at"`
}

func (r *artifactRow) artifact() *lease.Artifact {
	return &lease.Artifact{
		ID:        r.ID,
		JobID:     r.JobID,
		WorkerID:  r.WorkerID,
		Epoch:     r.Epoch,
		Type:      r.Type,
		Name:      r.Name,
		URI:       r.URI,
		SHA256:    r.SHA256,
		SizeBytes: r.SizeBytes,
		Metadata:  raw(r.Metadata),
		Object:    r.Object,
		PartSize:  r.PartSize,
		ReceiptID: r.ReceiptID,
		CreatedAt: fromMicros(r.CreatedAt),
	}
}

// AddArtifact stores an artifact. It returns lease.ErrConflict if the id
// is taken.
func (s *LeaseStore) AddArtifact(ctx context.Context, a *lease.Artifact) error {
	r := &artifactRow{
		ID:        a.ID,
		JobID:     a.JobID,
		WorkerID:  a.WorkerID,
		Epoch:     a.Epoch,
		Type:      a.Type,
		Name:      a.Name,
		URI:       a.URI,
		SHA256:    a.SHA256,
		SizeBytes: a.SizeBytes,
		Metadata:  text(a.Metadata),
		Object:    a.Object,
		PartSize:  a.PartSize,
		ReceiptID: a.ReceiptID,
		CreatedAt: micros(a.CreatedAt),
	}
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		return insertNew(ctx, idb.NewInsert().Model(r), 1)
	})
	if err != nil {
		return fmt.Errorf("bunstore: add artifact %s: %w", a.ID, err)
	}
	return nil
}

// GetArtifact returns the artifact with id id, or lease.ErrNotFound.
func (s *LeaseStore) GetArtifact(ctx context.Context, id string) (*lease.Artifact, error) {
	var r artifactRow
	err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", id).Scan(ctx)
	switch {
	case isNoRows(err):
		return nil, fmt.Errorf("bunstore: artifact %s: %w", id, lease.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("bunstore: artifact %s: %w", id, aborted(err))
	}
	return r.artifact(), nil
}

// ListArtifacts returns the artifacts matching f in ascending id order
// (descending when f.Desc), at most f.Limit of them. It returns
// lease.ErrInvalidArgument if f.Limit < 1.
func (s *LeaseStore) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) ([]*lease.Artifact, error) {
	return listRowsOrder(ctx, s.db.idb(ctx), "list artifacts", f.Limit, f.Desc, (*artifactRow).artifact, func(q *bun.SelectQuery) *bun.SelectQuery {
		q = whereSet(q, "job_id = ?", f.JobID)
		q = whereSet(q, "type = ?", f.Type)
		return whereCursor(q, f.After, f.Desc)
	})
}

// workerRow is a lease.Worker as stored; tags and capabilities are JSON.
type workerRow struct {
	bun.BaseModel `bun:"table:nodelane_workers"`

	ID                string  `bun:"id,pk"`
	NodeID            string  `bun:"node_id"`
	Name              string  `bun:"name"`
	Hostname          string  `bun:"hostname"`
	EndpointURL       string  `bun:"endpoint_url"`
	Role              string  `bun:"role"`
	Tags              string  `bun:"tags"`
	Version           string  `bun:"version"`
	HeartbeatInterval int     `bun:"heartbeat_interval"`
	Capabilities      string  `bun:"capabilities"`
	MaxJobs           int     `bun:"max_jobs"`
	MaxVRAMMB         int     `bun:"max_vram_mb"`
	PolicyVersion     int64   `bun:"policy_version"`
	Status            string  `bun:"status"`
	Metrics           *string `bun:"metrics"`
	RegisteredAt      int64   `bun:"registered_at"`
	LastSeenAt        int64   `bun:"last_seen_at"`
	// The approval (migration 0008); the pinned lists are JSON arrays,
	// NULL when nothing is pinned.
	ApprovalPending  bool    `bun:"approval_pending"`
	ApprovedAt       *int64  `bun:"approved_at"`
	ApprovedBy       string  `bun:"approved_by"`
	ApprovalReason   string  `bun:"approval_reason"`
	ApprovedJobTypes *string `bun:"approved_job_types"`
	ApprovedTags     *string `bun:"approved_tags"`
	// ApprovalExact is lease.Approval.Exact (migration 0017).
	ApprovalExact bool `bun:"approval_exact"`
	// The operator's drain request (migration 0018): NULL when none.
	DrainRequestedAt *int64 `bun:"drain_requested_at"`
	DrainRequestedBy string `bun:"drain_requested_by"`
}

// workerColumns are the columns PutWorker replaces in a stored worker:
// all but id, the approval's, which only SetApproval writes, and the drain
// request's, which only SetDrain writes.
var workerColumns = []string{
	"node_id", "name", "hostname", "endpoint_url", "role", "tags", "version", "heartbeat_interval",
	"capabilities", "max_jobs", "max_vram_mb", "policy_version", "status", "metrics", "registered_at", "last_seen_at",
}

// setApproval writes a into the approval columns of r.
func (r *workerRow) setApproval(a lease.Approval) {
	r.ApprovalPending, r.ApprovedAt, r.ApprovedBy, r.ApprovalReason = a.Pending, microsPtr(a.At), a.By, a.Reason
	r.ApprovalExact, r.ApprovedJobTypes, r.ApprovedTags = a.Exact, jsonList(a.JobTypes), jsonList(a.Tags)
}

// setDrain writes d into the drain columns of r.
func (r *workerRow) setDrain(d *lease.DrainRequest) {
	r.DrainRequestedAt, r.DrainRequestedBy = nil, ""
	if d != nil {
		at := micros(d.At)
		r.DrainRequestedAt, r.DrainRequestedBy = &at, d.By
	}
}

// jsonList is vs as a JSON array, nil when vs is empty.
func jsonList(vs []string) *string {
	if len(vs) == 0 {
		return nil
	}
	s := jsonText(vs)
	return &s
}

func (r *workerRow) worker() (*lease.Worker, error) {
	w := &lease.Worker{
		ID:                r.ID,
		NodeID:            r.NodeID,
		Name:              r.Name,
		Hostname:          r.Hostname,
		EndpointURL:       r.EndpointURL,
		Role:              r.Role,
		Version:           r.Version,
		HeartbeatInterval: r.HeartbeatInterval,
		Governor:          lease.Governor{MaxJobs: r.MaxJobs, MaxVRAMMB: r.MaxVRAMMB},
		PolicyVersion:     r.PolicyVersion,
		Status:            r.Status,
		Metrics:           raw(r.Metrics),
		RegisteredAt:      fromMicros(r.RegisteredAt),
		LastSeenAt:        fromMicros(r.LastSeenAt),
		Approval: lease.Approval{Pending: r.ApprovalPending, At: fromMicrosPtr(r.ApprovedAt), By: r.ApprovedBy,
			Reason: r.ApprovalReason, Exact: r.ApprovalExact},
	}
	if r.DrainRequestedAt != nil {
		w.Drain = &lease.DrainRequest{At: fromMicros(*r.DrainRequestedAt), By: r.DrainRequestedBy}
	}
	for _, l := range []struct {
		col string
		src *string
		dst any
	}{
		{"tags", &r.Tags, &w.Tags}, {"capabilities", &r.Capabilities, &w.Capabilities},
		{"approved_job_types", r.ApprovedJobTypes, &w.Approval.JobTypes}, {"approved_tags", r.ApprovedTags, &w.Approval.Tags},
	} {
		if l.src == nil {
			continue
		}
		if err := json.Unmarshal([]byte(*l.src), l.dst); err != nil {
			return nil, fmt.Errorf("bunstore: worker %s: %s: %w", r.ID, l.col, err)
		}
	}
	return w, nil
}

// PutWorker inserts or replaces the worker w.ID, keeping the approval and
// the drain request of a stored one (only SetApproval and SetDrain write
// them). It returns lease.ErrConflict if another worker has w.NodeID.
func (s *LeaseStore) PutWorker(ctx context.Context, w *lease.Worker) error {
	r := &workerRow{
		ID:                w.ID,
		NodeID:            w.NodeID,
		Name:              w.Name,
		Hostname:          w.Hostname,
		EndpointURL:       w.EndpointURL,
		Role:              w.Role,
		Tags:              jsonText(w.Tags),
		Version:           w.Version,
		HeartbeatInterval: w.HeartbeatInterval,
		Capabilities:      jsonText(w.Capabilities),
		MaxJobs:           w.Governor.MaxJobs,
		MaxVRAMMB:         w.Governor.MaxVRAMMB,
		PolicyVersion:     w.PolicyVersion,
		Status:            w.Status,
		Metrics:           text(w.Metrics),
		RegisteredAt:      micros(w.RegisteredAt),
		LastSeenAt:        micros(w.LastSeenAt),
	}
	r.setApproval(w.Approval)
	r.setDrain(w.Drain)
	// A stored worker gets every column from EXCLUDED but its approval's,
	// in the one statement, so that a concurrent SetApproval is never
	// undone. A clash on node_id with another worker is a unique violation.
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		q := idb.NewInsert().Model(r).On("CONFLICT (id) DO UPDATE")
		for _, c := range workerColumns {
			q = q.Set("? = EXCLUDED.?", bun.Ident(c), bun.Ident(c))
		}
		_, err := q.Exec(ctx)
		return err
	})
	if isUniqueViolation(err) {
		return fmt.Errorf("bunstore: put worker %s: node %s is another worker's: %w", w.ID, w.NodeID, lease.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("bunstore: put worker %s: %w", w.ID, err)
	}
	return nil
}

// SetDrain implements lease.DrainStore: it replaces the drain request of
// the worker id (nil clears it). lease.ErrNotFound if there is no such
// worker.
func (s *LeaseStore) SetDrain(ctx context.Context, id string, d *lease.DrainRequest) error {
	r := &workerRow{ID: id}
	r.setDrain(d)
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		n, err := affected(idb.NewUpdate().Model(r).Column("drain_requested_at", "drain_requested_by").WherePK().Exec(ctx))
		if err != nil || n == 1 {
			return err
		}
		return lease.ErrNotFound
	})
	if err != nil {
		return fmt.Errorf("bunstore: set drain of worker %s: %w", id, markAborted(err, lease.ErrAborted))
	}
	return nil
}

// SetApproval replaces the approval of the worker id if its approved_at is
// still prevAt. It returns lease.ErrConflict if it is not, and
// lease.ErrNotFound if there is no such worker.
func (s *LeaseStore) SetApproval(ctx context.Context, id string, prevAt *time.Time, a lease.Approval) error {
	r := &workerRow{ID: id}
	r.setApproval(a)
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		q := idb.NewUpdate().Model(r).
			Column("approval_pending", "approved_at", "approved_by", "approval_reason", "approved_job_types", "approved_tags", "approval_exact").
			WherePK()
		if prevAt == nil {
			q = q.Where("approved_at IS NULL")
		} else {
			q = q.Where("approved_at = ?", micros(*prevAt))
		}
		if n, err := affected(q.Exec(ctx)); err != nil || n == 1 {
			return err
		}
		// Nothing written: no such worker, or another approval first.
		return missed(ctx, idb.NewSelect().Table("nodelane_workers").Where("id = ?", id))
	})
	if err != nil {
		return fmt.Errorf("bunstore: set approval of worker %s: %w", id, err)
	}
	return nil
}

// GetWorker returns a worker. It returns lease.ErrNotFound if there is none.
func (s *LeaseStore) GetWorker(ctx context.Context, id string) (*lease.Worker, error) {
	return s.worker(ctx, "id", id)
}

// WorkerByNode returns the worker registered under nodeID. It returns
// lease.ErrNotFound if there is none.
func (s *LeaseStore) WorkerByNode(ctx context.Context, nodeID string) (*lease.Worker, error) {
	return s.worker(ctx, "node_id", nodeID)
}

func (s *LeaseStore) worker(ctx context.Context, col, val string) (*lease.Worker, error) {
	var r workerRow
	err := s.db.idb(ctx).NewSelect().Model(&r).Where("? = ?", bun.Ident(col), val).Scan(ctx)
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: worker with %s %s: %w", col, val, lease.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get worker with %s %s: %w", col, val, aborted(err))
	}
	return r.worker()
}

// ListWorkers returns workers past the cursor f.After in ascending id
// order (descending when f.Desc), at most f.Limit of them. It returns
// lease.ErrInvalidArgument if f.Limit < 1.
func (s *LeaseStore) ListWorkers(ctx context.Context, f lease.WorkerFilter) ([]*lease.Worker, error) {
	if f.Limit <= 0 {
		return nil, errLimit("list workers", f.Limit)
	}
	var rows []workerRow
	q := whereCursor(s.db.idb(ctx).NewSelect().Model(&rows), f.After, f.Desc).OrderExpr(idOrder(f.Desc)).Limit(int64(f.Limit))
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("bunstore: list workers: %w", aborted(err))
	}
	out := make([]*lease.Worker, len(rows))
	for i := range rows {
		w, err := rows[i].worker()
		if err != nil {
			return nil, err
		}
		out[i] = w
	}
	return out, nil
}

var _ lease.LeaseCounter = (*LeaseStore)(nil)

// CountLeases implements lease.LeaseCounter in one statement, on the
// index of live jobs by lease_worker_id.
func (s *LeaseStore) CountLeases(ctx context.Context, workerIDs []string, now time.Time) (map[string]lease.LeaseCount, error) {
	out := make(map[string]lease.LeaseCount, len(workerIDs))
	if len(workerIDs) == 0 {
		return out, nil
	}
	var rows []struct {
		W    string `bun:"w"`
		Live int    `bun:"live"`
		N    int    `bun:"n"`
	}
	t := micros(now)
	err := s.db.idb(ctx).NewSelect().TableExpr("nodelane_jobs").
		ColumnExpr("lease_worker_id AS w").
		ColumnExpr("SUM(CASE WHEN lease_expires_at > ? AND (state <> ? OR lease_accept_by > ?) THEN 1 ELSE 0 END) AS live", t, lease.StateLeased, t).
		ColumnExpr("COUNT(*) AS n").
		Where("lease_worker_id IN (?)", bun.List(workerIDs)).
		Where("state IN (?)", liveStates()).
		GroupExpr("lease_worker_id").
		Scan(ctx, &rows)
	if err != nil {
		return nil, fmt.Errorf("bunstore: count leases: %w", markAborted(err, lease.ErrAborted))
	}
	for _, r := range rows {
		out[r.W] = lease.LeaseCount{Live: r.Live, Expired: r.N - r.Live}
	}
	return out, nil
}
