package replay

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// MemoryConfig holds a MemoryStore's optional settings. A nil *MemoryConfig
// means all defaults.
type MemoryConfig struct {
	// PerNode caps the live nonces of one node: a node that holds this
	// many gets ErrQuota until some expire. At 300 s a signature, the
	// default lets a node make 33 requests a second. Defaults to 10,000.
	PerNode int
	// Total caps the live nonces of all nodes together, so that many
	// nodes cannot exhaust memory. Defaults to 1,000,000.
	Total int
}

// MemoryStore is a Store in memory, for tests and single-process use.
// It is bounded by its per-node and total caps, and deletes expired nonces
// as it goes (on every Insert), so Collect is optional.
type MemoryStore struct {
	perNode, total int

	mu    sync.Mutex
	nodes map[string]map[string]time.Time // node -> nonce -> expiry
	byExp nonceHeap
	// horizon is the latest now up to which expired nonces were deleted.
	// Insert refuses a nonce that expires before it: had it been recorded
	// earlier, it might have been deleted already, so it could be a
	// replay. That closes the gap between two callers whose clocks (or
	// calls) are not in order.
	horizon time.Time
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore. cfg may be nil.
func NewMemoryStore(cfg *MemoryConfig) *MemoryStore {
	var c MemoryConfig
	if cfg != nil {
		c = *cfg
	}
	if c.PerNode <= 0 {
		c.PerNode = 10000
	}
	if c.Total <= 0 {
		c.Total = 1000000
	}
	return &MemoryStore{perNode: c.PerNode, total: c.Total, nodes: make(map[string]map[string]time.Time)}
}

// Insert implements Store.
func (s *MemoryStore) Insert(_ context.Context, nodeID, nonce string, expires, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.collect(now)
	// After collect, every record left expires after now.
	m := s.nodes[nodeID]
	if _, ok := m[nonce]; ok {
		return ErrReplayedNonce
	}
	if !expires.After(s.horizon) {
		return fmt.Errorf("%w: nonce expired at %s, before the store's horizon", ErrReplayedNonce, expires.Format(time.RFC3339Nano))
	}
	if len(m) >= s.perNode {
		return fmt.Errorf("%w: node holds %d live nonces", ErrQuota, len(m))
	}
	if len(s.byExp) >= s.total {
		return fmt.Errorf("%w: store holds %d live nonces", ErrQuota, len(s.byExp))
	}
	if m == nil {
		m = make(map[string]time.Time)
		s.nodes[nodeID] = m
	}
	m[nonce] = expires
	s.byExp.push(nonceEntry{expires: expires, node: nodeID, nonce: nonce})
	return nil
}

// Collect implements Store.
func (s *MemoryStore) Collect(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.collect(now), nil
}

// Len returns how many nonces the store holds.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byExp)
}

func (s *MemoryStore) collect(now time.Time) int {
	if now.After(s.horizon) {
		s.horizon = now
	}
	n := 0
	for len(s.byExp) > 0 && !s.byExp[0].expires.After(s.horizon) {
		e := s.byExp.pop()
		// A nonce is in the heap once: it is re-inserted only after it was
		// collected.
		m := s.nodes[e.node]
		delete(m, e.nonce)
		if len(m) == 0 {
			delete(s.nodes, e.node)
		}
		n++
	}
	return n
}

type nonceEntry struct {
	expires     time.Time
	node, nonce string
}

// nonceHeap is a min-heap of entries by expiry.
type nonceHeap []nonceEntry

func (h *nonceHeap) push(e nonceEntry) {
	*h = append(*h, e)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a[i].expires.Before(a[p].expires) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *nonceHeap) pop() nonceEntry {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = nonceEntry{}
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].expires.Before(a[m].expires) {
			m = l
		}
		if r < len(a) && a[r].expires.Before(a[m].expires) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
