package fingerprint

import (
	"cmp"
	"context"
	"slices"
	"sync"
)

// MemoryStore is a Store in memory, for tests and single-process use.
type MemoryStore struct {
	mu  sync.Mutex
	fps []Fingerprint
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Add implements Store.
func (s *MemoryStore) Add(ctx context.Context, fps []Fingerprint) ([]Fingerprint, error) {
	if err := ValidateAll(fps); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fps {
		if !slices.ContainsFunc(s.fps, func(g Fingerprint) bool { return g.Kind == f.Kind && g.ID == f.ID }) {
			s.fps = append(s.fps, f)
		}
	}
	slices.SortFunc(s.fps, func(a, b Fingerprint) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID))
	})
	return slices.Clone(s.fps), nil
}
