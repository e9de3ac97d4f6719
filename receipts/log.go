package receipts

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// DefaultOrigin is the checkpoint origin when Config.Origin is empty.
const DefaultOrigin = "nodelane.local/receipts"

// Config holds the optional settings of a Log and a Sequencer. A nil
// *Config means all defaults.
type Config struct {
	// Origin is the first line of every checkpoint, naming the log; a
	// verifier must expect it. Defaults to DefaultOrigin.
	Origin string
	// BatchSize caps how many receipts one Sequencer transaction
	// integrates. Defaults to 512.
	BatchSize int
	// Interval is how long Sequencer.Run waits after a batch that left
	// nothing pending, and how often Log.Await looks again. Defaults to
	// 100 ms for Run and 20 ms for Await.
	Interval time.Duration
	// AwaitPoll is how often Sequencer.Await looks in the store when
	// nothing told it to: a safety net, since the Sequencer delivers the
	// proofs of the receipts it sequences, and tells the callers of Await
	// when to look for those it cannot deliver. Defaults to 1 s.
	AwaitPoll time.Duration
	// ListLimit is the page size of Log.List when none is given, and the
	// largest it returns. Defaults to 100 and 1000.
	ListLimit int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of receipt ids. Defaults to crypto/rand.Reader.
	Rand io.Reader
	// OnError is called with the error of each batch of Sequencer.Run
	// that fails (Run retries it). Defaults to nil: errors are not
	// reported.
	OnError func(error)
	// OnRecover is called when a batch of Sequencer.Run succeeds after
	// one or more failed (each reported to OnError), so that a host can
	// log an outage once when it begins and once when it ends. Defaults
	// to nil.
	OnRecover func()
	// OnSequenced, when set, is called after each batch of
	// Sequencer.Sequence that integrated receipts and was published, with
	// how many it integrated and when the oldest of them was minted (its
	// ServerTime): a host measures the sequencer's lag with it. Defaults
	// to nil.
	OnSequenced func(n int, oldest time.Time)
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Origin == "" {
		out.Origin = DefaultOrigin
	}
	if out.BatchSize <= 0 {
		out.BatchSize = 512
	}
	if out.ListLimit <= 0 {
		out.ListLimit = 100
	}
	if out.AwaitPoll <= 0 {
		out.AwaitPoll = time.Second
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Rand == nil {
		out.Rand = rand.Reader
	}
	return out
}

const maxListPage = 1000

// Log mints receipts and serves them with proofs and checkpoints. Minting
// only writes the receipt, in the caller's transaction if its context
// carries one; a Sequencer gives it its index later. It is safe for
// concurrent use, and several Logs (on several replicas) may share one
// Store.
type Log struct {
	store Store
	cfg   Config
}

// NewLog returns a Log over s. cfg may be nil.
func NewLog(s Store, cfg *Config) *Log {
	return &Log{store: s, cfg: cfg.withDefaults()}
}

// Origin returns the checkpoint origin the Log expects.
func (l *Log) Origin() string { return l.cfg.Origin }

// Mint stores r, not yet sequenced, and returns it. It assigns r an id
// (rcp_ + 32 hex digits, time-ordered) if it has none and sets its server
// time to now if it is zero. The store call joins the transaction ctx
// carries, so the receipt commits or rolls back with the change it
// records. A caller's id may be any UTF-8 without NUL, and is kept byte
// for byte: ids that differ only in case are two receipts. Errors: those
// of Receipt.Encode, ErrInvalidArgument for an id holding NUL,
// ErrConflict if the id is taken.
func (l *Log) Mint(ctx context.Context, r Receipt) (*Stored, error) {
	s, err := l.prepare(r)
	if err != nil {
		return nil, err
	}
	if err := l.store.AddReceipt(ctx, s); err != nil {
		return nil, err
	}
	return s, nil
}

// MintAll is Mint for several receipts, minted in the order given: in one
// store call when the Store is a BatchAdder, else one AddReceipt each (in
// the context's transaction, if any, so that all or none are kept when it
// commits). On any error it returns no receipt, and a BatchAdder keeps
// none.
func (l *Log) MintAll(ctx context.Context, rs ...Receipt) ([]*Stored, error) {
	ss := make([]*Stored, len(rs))
	for i, r := range rs {
		var err error
		if ss[i], err = l.prepare(r); err != nil {
			return nil, err
		}
	}
	if b, ok := l.store.(BatchAdder); ok && len(ss) > 1 {
		if err := b.AddReceipts(ctx, ss); err != nil {
			return nil, err
		}
		return ss, nil
	}
	for _, s := range ss {
		if err := l.store.AddReceipt(ctx, s); err != nil {
			return nil, err
		}
	}
	return ss, nil
}

// prepare gives r its id and server time, as Mint documents, and encodes
// it.
func (l *Log) prepare(r Receipt) (*Stored, error) {
	now := l.cfg.Now().UTC().Truncate(time.Microsecond)
	if r.ServerTime.IsZero() {
		r.ServerTime = now
	}
	if r.ID == "" {
		id, err := newID(now, l.cfg.Rand)
		if err != nil {
			return nil, err
		}
		r.ID = id
	}
	if strings.ContainsRune(r.ID, 0) {
		// Valid UTF-8, which Encode checks, but no Store need hold it.
		return nil, fmt.Errorf("%w: receipt id %q holds NUL", ErrInvalidArgument, r.ID)
	}
	body, err := r.Encode()
	if err != nil {
		return nil, err
	}
	return &Stored{ID: r.ID, Kind: r.Kind, Body: body}, nil
}

func newID(now time.Time, rand io.Reader) (string, error) {
	var b [16]byte
	ms := uint64(now.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	if _, err := io.ReadFull(rand, b[6:]); err != nil {
		return "", fmt.Errorf("receipts: reading randomness: %w", err)
	}
	return "rcp_" + hex.EncodeToString(b[:]), nil
}

// Get returns a receipt by id. ErrNotFound.
func (l *Log) Get(ctx context.Context, id string) (*Stored, error) {
	return l.get(ctx, id)
}

// get reads a receipt from the store. An id no Store can hold (not UTF-8,
// or holding NUL) is no receipt's, so it answers ErrNotFound without
// asking.
func (l *Log) get(ctx context.Context, id string) (*Stored, error) {
	if !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return nil, fmt.Errorf("receipt %q: %w", id, ErrNotFound)
	}
	return l.store.GetReceipt(ctx, id)
}

// List returns sequenced receipts from index from on, in index order, at
// most limit (Config.ListLimit when limit is not positive, and never
// more than 1000).
func (l *Log) List(ctx context.Context, from int64, limit int) ([]*Stored, error) {
	if from < 0 {
		return nil, fmt.Errorf("%w: from %d is negative", ErrInvalidArgument, from)
	}
	if limit <= 0 {
		limit = l.cfg.ListLimit
	}
	limit = min(limit, maxListPage)
	return l.store.ListReceipts(ctx, from, limit)
}

// ListDesc returns sequenced receipts with an index below before (every
// one when before is negative), newest first: in descending index order,
// at most limit (as List reads it). Indices are dense, so it reads the
// page with one ListReceipts call below the tree's size.
func (l *Log) ListDesc(ctx context.Context, before int64, limit int) ([]*Stored, error) {
	if limit <= 0 {
		limit = l.cfg.ListLimit
	}
	limit = min(limit, maxListPage)
	tree, err := l.store.Tree(ctx)
	if err != nil {
		return nil, err
	}
	upper := tree.Size
	if before >= 0 {
		upper = min(upper, before)
	}
	from := max(0, upper-int64(limit))
	if upper <= from {
		return nil, nil
	}
	rs, err := l.store.ListReceipts(ctx, from, int(upper-from))
	if err != nil {
		return nil, err
	}
	slices.Reverse(rs)
	return rs, nil
}

// Checkpoint returns the latest signed checkpoint. ErrNotFound before a
// Sequencer published the first one.
func (l *Log) Checkpoint(ctx context.Context) (*Checkpoint, error) {
	return l.store.LatestCheckpoint(ctx)
}

func (l *Log) hashReader(ctx context.Context) tlog.HashReader {
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		return l.store.ReadHashes(ctx, indexes)
	})
}

// InclusionProof proves that the receipt at index is in the tree of size
// receipts. ErrInvalidArgument unless 0 <= index < size <= the committed
// tree's size.
func (l *Log) InclusionProof(ctx context.Context, index, size int64) (Proof, error) {
	t, err := l.store.Tree(ctx)
	if err != nil {
		return Proof{}, err
	}
	if index < 0 || index >= size || size > t.Size {
		return Proof{}, fmt.Errorf("%w: no receipt %d in a tree of %d (the log has %d)", ErrInvalidArgument, index, size, t.Size)
	}
	p, err := tlog.ProveRecord(size, index, l.hashReader(ctx))
	if err != nil {
		return Proof{}, fmt.Errorf("receipts: prove receipt %d in tree %d: %w", index, size, err)
	}
	return Proof{Index: index, TreeSize: size, Hashes: nonNil(p)}, nil
}

// ConsistencyProof proves that the tree of newSize receipts extends the
// tree of oldSize (see CheckConsistency); it is empty when oldSize is 0
// or equals newSize. ErrInvalidArgument unless 0 <= oldSize <= newSize
// <= the committed tree's size.
func (l *Log) ConsistencyProof(ctx context.Context, oldSize, newSize int64) ([]tlog.Hash, error) {
	t, err := l.store.Tree(ctx)
	if err != nil {
		return nil, err
	}
	if oldSize < 0 || oldSize > newSize || newSize > t.Size {
		return nil, fmt.Errorf("%w: no consistency from %d to %d (the log has %d)", ErrInvalidArgument, oldSize, newSize, t.Size)
	}
	if oldSize == 0 || oldSize == newSize {
		return []tlog.Hash{}, nil
	}
	p, err := tlog.ProveTree(newSize, oldSize, l.hashReader(ctx))
	if err != nil {
		return nil, fmt.Errorf("receipts: prove tree %d extends %d: %w", newSize, oldSize, err)
	}
	return nonNil(p), nil
}

func nonNil(hs []tlog.Hash) []tlog.Hash {
	if hs == nil {
		return []tlog.Hash{}
	}
	return hs
}

// Prove returns the receipt id with its inclusion proof against the
// latest signed checkpoint, and that checkpoint. ErrNotFound for an
// unknown id, ErrNotSequenced while the receipt has no index or no
// signed checkpoint covers it yet.
func (l *Log) Prove(ctx context.Context, id string) (*Stored, Proof, *Checkpoint, error) {
	ss, ps, cp, err := l.proveAll(ctx, []string{id})
	if err != nil {
		return nil, Proof{}, nil, err
	}
	return ss[0], ps[0], cp, nil
}

// Await is Prove that waits, as long as ctx allows, for a Sequencer to
// sequence the receipts and publish a checkpoint that covers them. All
// proofs are against one checkpoint.
func (l *Log) Await(ctx context.Context, ids ...string) ([]*Stored, []Proof, *Checkpoint, error) {
	every := l.cfg.Interval
	if every <= 0 {
		every = 20 * time.Millisecond
	}
	for {
		ss, ps, cp, err := l.proveAll(ctx, ids)
		if err != nil && ctx.Err() != nil {
			// The deadline, not the store, ended the wait.
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrNotSequenced, context.Cause(ctx))
		}
		if !errors.Is(err, ErrNotSequenced) {
			return ss, ps, cp, err
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, nil, fmt.Errorf("%w: %w", err, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// ProveAll is Prove for several receipts, all against one checkpoint, the
// latest: ErrNotSequenced if any of them is not yet covered by it.
func (l *Log) ProveAll(ctx context.Context, ids ...string) ([]*Stored, []Proof, *Checkpoint, error) {
	return l.proveAll(ctx, ids)
}

// proveAll reads each receipt, then, once all of them have an index, the
// latest checkpoint, and then every stored hash of their proofs in one
// ReadHashes call. It does not read the tree: a checkpoint is stored only
// after its tree committed (Sequencer.Publish) and the tree never
// shrinks, so every hash of a proof in cp's tree is stored, and a store
// that broke this would answer ErrNotFound rather than a wrong proof.
func (l *Log) proveAll(ctx context.Context, ids []string) ([]*Stored, []Proof, *Checkpoint, error) {
	ss := make([]*Stored, len(ids))
	for i, id := range ids {
		s, err := l.get(ctx, id)
		if err != nil {
			return nil, nil, nil, err
		}
		ss[i] = s
	}
	for _, s := range ss {
		if !s.Sequenced {
			return nil, nil, nil, fmt.Errorf("%w: receipt %s has no index", ErrNotSequenced, s.ID)
		}
	}
	cp, err := l.store.LatestCheckpoint(ctx)
	if errors.Is(err, ErrNotFound) {
		return nil, nil, nil, fmt.Errorf("%w: no checkpoint yet", ErrNotSequenced)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	indexes := make([]int64, len(ss))
	for i, s := range ss {
		if s.Index >= cp.Size {
			return nil, nil, nil, fmt.Errorf("%w: no checkpoint covers receipt %s at %d yet", ErrNotSequenced, s.ID, s.Index)
		}
		indexes[i] = s.Index
	}
	ps, err := proveRecords(cp.Size, indexes, l.hashReader(ctx))
	if err != nil {
		return nil, nil, nil, err
	}
	return ss, ps, cp, nil
}

// proveRecords returns the inclusion proofs of the records at indexes in
// the tree of size records, reading every stored hash they need in one
// call of r. tlog.ProveRecord reads one set of stored hashes per proof,
// which depends on the index and the size alone, so a first pass with
// placeholder hashes learns the sets, and a second proves with the
// hashes read. Indexes must be in [0, size).
func proveRecords(size int64, indexes []int64, r tlog.HashReader) ([]Proof, error) {
	var need []int64
	needed := make(map[int64]int)
	learn := tlog.HashReaderFunc(func(xs []int64) ([]tlog.Hash, error) {
		for _, x := range xs {
			if _, ok := needed[x]; !ok {
				needed[x] = len(need)
				need = append(need, x)
			}
		}
		return make([]tlog.Hash, len(xs)), nil
	})
	for _, i := range indexes {
		if _, err := tlog.ProveRecord(size, i, learn); err != nil {
			return nil, fmt.Errorf("receipts: prove receipt %d in tree %d: %w", i, size, err)
		}
	}
	var hs []tlog.Hash
	if len(need) > 0 {
		var err error
		if hs, err = r.ReadHashes(need); err != nil {
			return nil, fmt.Errorf("receipts: prove %d receipts in tree %d: %w", len(indexes), size, err)
		}
		if len(hs) != len(need) {
			return nil, fmt.Errorf("receipts: %d stored hashes read for %d asked", len(hs), len(need))
		}
	}
	read := tlog.HashReaderFunc(func(xs []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(xs))
		for k, x := range xs {
			j, ok := needed[x]
			if !ok {
				return nil, fmt.Errorf("stored hash %d was not read", x)
			}
			out[k] = hs[j]
		}
		return out, nil
	})
	ps := make([]Proof, len(indexes))
	for k, i := range indexes {
		p, err := tlog.ProveRecord(size, i, read)
		if err != nil {
			return nil, fmt.Errorf("receipts: prove receipt %d in tree %d: %w", i, size, err)
		}
		ps[k] = Proof{Index: i, TreeSize: size, Hashes: nonNil(p)}
	}
	return ps, nil
}

// ExportLine is one line of an export: a receipt in its wire shape, and
// its inclusion proof against the export's checkpoint, so that a verifier
// can name the first receipt that does not belong to the log.
type ExportLine struct {
	WireReceipt
	Proof *Proof `json:"proof,omitempty"`
}

// Export writes the log as of its latest signed checkpoint to w, one JSON
// ExportLine per receipt in index order, and returns the checkpoint,
// whose Note is the other half of the export. ErrNotFound if no
// checkpoint is signed yet. cmd/verify-receipts checks an export
// offline.
func (l *Log) Export(ctx context.Context, w io.Writer) (*Checkpoint, error) {
	cp, err := l.store.LatestCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	// The tree's stored hashes, read once in pages, serve every proof.
	count := tlog.StoredHashCount(cp.Size)
	hashes := make([]tlog.Hash, 0, count)
	const page = 1000
	for start := int64(0); start < count; start += page {
		idx := make([]int64, 0, page)
		for i := start; i < min(start+page, count); i++ {
			idx = append(idx, i)
		}
		hs, err := l.store.ReadHashes(ctx, idx)
		if err != nil {
			return nil, err
		}
		hashes = append(hashes, hs...)
	}
	mem := memHashes(hashes)
	if root, err := tlog.TreeHash(cp.Size, mem); err != nil || root != cp.Root {
		return nil, fmt.Errorf("receipts: export: the stored hashes do not give the checkpoint's root (%v)", err)
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	next := int64(0)
	for next < cp.Size {
		ss, err := l.store.ListReceipts(ctx, next, int(min(page, cp.Size-next)))
		if err != nil {
			return nil, err
		}
		if len(ss) == 0 {
			return nil, fmt.Errorf("receipts: export: receipt %d is missing", next)
		}
		for _, s := range ss {
			if s.Index != next {
				return nil, fmt.Errorf("receipts: export: receipt %d is missing", next)
			}
			p, err := tlog.ProveRecord(cp.Size, s.Index, mem)
			if err != nil {
				return nil, err
			}
			if err := enc.Encode(ExportLine{WireReceipt: s.Wire(), Proof: &Proof{Index: s.Index, TreeSize: cp.Size, Hashes: nonNil(p)}}); err != nil {
				return nil, err
			}
			next++
		}
	}
	return cp, bw.Flush()
}

// memHashes reads stored hashes from a slice indexed by stored-hash index.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("%w: stored hash %d", ErrNotFound, x)
		}
		out[i] = m[x]
	}
	return out, nil
}

// Sequencer gives minted receipts their log indices and publishes signed
// checkpoints, integrate-then-publish: each batch is integrated in one
// store transaction under the store's sequencing lock (so one sequencer
// at a time across replicas), and only after that transaction committed
// is a checkpoint for the new tree signed. A checkpoint is therefore
// never signed for a tree that could still roll back, and a tree that
// committed without its checkpoint (a crash between the two) is signed
// by the next Sequence or Publish, on any replica.
//
// A caller that waits for the proofs of receipts it minted calls Await:
// the Sequencer hands it, in memory, the proofs of those its own batches
// integrate, and tells it to read the others from the store.
//
// Call it with a context that carries no transaction: the commit must be
// its own. It is safe for concurrent use; several Sequencers may run on
// one Store.
type Sequencer struct {
	store  Store
	signer note.Signer
	cfg    Config
	// log proves, for Await, what the Sequencer cannot prove in memory.
	log *Log
	// wake holds a pending Wake for Run.
	wake chan struct{}
	// mu guards published, which is closed, and replaced, each time
	// this Sequencer publishes a checkpoint; waiters, the callers of
	// Await; begun, how many Sequence calls have begun; and last, the
	// latest batch published under the checkpoint of its tree.
	mu        sync.Mutex
	published chan struct{}
	waiters   map[*waiter]struct{}
	begun     uint64
	last      *sealed
	// prev, guarded by mu, is the last batch this Sequencer committed:
	// the next batch, if it finds the tree prev made, reads the hashes it
	// verifies that tree with from prev rather than from the store.
	prev *integrated
}

// NewSequencer returns a Sequencer that signs checkpoints with signer
// (note.NewSigner of the log's signer key). cfg may be nil.
// ErrInvalidArgument if signer is nil or the origin is malformed.
func NewSequencer(s Store, signer note.Signer, cfg *Config) (*Sequencer, error) {
	c := cfg.withDefaults()
	if signer == nil {
		return nil, fmt.Errorf("%w: no signer", ErrInvalidArgument)
	}
	if err := checkOrigin(c.Origin); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	return &Sequencer{
		store: s, signer: signer, cfg: c, log: &Log{store: s, cfg: c},
		wake: make(chan struct{}, 1), published: make(chan struct{}), waiters: make(map[*waiter]struct{}),
	}, nil
}

// Wake makes Run sequence now rather than at its next interval: call it
// after minting receipts whose proofs someone waits for. Wakes that come
// while a batch runs make Run run one more batch after it, so receipts
// minted meanwhile are not left for the interval. It never blocks.
func (q *Sequencer) Wake() {
	select {
	case q.wake <- struct{}{}:
	default: // a wake is pending already
	}
}

// Published returns a channel that is closed the next time this
// Sequencer publishes a checkpoint (in Sequence, Run or Publish): a
// caller waiting for its receipts to be sequenced takes the channel,
// checks, and waits on it before checking again. Sequencers of other
// processes publish without closing it.
func (q *Sequencer) Published() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.published
}

// announce closes the channel of Published and replaces it.
func (q *Sequencer) announce() {
	q.mu.Lock()
	defer q.mu.Unlock()
	close(q.published)
	q.published = make(chan struct{})
}

// Sequence integrates one batch of up to Config.BatchSize pending
// receipts, in mint order, and then publishes a checkpoint for the
// committed tree. It returns how many receipts it sequenced. If the
// batch fails nothing is signed; if the publication fails the batch
// stays committed and the next call signs it. Once published, it gives
// the callers of Await the proofs of the batch's receipts they wait for,
// or tells them to look in the store (see Await).
func (q *Sequencer) Sequence(ctx context.Context) (int, error) {
	begun := q.begin()
	q.mu.Lock()
	prev := q.prev
	q.mu.Unlock()
	var in *integrated
	err := q.store.Sequence(ctx, q.cfg.BatchSize, func(t Tree, pending []*Stored, r tlog.HashReader) (*Batch, error) {
		in = nil // a Store that retries calls integrate again
		b, err := integrate(t, pending, prev.reader(t, r))
		if err != nil {
			return nil, err
		}
		in = b
		return b.batch, nil
	})
	if err != nil {
		return 0, fmt.Errorf("receipts: sequence: %w", err)
	}
	if in != nil {
		q.mu.Lock()
		q.prev = in
		q.mu.Unlock()
	}
	n := 0
	if in != nil {
		n = len(in.pending)
	}
	cp, err := q.Publish(ctx)
	if err != nil {
		return n, err
	}
	q.settle(ctx, begun, in, cp, n == q.cfg.BatchSize)
	if n > 0 && q.cfg.OnSequenced != nil {
		// The batch is in mint order: its first receipt waited longest.
		if r, err := in.pending[0].Receipt(); err == nil {
			q.cfg.OnSequenced(n, r.ServerTime)
		}
	}
	return n, nil
}

// integrated is a batch as integrate computed it, with what a Sequencer
// needs to prove its receipts in memory once it is published.
type integrated struct {
	batch *Batch
	// old is the tree size before the batch.
	old int64
	// pending are the receipts integrated, at indexes old, old+1, ...
	pending []*Stored
	// below are the stored hashes below the batch that integrate read:
	// those of the complete subtrees of the old tree, which are all that
	// the proofs of the batch's receipts need from before it.
	below map[int64]tlog.Hash
}

// reader returns the hashes of tree t, which integrate reads to verify
// it: from p, the batch that made t (the hashes it wrote and those of the
// older tree it read hold every complete subtree of t), and from r only
// what p lacks; all from r when p is nil or made another tree. The store
// holds those very hashes: the tree p committed is the tree the store
// reports, of the same size and root, and stored hashes are never
// rewritten.
func (p *integrated) reader(t Tree, r tlog.HashReader) tlog.HashReader {
	if p == nil || p.batch.Tree != t {
		return r
	}
	base := tlog.StoredHashIndex(0, p.old)
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		var miss []int
		for i, x := range indexes {
			if h, ok := p.below[x]; ok {
				out[i] = h
			} else if x >= base && x-base < int64(len(p.batch.Hashes)) {
				out[i] = p.batch.Hashes[x-base]
			} else {
				miss = append(miss, i)
			}
		}
		if len(miss) == 0 {
			return out, nil
		}
		idx := make([]int64, len(miss))
		for k, i := range miss {
			idx[k] = indexes[i]
		}
		hs, err := r.ReadHashes(idx)
		if err != nil {
			return nil, err
		}
		if len(hs) != len(idx) {
			return nil, fmt.Errorf("%d stored hashes read for %d asked", len(hs), len(idx))
		}
		for k, i := range miss {
			out[i] = hs[k]
		}
		return out, nil
	})
}

// integrate appends pending to tree t: the leaf hash of each body, the
// interior hashes each leaf completes, and the new root. Before it trusts
// the stored hashes it checks that they give t's root.
func integrate(t Tree, pending []*Stored, r tlog.HashReader) (*integrated, error) {
	below := make(map[int64]tlog.Hash)
	stored := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		hs, err := r.ReadHashes(indexes)
		if err != nil {
			return nil, err
		}
		if len(hs) != len(indexes) {
			return nil, fmt.Errorf("%d stored hashes read for %d asked", len(hs), len(indexes))
		}
		for i, x := range indexes {
			below[x] = hs[i]
		}
		return hs, nil
	})
	root, err := tlog.TreeHash(t.Size, stored)
	if err != nil {
		return nil, err
	}
	if root != t.Root {
		return nil, fmt.Errorf("the stored hashes do not give the root of the tree of %d", t.Size)
	}
	base := tlog.StoredHashIndex(0, t.Size)
	var added []tlog.Hash
	// Reads below base come from the store, the rest from this batch.
	read := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		var old []int64
		for _, x := range indexes {
			if x < base {
				old = append(old, x)
			}
		}
		var got []tlog.Hash
		if len(old) > 0 {
			var err error
			if got, err = stored.ReadHashes(old); err != nil {
				return nil, err
			}
		}
		for i, x := range indexes {
			if x < base {
				out[i], got = got[0], got[1:]
				continue
			}
			if x-base >= int64(len(added)) {
				return nil, fmt.Errorf("stored hash %d is not written yet", x)
			}
			out[i] = added[x-base]
		}
		return out, nil
	})
	for i, s := range pending {
		n := t.Size + int64(i)
		hs, err := tlog.StoredHashesForRecordHash(n, tlog.RecordHash(s.Body), read)
		if err != nil {
			return nil, err
		}
		added = append(added, hs...)
	}
	size := t.Size + int64(len(pending))
	if root, err = tlog.TreeHash(size, read); err != nil {
		return nil, err
	}
	return &integrated{
		batch:   &Batch{Tree: Tree{Size: size, Root: root}, Hashes: added},
		old:     t.Size,
		pending: pending,
		below:   below,
	}, nil
}

// Publish signs and stores a checkpoint for the committed tree unless
// one is stored already, and returns the latest checkpoint. Sequence
// calls it; call it alone to sign a tree that a crash left unsigned, or
// the empty tree of a new log.
func (q *Sequencer) Publish(ctx context.Context) (*Checkpoint, error) {
	// The checkpoint first: a checkpoint is stored only after its tree
	// committed and the tree never shrinks, so the tree read next is at
	// least as large, whatever other Sequencers do in between.
	latest, err := q.store.LatestCheckpoint(ctx)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("receipts: publish: %w", err)
	}
	t, err := q.store.Tree(ctx)
	if err != nil {
		return nil, fmt.Errorf("receipts: publish: %w", err)
	}
	if latest != nil {
		switch {
		case latest.Size > t.Size:
			return nil, fmt.Errorf("receipts: publish: a checkpoint of %d is ahead of the tree of %d", latest.Size, t.Size)
		case latest.Size == t.Size && latest.Root != t.Root:
			return nil, fmt.Errorf("receipts: publish: the checkpoint of %d has another root than the tree", t.Size)
		case latest.Size == t.Size:
			return latest, nil
		}
	}
	cp, err := SignCheckpoint(q.signer, q.cfg.Origin, t)
	if err != nil {
		return nil, err
	}
	if err := q.store.AddCheckpoint(ctx, cp); err != nil && !errors.Is(err, ErrConflict) {
		return nil, fmt.Errorf("receipts: publish: %w", err)
	}
	q.announce()
	// Another Sequencer may have published this tree, or a larger one.
	return q.store.LatestCheckpoint(ctx)
}

// Run sequences until ctx is done: batch after batch while receipts are
// pending, then every Config.Interval, or at once when woken (Wake). A
// failed batch is reported to
// Config.OnError and retried at the next interval, and the first batch
// that succeeds after failures to Config.OnRecover; Run returns only
// ctx's cause.
func (q *Sequencer) Run(ctx context.Context) error {
	failing := false
	for {
		n, err := q.Sequence(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			failing = true
			if q.cfg.OnError != nil {
				q.cfg.OnError(err)
			}
		case err == nil && failing:
			failing = false
			if q.cfg.OnRecover != nil {
				q.cfg.OnRecover()
			}
		}
		if err == nil && n == q.cfg.BatchSize {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			continue
		}
		t := time.NewTimer(q.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-q.wake:
			t.Stop()
		case <-t.C:
		}
	}
}
