package receipts

import (
	"context"
	"errors"

	"golang.org/x/mod/sumdb/tlog"
)

// Errors returned by this package and by stores. Callers test them with
// errors.Is.
var (
	// ErrNotFound means there is no receipt, stored hash or checkpoint with that key.
	ErrNotFound = errors.New("receipts: not found")
	// ErrConflict means a receipt id, or a checkpoint's tree size, is taken, or
	// the tree moved while a batch was being written.
	ErrConflict = errors.New("receipts: conflict")
	// ErrInvalidArgument means an argument is out of range, missing, or does not
	// belong to the receipt's kind.
	ErrInvalidArgument = errors.New("receipts: invalid argument")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure), or kept aborting the
	// store's own; nothing of it is kept, and the whole transaction must
	// be run again, from its beginning. Stores return it; the Log and the
	// Sequencer never retry it (Sequencer.Run, as after any failed batch,
	// tries the next batch at its next interval).
	ErrAborted = errors.New("receipts: transaction aborted")
	// ErrOverflow means an amount of money does not fit in an int64 of micro-USD.
	ErrOverflow = errors.New("receipts: overflow")
	// ErrNotCanonical means receipt bytes are not the canonical bytes of a
	// receipt (see the package documentation): malformed, reordered,
	// unknown kind or field, missing field, or a value of the wrong form.
	ErrNotCanonical = errors.New("receipts: not canonical")
	// ErrInconsistent means a receipt's fields disagree with each other, such
	// as a cost that is not Cost of the duration, GPUs and rate it states.
	ErrInconsistent = errors.New("receipts: inconsistent fields")
	// ErrNotSequenced means the receipt has no log index yet, or no signed
	// checkpoint covers it yet.
	ErrNotSequenced = errors.New("receipts: not sequenced yet")
	// ErrBadCheckpoint means a checkpoint body is malformed, has lines other
	// than origin, size and root, or names another origin.
	ErrBadCheckpoint = errors.New("receipts: bad checkpoint")
	// ErrUnknownKey means no signature on the checkpoint is by the verifier key.
	ErrUnknownKey = errors.New("receipts: checkpoint not signed by the known key")
	// ErrBadSignature means the verifier key's signature on the checkpoint does
	// not verify.
	ErrBadSignature = errors.New("receipts: bad checkpoint signature")
	// ErrBadProof means an inclusion or consistency proof does not hold, or
	// names another tree size or an index outside the tree.
	ErrBadProof = errors.New("receipts: bad proof")
	// ErrRollback means a checkpoint is smaller than one already verified.
	ErrRollback = errors.New("receipts: checkpoint rollback")
	// ErrFork means a checkpoint has the size of one already verified but
	// another root: the log showed two different histories.
	ErrFork = errors.New("receipts: checkpoint fork")
)

// BatchAdder is a Store that adds several minted receipts in one call
// (Log.MintAll uses it).
type BatchAdder interface {
	// AddReceipts stores ss as AddReceipt would one after the other, in
	// that mint order, but all or none: ErrConflict, and none stored, if
	// any id is taken or given twice; ErrInvalidArgument, and none
	// stored, if any has an index.
	AddReceipts(ctx context.Context, ss []*Stored) error
}

// Stored is a minted receipt as the log keeps it.
type Stored struct {
	ID   string
	Kind Kind
	// Index is the receipt's position in the log, valid once Sequenced.
	Index     int64
	Sequenced bool
	// Body is the receipt's canonical bytes, the leaf the log hashes.
	Body []byte
}

// Wire returns the receipt in its wire shape.
func (s *Stored) Wire() WireReceipt {
	w := WireReceipt{ID: s.ID, Kind: s.Kind, Body: s.Body}
	if s.Sequenced {
		i := s.Index
		w.Index = &i
	}
	return w
}

// Receipt decodes the body. It fails only if the stored bytes are not
// canonical, which a store that keeps them intact never causes.
func (s *Stored) Receipt() (*Receipt, error) { return Decode(s.Body) }

// Tree is a state of the log: its size and its RFC 6962 root hash.
type Tree struct {
	Size int64
	Root tlog.Hash
}

// EmptyTree is the log before its first receipt: size 0, and the root of
// the empty tree, SHA-256 of nothing.
func EmptyTree() Tree {
	root, _ := tlog.TreeHash(0, nil)
	return Tree{Root: root}
}

// Batch is what a sequencer integrates into the log in one transaction.
type Batch struct {
	// Tree is the log after the batch: the receipts handed to the
	// IntegrateFunc take indices old size, old size+1, ..., Tree.Size-1,
	// in the order they were handed.
	Tree Tree
	// Hashes are the stored hashes the batch adds, at stored-hash indexes
	// tlog.StoredHashIndex(0, old size) onwards, consecutively.
	Hashes []tlog.Hash
}

// IntegrateFunc computes the batch that appends pending to the log in
// state tree. hashes reads the log's stored hashes inside the store's
// transaction. It must not call the Store, and it may be called again
// for the same batch when a Store retries its transaction.
type IntegrateFunc func(tree Tree, pending []*Stored, hashes tlog.HashReader) (*Batch, error)

// Store keeps receipts, the log's stored hashes, its tree state and its
// signed checkpoints. It makes no decisions: the Log and the Sequencer
// compute every hash and signature, and the Store keeps them.
//
// The contract below holds for every Store; the conformance suite
// receiptstest checks it.
//
// Isolation and transactions. Each method is atomic: it applies all of its
// writes or none (Sequence its whole batch), and it decides (a taken id or
// tree size, the tree a batch must fit) on committed data, READ COMMITTED
// or stronger, together with the writes of its own transaction, never on
// a read that another writer can invalidate before the write that follows
// it. Every method takes the context first and, when the store supports
// transactions, joins the one the context carries (how a context carries
// one is the adapter's business, such as bunstore.WithTx), so that a
// receipt commits with the state change it records: it sees that
// transaction's own earlier writes, and its writes commit or roll back
// with it. Without one, a method commits before it returns.
//
// Ids. Receipt ids are compared as bytes: case-sensitive, no Unicode
// normalisation, no trimming, so "rcp_A" and "rcp_a" are two receipts. A
// SQL store declares the id column with a binary collation that does not
// pad: COLLATE "C" on PostgreSQL; VARBINARY, or utf8mb4_0900_bin on MySQL
// 8 and utf8mb4_nopad_bin on MariaDB, on MySQL and MariaDB (never
// utf8mb4_bin, which ignores trailing spaces); SQLite's default, BINARY,
// already is one. Ids are chosen by the Log or by its caller and may be
// any valid UTF-8 without NUL (U+0000), which PostgreSQL text cannot hold;
// the Log hands a Store no other.
//
// Values. Receipt bodies and checkpoint notes come back byte for byte,
// as do hashes. A Store returns copies: changing a returned value does not
// change the stored one.
//
// Limits. Callers always pass ListReceipts and Sequence a limit of at
// least 1 (the Log pages by Config.ListLimit, at most 1000; the Sequencer
// by Config.BatchSize); a Store returns ErrInvalidArgument for a limit of 0
// or less rather than guess what it would mean.
//
// Errors. Each method returns the sentinels its documentation names, or
// ErrAborted when the database aborted the transaction the context
// carries; any other error means the store could not answer. A store may
// retry internally, a bounded number of times, only when the context
// carries no transaction: a transaction the context carries is the
// caller's to run again, and neither the Log nor the Sequencer does. Once
// a call has returned ErrAborted, nothing more of that transaction
// commits: every later call with its context fails (workerapi.Transactor
// says why this takes care on MySQL and MariaDB).
type Store interface {
	// AddReceipt stores a minted receipt, not sequenced (s.Sequenced is
	// false), after every receipt added before it in mint order: the
	// order of a key the store increases with each receipt (an
	// auto-increment column) is enough, and receipts that concurrent
	// transactions add may take either order among themselves.
	// ErrConflict if its id is taken; ErrInvalidArgument, storing
	// nothing, if s.Sequenced is set.
	AddReceipt(ctx context.Context, s *Stored) error
	// GetReceipt returns the receipt with that id. ErrNotFound.
	GetReceipt(ctx context.Context, id string) (*Stored, error)
	// ListReceipts returns sequenced receipts with index >= from, in index
	// order, at most limit of them. ErrInvalidArgument if limit is not
	// positive.
	ListReceipts(ctx context.Context, from int64, limit int) ([]*Stored, error)

	// Sequence runs one batch in one transaction that holds the sequencing
	// lock, so that one batch at a time is sequenced across every process
	// sharing the store. It reads the tree and up to limit receipts that are
	// not sequenced, in mint order; if there are none it returns nil without
	// calling integrate. Otherwise it calls integrate and stores its hashes,
	// gives the pending receipts their indices, sets the tree, and commits.
	// If integrate or any write fails, nothing is stored. ErrConflict, and
	// nothing stored, if the batch does not fit the tree (wrong size or
	// number of hashes, as Batch.Validate checks) or integrate returns a nil
	// batch with a nil error (a batch of no receipts does not fit a call
	// that had some); ErrInvalidArgument, without calling integrate, if
	// limit is not positive. A store that retries internally may call
	// integrate again.
	Sequence(ctx context.Context, limit int, integrate IntegrateFunc) error
	// Tree returns the last committed tree: EmptyTree on a new store.
	Tree(ctx context.Context) (Tree, error)
	// ReadHashes returns the stored hashes at the given stored-hash
	// indexes (tlog.StoredHashIndex), in the order asked. ErrNotFound if
	// any is not stored.
	ReadHashes(ctx context.Context, indexes []int64) ([]tlog.Hash, error)

	// AddCheckpoint stores a signed checkpoint. ErrConflict if one for
	// c.Size is stored already.
	AddCheckpoint(ctx context.Context, c *Checkpoint) error
	// LatestCheckpoint returns the checkpoint of the largest tree.
	// ErrNotFound if none is stored.
	LatestCheckpoint(ctx context.Context) (*Checkpoint, error)
}
