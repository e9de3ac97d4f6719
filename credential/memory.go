package credential

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryStore is a Store in memory, for tests and single-process use.
// Every method runs under one mutex, so each is atomic.
type MemoryStore struct {
	mu          sync.Mutex
	principals  map[string]*Principal
	credentials map[string]*Credential
	quotas      map[[2]string]Quota
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		principals:  make(map[string]*Principal),
		credentials: make(map[string]*Credential),
		quotas:      make(map[[2]string]Quota),
	}
}

// CreatePrincipal implements Store.
func (s *MemoryStore) CreatePrincipal(_ context.Context, p *Principal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.principals[p.ID]; ok {
		return ErrConflict
	}
	s.principals[p.ID] = clonePrincipal(p)
	return nil
}

// GetPrincipal implements Store.
func (s *MemoryStore) GetPrincipal(_ context.Context, id string) (*Principal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.principals[id]
	if !ok {
		return nil, ErrNotFound
	}
	return clonePrincipal(p), nil
}

// UpdatePrincipal implements Store.
func (s *MemoryStore) UpdatePrincipal(_ context.Context, p *Principal, rev int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.principals[p.ID]
	if !ok {
		return ErrNotFound
	}
	if cur.Rev != rev {
		return ErrConflict
	}
	s.principals[p.ID] = clonePrincipal(p)
	return nil
}

// PrincipalsByKey implements Store.
func (s *MemoryStore) PrincipalsByKey(_ context.Context, keyID string) ([]*Principal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Principal
	for _, p := range s.principals {
		if p.KeyID == keyID {
			out = append(out, clonePrincipal(p))
		}
	}
	return out, nil
}

// CreateCredential implements Store.
func (s *MemoryStore) CreateCredential(_ context.Context, c *Credential) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.credentials[c.ID]; ok {
		return ErrConflict
	}
	s.credentials[c.ID] = cloneCredential(c)
	return nil
}

// GetCredential implements Store.
func (s *MemoryStore) GetCredential(_ context.Context, id string) (*Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.credentials[id]
	if !ok {
		return nil, ErrNotFound
	}
	return cloneCredential(c), nil
}

// UpdateCredential implements Store.
func (s *MemoryStore) UpdateCredential(_ context.Context, c *Credential, rev int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.credentials[c.ID]
	if !ok {
		return ErrNotFound
	}
	if cur.Rev != rev {
		return ErrConflict
	}
	s.credentials[c.ID] = cloneCredential(c)
	return nil
}

// ListCredentials implements Store.
func (s *MemoryStore) ListCredentials(_ context.Context, f CredentialFilter) ([]*Credential, error) {
	if f.Limit < 1 {
		return nil, fmt.Errorf("%w: limit %d is below 1", ErrInvalidArgument, f.Limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var page []*Credential
	for _, c := range s.credentials {
		past := c.ID > f.After
		if f.Desc {
			past = f.After == "" || c.ID < f.After
		}
		if (f.PrincipalID == "" || c.PrincipalID == f.PrincipalID) && past {
			page = append(page, c)
		}
	}
	// Go compares strings as bytes: the order the Store contract asks for.
	slices.SortFunc(page, func(a, b *Credential) int { return strings.Compare(a.ID, b.ID) })
	if f.Desc {
		slices.Reverse(page)
	}
	page = page[:min(len(page), f.Limit)]
	out := make([]*Credential, len(page))
	for i, c := range page {
		out[i] = cloneCredential(c)
	}
	return out, nil
}

// ChargeQuota implements Store.
func (s *MemoryStore) ChargeQuota(_ context.Context, c QuotaCharge) (Quota, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{c.PrincipalID, c.Name}
	q, ok := s.quotas[k]
	switch {
	case !ok || !q.Start.After(c.Now.Add(-c.Window)):
		q = Quota{Start: c.Now, Used: c.N}
	case q.Used+c.N > c.Limit:
		return q, false, nil
	default:
		q.Used += c.N
	}
	s.quotas[k] = q
	return q, true, nil
}

func clonePrincipal(p *Principal) *Principal {
	c := *p
	c.PublicKey = slices.Clone(p.PublicKey)
	c.BannedAt = cloneTime(p.BannedAt)
	return &c
}

func cloneCredential(c *Credential) *Credential {
	d := *c
	d.Scopes = slices.Clone(c.Scopes)
	d.Digest = slices.Clone(c.Digest)
	d.RevokedAt = cloneTime(c.RevokedAt)
	return &d
}

func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}
