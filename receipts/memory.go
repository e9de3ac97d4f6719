package receipts

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/mod/sumdb/tlog"
)

// MemoryStore is a Store in memory, for tests and single-process use.
// Every method runs under one mutex, which is also the sequencing lock.
type MemoryStore struct {
	mu          sync.Mutex
	byID        map[string]*Stored
	pending     []*Stored // not sequenced, in mint order
	log         []*Stored // by index
	hashes      []tlog.Hash
	tree        Tree
	checkpoints map[int64]*Checkpoint
	latest      *Checkpoint
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		byID:        make(map[string]*Stored),
		tree:        EmptyTree(),
		checkpoints: make(map[int64]*Checkpoint),
	}
}

func cloneStored(s *Stored) *Stored {
	c := *s
	c.Body = bytes.Clone(s.Body)
	return &c
}

func cloneCheckpoint(c *Checkpoint) *Checkpoint {
	out := *c
	out.Note = bytes.Clone(c.Note)
	return &out
}

// AddReceipt implements Store.
func (m *MemoryStore) AddReceipt(_ context.Context, s *Stored) error {
	if s.Sequenced {
		return fmt.Errorf("%w: receipt %s is minted with an index", ErrInvalidArgument, s.ID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byID[s.ID]; ok {
		return fmt.Errorf("receipt %s: %w", s.ID, ErrConflict)
	}
	c := cloneStored(s)
	m.byID[s.ID] = c
	m.pending = append(m.pending, c)
	return nil
}

var _ BatchAdder = (*MemoryStore)(nil)

// AddReceipts implements BatchAdder.
func (m *MemoryStore) AddReceipts(_ context.Context, ss []*Stored) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := make(map[string]bool, len(ss))
	for _, s := range ss {
		if s.Sequenced {
			return fmt.Errorf("%w: receipt %s is minted with an index", ErrInvalidArgument, s.ID)
		}
		if _, ok := m.byID[s.ID]; ok || seen[s.ID] {
			return fmt.Errorf("receipt %s: %w", s.ID, ErrConflict)
		}
		seen[s.ID] = true
	}
	for _, s := range ss {
		c := cloneStored(s)
		m.byID[s.ID] = c
		m.pending = append(m.pending, c)
	}
	return nil
}

// GetReceipt implements Store.
func (m *MemoryStore) GetReceipt(_ context.Context, id string) (*Stored, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.byID[id]
	if !ok {
		return nil, fmt.Errorf("receipt %s: %w", id, ErrNotFound)
	}
	return cloneStored(s), nil
}

// ListReceipts implements Store.
func (m *MemoryStore) ListReceipts(_ context.Context, from int64, limit int) ([]*Stored, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", ErrInvalidArgument, limit)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Stored
	for i := max(from, 0); i < int64(len(m.log)); i++ {
		if len(out) == limit {
			break
		}
		out = append(out, cloneStored(m.log[i]))
	}
	return out, nil
}

// Sequence implements Store, under the store's mutex.
func (m *MemoryStore) Sequence(_ context.Context, limit int, integrate IntegrateFunc) error {
	if limit <= 0 {
		return fmt.Errorf("%w: batch limit %d is not positive", ErrInvalidArgument, limit)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := min(len(m.pending), limit)
	if n == 0 {
		return nil
	}
	pending := make([]*Stored, n)
	for i, s := range m.pending[:n] {
		pending[i] = cloneStored(s)
	}
	read := memHashes(m.hashes) // the mutex is held: read without it
	b, err := integrate(m.tree, pending, read)
	if err != nil {
		return err
	}
	if err := b.Validate(m.tree, n); err != nil {
		return err
	}
	for i, s := range m.pending[:n] {
		s.Index, s.Sequenced = m.tree.Size+int64(i), true
		m.log = append(m.log, s)
	}
	m.pending = slices.Delete(m.pending, 0, n)
	m.hashes = append(m.hashes, b.Hashes...)
	m.tree = b.Tree
	return nil
}

// Validate is the check a Store makes before it writes a batch:
// ErrConflict unless b appends exactly n receipts, with their hashes, to
// the tree t.
func (b *Batch) Validate(t Tree, n int) error {
	if b == nil || b.Tree.Size != t.Size+int64(n) {
		return fmt.Errorf("%w: the batch does not append %d receipts to the tree of %d", ErrConflict, n, t.Size)
	}
	if want := tlog.StoredHashCount(b.Tree.Size) - tlog.StoredHashCount(t.Size); int64(len(b.Hashes)) != want {
		return fmt.Errorf("%w: the batch has %d hashes, want %d", ErrConflict, len(b.Hashes), want)
	}
	return nil
}

// Tree implements Store.
func (m *MemoryStore) Tree(context.Context) (Tree, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tree, nil
}

// ReadHashes implements Store.
func (m *MemoryStore) ReadHashes(_ context.Context, indexes []int64) ([]tlog.Hash, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return memHashes(m.hashes).ReadHashes(indexes)
}

// AddCheckpoint implements Store.
func (m *MemoryStore) AddCheckpoint(_ context.Context, c *Checkpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.checkpoints[c.Size]; ok {
		return fmt.Errorf("checkpoint of %d: %w", c.Size, ErrConflict)
	}
	cc := cloneCheckpoint(c)
	m.checkpoints[c.Size] = cc
	if m.latest == nil || cc.Size > m.latest.Size {
		m.latest = cc
	}
	return nil
}

// LatestCheckpoint implements Store.
func (m *MemoryStore) LatestCheckpoint(context.Context) (*Checkpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.latest == nil {
		return nil, fmt.Errorf("checkpoint: %w", ErrNotFound)
	}
	return cloneCheckpoint(m.latest), nil
}
