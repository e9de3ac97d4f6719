package envelope

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
)

// MemoryStore is a Store in memory, for tests and single-process use.
// Every method runs under one mutex, so each is atomic.
type MemoryStore struct {
	mu      sync.Mutex
	state   State
	history []Record
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns a MemoryStore in the initial state.
func NewMemoryStore() *MemoryStore { return &MemoryStore{state: InitialState()} }

// State implements Store.
func (s *MemoryStore) State(context.Context) (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	st.Until = cloneTime(st.Until)
	st.SafeTypes = slices.Clone(st.SafeTypes)
	return st, nil
}

// Apply implements Store.
func (s *MemoryStore) Apply(_ context.Context, prev int64, next State, rec Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state.Version != prev {
		return ErrConflict
	}
	next.Until = cloneTime(next.Until)
	rec.Until = cloneTime(rec.Until)
	next.SafeTypes = slices.Clone(next.SafeTypes)
	rec.SafeTypes = slices.Clone(rec.SafeTypes)
	s.state = next
	s.history = append(s.history, rec)
	return nil
}

// History implements Store.
func (s *MemoryStore) History(_ context.Context, after int64, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: history limit %d is not positive", ErrInvalidArgument, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Record
	for _, r := range s.history {
		if r.Version <= after {
			continue
		}
		r.Until = cloneTime(r.Until)
		r.SafeTypes = slices.Clone(r.SafeTypes)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Version, b.Version) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
