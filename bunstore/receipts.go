package bunstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/uptrace/bun"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

// ReceiptStore is the receipts.Store of a DB. Every method joins the
// transaction its context carries (see DB.InTx and WithTx), so a receipt
// minted in a request's transaction commits or rolls back with it.
//
// Sequence takes the sequencing lock inside its transaction: on
// PostgreSQL a transaction-scoped advisory lock, scoped to the current
// schema, so that one batch at a time is sequenced across replicas; on
// SQLite the write transaction (BEGIN IMMEDIATE), which admits one writer
// at a time anyway. Call it, through receipts.Sequencer, with a context
// that carries no transaction, so that its commit is its own.
//
// When PostgreSQL aborts a transaction (a serialization failure or a
// deadlock), a method returns an error that matches receipts.ErrAborted; a
// write whose context carries no transaction (Sequence included, which
// then calls integrate again) first runs again, up to three times in all.
type ReceiptStore struct {
	db *DB
}

var _ receipts.Store = (*ReceiptStore)(nil)

// ReceiptStore returns the receipts.Store kept in db.
func (db *DB) ReceiptStore() *ReceiptStore { return &ReceiptStore{db: db} }

// ReceiptsStore is the former name of [ReceiptStore].
//
// Deprecated: use ReceiptStore.
type ReceiptsStore = ReceiptStore

// ReceiptsStore is the former name of [DB.ReceiptStore].
//
// Deprecated: use DB.ReceiptStore.
func (db *DB) ReceiptsStore() *ReceiptStore { return db.ReceiptStore() }

// receiptRow is a receipt as stored; Idx is NULL until it is sequenced.
// Seq, assigned by the database, is the mint order.
type receiptRow struct {
	bun.BaseModel `bun:"table:nodelane_receipts"`

	Seq  int64  `bun:"seq,pk,autoincrement"`
	ID   string `bun:"id"`
	Kind string `bun:"kind"`
	Idx  *int64 `bun:"idx"`
	Body []byte `bun:"body"`
}

func (r *receiptRow) stored() *receipts.Stored {
	s := &receipts.Stored{ID: r.ID, Kind: receipts.Kind(r.Kind), Body: r.Body}
	if r.Idx != nil {
		s.Index, s.Sequenced = *r.Idx, true
	}
	return s
}

type receiptHashRow struct {
	bun.BaseModel `bun:"table:nodelane_receipt_hashes"`

	Idx  int64  `bun:"idx,pk"`
	Hash []byte `bun:"hash"`
}

type receiptTreeRow struct {
	bun.BaseModel `bun:"table:nodelane_receipt_tree"`

	ID       int64  `bun:"id,pk"`
	TreeSize int64  `bun:"tree_size"`
	RootHash []byte `bun:"root_hash"`
}

type receiptCheckpointRow struct {
	bun.BaseModel `bun:"table:nodelane_receipt_checkpoints"`

	TreeSize int64  `bun:"tree_size,pk"`
	RootHash []byte `bun:"root_hash"`
	Origin   string `bun:"origin"`
	Note     string `bun:"note"`
}

// treeRowID is the id of the one row of nodelane_receipt_tree.
const treeRowID = 1

func toHash(b []byte) (tlog.Hash, error) {
	var h tlog.Hash
	if len(b) != tlog.HashSize {
		return h, fmt.Errorf("a stored hash has %d bytes", len(b))
	}
	copy(h[:], b)
	return h, nil
}

// AddReceipt stores a minted receipt, not yet sequenced. It returns
// receipts.ErrConflict if the id is taken.
func (s *ReceiptStore) AddReceipt(ctx context.Context, st *receipts.Stored) error {
	if st.Sequenced {
		return fmt.Errorf("bunstore: add receipt %s: %w: it has an index already", st.ID, receipts.ErrInvalidArgument)
	}
	r := &receiptRow{ID: st.ID, Kind: string(st.Kind), Body: st.Body}
	err := s.db.retryOwnTx(ctx, func() error {
		return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
			// ON CONFLICT DO NOTHING rather than a unique violation, which
			// would abort a PostgreSQL transaction the caller may go on with.
			n, err := affected(idb.NewInsert().Model(r).ExcludeColumn("seq").On("CONFLICT (id) DO NOTHING").Exec(ctx))
			if err == nil && n == 0 {
				err = receipts.ErrConflict
			}
			return err
		})
	})
	return failed(err, receipts.ErrAborted, "add receipt %s", st.ID)
}

var _ receipts.BatchAdder = (*ReceiptStore)(nil)

// AddReceipts implements receipts.BatchAdder in one multi-row INSERT,
// whose rows take their seq in the order given. If any id is taken it
// deletes the rows it inserted, in the same transaction, and returns
// receipts.ErrConflict.
func (s *ReceiptStore) AddReceipts(ctx context.Context, ss []*receipts.Stored) error {
	rows := make([]receiptRow, len(ss))
	seen := make(map[string]bool, len(ss))
	for i, st := range ss {
		if st.Sequenced {
			return fmt.Errorf("bunstore: add receipt %s: %w: it has an index already", st.ID, receipts.ErrInvalidArgument)
		}
		if seen[st.ID] {
			return fmt.Errorf("bunstore: add receipt %s: %w: given twice", st.ID, receipts.ErrConflict)
		}
		seen[st.ID] = true
		rows[i] = receiptRow{ID: st.ID, Kind: string(st.Kind), Body: st.Body}
	}
	if len(rows) == 0 {
		return nil
	}
	err := s.db.retryOwnTx(ctx, func() error {
		return s.db.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			ids, err := s.insert(ctx, tx, rows)
			if err != nil {
				return err
			}
			if len(ids) == len(rows) {
				return nil
			}
			if len(ids) > 0 {
				// Nothing of the batch may stay, also in the caller's
				// transaction, which may go on after the conflict.
				if _, err := tx.NewDelete().TableExpr("nodelane_receipts").Where("id IN (?)", bun.List(ids)).Exec(ctx); err != nil {
					return err
				}
			}
			return receipts.ErrConflict
		})
	})
	return failed(err, receipts.ErrAborted, "add %d receipts from %s", len(ss), ss[0].ID)
}

// insert adds rows in tx, skipping the ids already taken, and returns
// the ids it added: on SQLite one bound statement a row (prepared once,
// not parsed again for every request), on PostgreSQL one INSERT.
func (s *ReceiptStore) insert(ctx context.Context, tx bun.IDB, rows []receiptRow) ([]string, error) {
	var ids []string
	if q := s.db.sql.receipt; q != "" {
		for _, r := range rows {
			n, err := affected(s.db.execBound(ctx, tx, q, r.ID, r.Kind, r.Body))
			if err != nil {
				return nil, err
			}
			if n == 1 {
				ids = append(ids, r.ID)
			}
		}
		return ids, nil
	}
	err := tx.NewInsert().Model(&rows).ExcludeColumn("seq").On("CONFLICT (id) DO NOTHING").Returning("id").Scan(ctx, &ids)
	if isNoRows(err) {
		err = nil
	}
	return ids, err
}

// GetReceipt returns a receipt by id. It returns receipts.ErrNotFound if
// there is none.
func (s *ReceiptStore) GetReceipt(ctx context.Context, id string) (*receipts.Stored, error) {
	var r receiptRow
	err := s.db.idb(ctx).NewSelect().Model(&r).Where("id = ?", id).Scan(ctx)
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: receipt %s: %w", id, receipts.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: get receipt %s: %w", id, markAborted(err, receipts.ErrAborted))
	}
	return r.stored(), nil
}

// ListReceipts returns sequenced receipts with index >= from in index
// order, at most limit. It returns receipts.ErrInvalidArgument if limit is
// not positive.
func (s *ReceiptStore) ListReceipts(ctx context.Context, from int64, limit int) ([]*receipts.Stored, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("bunstore: list receipts: %w: limit %d is not positive", receipts.ErrInvalidArgument, limit)
	}
	var rows []receiptRow
	q := s.db.idb(ctx).NewSelect().Model(&rows).Where("idx >= ?", from).OrderExpr("idx").Limit(int64(limit))
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("bunstore: list receipts: %w", markAborted(err, receipts.ErrAborted))
	}
	return mapRows(rows, (*receiptRow).stored), nil
}

// Sequence integrates one batch as receipts.Store documents, in one
// transaction that holds the sequencing lock (see ReceiptStore). It
// returns receipts.ErrInvalidArgument if limit is not positive.
func (s *ReceiptStore) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	if limit <= 0 {
		return fmt.Errorf("bunstore: sequence receipts: %w: limit %d is not positive", receipts.ErrInvalidArgument, limit)
	}
	err := s.db.retryOwnTx(ctx, func() error { return s.sequence(ctx, limit, integrate) })
	return failed(err, receipts.ErrAborted, "sequence receipts")
}

func (s *ReceiptStore) sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	// Durable: the Sequencer signs a checkpoint of this tree once it
	// committed.
	return s.db.durableTx(ctx, func(ctx context.Context, tx bun.IDB) error {
		if s.db.postgres() {
			if _, err := tx.NewRaw("SELECT pg_advisory_xact_lock(hashtextextended('nodelane_receipts_sequencer:' || current_schema(), 0))").Exec(ctx); err != nil {
				return fmt.Errorf("sequencing lock: %w", err)
			}
		}
		var rows []receiptRow
		q := tx.NewSelect().Model(&rows).Where("idx IS NULL").OrderExpr("seq").Limit(int64(limit))
		if err := q.Scan(ctx); err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		tree, err := s.tree(ctx, tx)
		if err != nil {
			return err
		}
		b, err := integrate(tree, mapRows(rows, (*receiptRow).stored), tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
			return readHashes(ctx, tx, indexes)
		}))
		if err != nil {
			return err
		}
		if err := b.Validate(tree, len(rows)); err != nil {
			return err
		}

		base := tlog.StoredHashCount(tree.Size)
		hashes := make([]receiptHashRow, len(b.Hashes))
		for i, h := range b.Hashes {
			hashes[i] = receiptHashRow{Idx: base + int64(i), Hash: h[:]}
		}
		for part := range slices.Chunk(hashes, 1000) {
			if _, err := tx.NewInsert().Model(&part).Exec(ctx); err != nil {
				return fmt.Errorf("store hashes: %w", err)
			}
		}

		// One UPDATE gives every receipt of the batch its index, each row
		// found by its seq. The unary + keeps SQLite (3.54) from reading
		// "idx IS NULL" as a lookup of the unique index on idx, which
		// joined every pending receipt with every row of v (measured: 10 %
		// of a SQLite server's CPU at 2,000 jobs/s); PostgreSQL then uses
		// the primary key too.
		values := make([]string, len(rows))
		args := make([]any, 0, 2*len(rows))
		for i := range rows {
			values[i] = "(?, ?)"
			args = append(args, rows[i].Seq, tree.Size+int64(i))
		}
		n, err := affected(tx.NewRaw("WITH v (seq, idx) AS (VALUES "+strings.Join(values, ", ")+") "+
			"UPDATE nodelane_receipts SET idx = v.idx FROM v WHERE nodelane_receipts.seq = v.seq AND +nodelane_receipts.idx IS NULL",
			args...).Exec(ctx))
		if err != nil {
			return fmt.Errorf("index receipts: %w", err)
		}
		if n != int64(len(rows)) {
			return fmt.Errorf("%w: indexed %d receipts of %d", receipts.ErrConflict, n, len(rows))
		}

		n, err = affected(tx.NewUpdate().Model(&receiptTreeRow{ID: treeRowID, TreeSize: b.Tree.Size, RootHash: b.Tree.Root[:]}).
			WherePK().Where("tree_size = ?", tree.Size).Exec(ctx))
		if err != nil {
			return fmt.Errorf("set tree: %w", err)
		}
		if n != 1 {
			return fmt.Errorf("%w: the tree moved under the sequencing lock", receipts.ErrConflict)
		}
		return nil
	})
}

// Tree returns the last committed tree.
func (s *ReceiptStore) Tree(ctx context.Context) (receipts.Tree, error) {
	t, err := s.tree(ctx, s.db.idb(ctx)) // the zero Tree on error
	return t, failed(err, receipts.ErrAborted, "receipt tree")
}

func (s *ReceiptStore) tree(ctx context.Context, idb bun.IDB) (receipts.Tree, error) {
	r := receiptTreeRow{ID: treeRowID}
	if err := idb.NewSelect().Model(&r).WherePK().Scan(ctx); err != nil {
		return receipts.Tree{}, err
	}
	root, err := toHash(r.RootHash)
	if err != nil {
		return receipts.Tree{}, err
	}
	return receipts.Tree{Size: r.TreeSize, Root: root}, nil
}

// ReadHashes returns the stored hashes at the given stored-hash indexes,
// in the order asked. It returns receipts.ErrNotFound if one is missing.
func (s *ReceiptStore) ReadHashes(ctx context.Context, indexes []int64) ([]tlog.Hash, error) {
	hs, err := readHashes(ctx, s.db.idb(ctx), indexes) // nil on error
	return hs, failed(err, receipts.ErrAborted, "read receipt hashes")
}

func readHashes(ctx context.Context, idb bun.IDB, indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	if len(indexes) == 0 {
		return out, nil
	}
	found := make(map[int64]tlog.Hash, len(indexes))
	for part := range slices.Chunk(indexes, 1000) {
		var rows []receiptHashRow
		if err := idb.NewSelect().Model(&rows).Where("idx IN (?)", bun.List(part)).Scan(ctx); err != nil {
			return nil, err
		}
		for _, r := range rows {
			h, err := toHash(r.Hash)
			if err != nil {
				return nil, err
			}
			found[r.Idx] = h
		}
	}
	for i, x := range indexes {
		h, ok := found[x]
		if !ok {
			return nil, fmt.Errorf("stored hash %d: %w", x, receipts.ErrNotFound)
		}
		out[i] = h
	}
	return out, nil
}

// AddCheckpoint stores a signed checkpoint. It returns
// receipts.ErrConflict if one of that size is stored already.
func (s *ReceiptStore) AddCheckpoint(ctx context.Context, c *receipts.Checkpoint) error {
	r := &receiptCheckpointRow{TreeSize: c.Size, RootHash: c.Root[:], Origin: c.Origin, Note: string(c.Note)}
	err := s.db.retryOwnTx(ctx, func() error {
		return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
			n, err := affected(idb.NewInsert().Model(r).On("CONFLICT (tree_size) DO NOTHING").Exec(ctx))
			if err == nil && n == 0 {
				err = receipts.ErrConflict
			}
			return err
		})
	})
	return failed(err, receipts.ErrAborted, "add checkpoint of %d", c.Size)
}

// LatestCheckpoint returns the checkpoint of the largest tree. It
// returns receipts.ErrNotFound if none is stored.
func (s *ReceiptStore) LatestCheckpoint(ctx context.Context) (*receipts.Checkpoint, error) {
	var r receiptCheckpointRow
	err := s.db.idb(ctx).NewSelect().Model(&r).OrderExpr("tree_size DESC").Limit(1).Scan(ctx)
	if isNoRows(err) {
		return nil, fmt.Errorf("bunstore: checkpoint: %w", receipts.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: latest checkpoint: %w", markAborted(err, receipts.ErrAborted))
	}
	root, err := toHash(r.RootHash)
	if err != nil {
		return nil, fmt.Errorf("bunstore: latest checkpoint: %w", err)
	}
	return &receipts.Checkpoint{Origin: r.Origin, Size: r.TreeSize, Root: root, Note: []byte(r.Note)}, nil
}
