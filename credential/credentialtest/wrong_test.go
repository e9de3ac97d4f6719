package credentialtest_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/credential/credentialtest"
	"github.com/nodelane/nodelane/internal/wrongstore"
)

// The suite must refuse stores that are wrong in the ways real adapters
// are: each variant below passes every test but one. TestWrongStores runs
// the suite on each in a child process (a failing suite fails its
// *testing.T, which a parent cannot catch in process) and checks that it
// fails, and where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "CREDENTIALTEST_WRONG_STORE"

var wrongStores = []struct {
	name string
	new  func() credential.Store
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// Ids under a case-insensitive collation (MySQL's utf8mb4_general_ci,
	// SQLite's NOCASE): "Op-A" and "op-a" are one principal.
	{"FoldedIDs", func() credential.Store { return newFolded() }, "Records/IDsAreBytes"},
	// Text trimmed on the way in, as a form layer or a CHAR column would.
	{"TrimmedText", func() credential.Store { return trimmed{credential.NewMemoryStore()} }, "Records/TextRoundTrip"},
	// Pages ordered under a case-insensitive collation (ORDER BY id on a
	// NOCASE or utf8mb4_general_ci column): "a" before "B".
	{"CaseOrderedPages", func() credential.Store { return caseOrdered{credential.NewMemoryStore()} }, "Records/ListingPages"},
	// Desc ignored, as an adapter written before the field was: every
	// page ascending.
	{"AscendingOnly", func() credential.Store { return ascendingOnly{credential.NewMemoryStore()} }, "Records/ListingPages"},
}

// ascendingOnly lists credentials in ascending order whatever f.Desc says.
type ascendingOnly struct{ *credential.MemoryStore }

func (s ascendingOnly) ListCredentials(ctx context.Context, f credential.CredentialFilter) ([]*credential.Credential, error) {
	f.Desc = false
	return s.MemoryStore.ListCredentials(ctx, f)
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() credential.Store{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		credentialtest.Run(t, func(*testing.T) credential.Store { return stores[name]() })
	})
}

// folded is a MemoryStore behind a case-insensitive index of principal
// and credential ids: a lookup finds the record whose id folds to the
// same, and a new id that folds to a taken one conflicts.
type folded struct {
	mem *credential.MemoryStore

	mu    sync.Mutex
	names map[string]string // folded id -> id as first stored
}

func newFolded() *folded {
	return &folded{mem: credential.NewMemoryStore(), names: map[string]string{}}
}

// id returns the stored id that id folds to, or id itself.
func (f *folded) id(kind, id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stored, ok := f.names[kind+strings.ToLower(id)]; ok {
		return stored
	}
	return id
}

// claim records id as taken, or reports that one folding to it is.
func (f *folded) claim(kind, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := kind + strings.ToLower(id)
	if _, ok := f.names[k]; ok {
		return false
	}
	f.names[k] = id
	return true
}

func (f *folded) CreatePrincipal(ctx context.Context, p *credential.Principal) error {
	if !f.claim("p", p.ID) {
		return credential.ErrConflict
	}
	return f.mem.CreatePrincipal(ctx, p)
}

func (f *folded) GetPrincipal(ctx context.Context, id string) (*credential.Principal, error) {
	return f.mem.GetPrincipal(ctx, f.id("p", id))
}

func (f *folded) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) error {
	c := *p
	c.ID = f.id("p", p.ID)
	return f.mem.UpdatePrincipal(ctx, &c, rev)
}

func (f *folded) CreateCredential(ctx context.Context, c *credential.Credential) error {
	if !f.claim("c", c.ID) {
		return credential.ErrConflict
	}
	return f.mem.CreateCredential(ctx, c)
}

func (f *folded) GetCredential(ctx context.Context, id string) (*credential.Credential, error) {
	return f.mem.GetCredential(ctx, f.id("c", id))
}

func (f *folded) UpdateCredential(ctx context.Context, c *credential.Credential, rev int64) error {
	d := *c
	d.ID = f.id("c", c.ID)
	return f.mem.UpdateCredential(ctx, &d, rev)
}

func (f *folded) ListCredentials(ctx context.Context, cf credential.CredentialFilter) ([]*credential.Credential, error) {
	if cf.PrincipalID != "" {
		cf.PrincipalID = f.id("p", cf.PrincipalID)
	}
	return f.mem.ListCredentials(ctx, cf)
}

func (f *folded) ChargeQuota(ctx context.Context, c credential.QuotaCharge) (credential.Quota, bool, error) {
	c.PrincipalID = f.id("p", c.PrincipalID)
	return f.mem.ChargeQuota(ctx, c)
}

func (f *folded) PrincipalsByKey(ctx context.Context, keyID string) ([]*credential.Principal, error) {
	return f.mem.PrincipalsByKey(ctx, keyID)
}

// trimmed is a MemoryStore that trims the space around names and ban
// reasons before it keeps them.
type trimmed struct{ *credential.MemoryStore }

func trim(p *credential.Principal) *credential.Principal {
	c := *p
	c.Name, c.BanReason = strings.TrimSpace(p.Name), strings.TrimSpace(p.BanReason)
	return &c
}

func (s trimmed) CreatePrincipal(ctx context.Context, p *credential.Principal) error {
	return s.MemoryStore.CreatePrincipal(ctx, trim(p))
}

func (s trimmed) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) error {
	return s.MemoryStore.UpdatePrincipal(ctx, trim(p), rev)
}

// caseOrdered is a MemoryStore whose credential pages are in
// case-insensitive order of the ids, After compared the same way.
type caseOrdered struct{ *credential.MemoryStore }

func (s caseOrdered) ListCredentials(ctx context.Context, f credential.CredentialFilter) ([]*credential.Credential, error) {
	if f.Limit < 1 {
		return nil, credential.ErrInvalidArgument
	}
	all, err := s.MemoryStore.ListCredentials(ctx, credential.CredentialFilter{PrincipalID: f.PrincipalID, Limit: math.MaxInt})
	if err != nil {
		return nil, err
	}
	key := func(id string) string { return strings.ToLower(id) }
	slices.SortStableFunc(all, func(a, b *credential.Credential) int { return strings.Compare(key(a.ID), key(b.ID)) })
	var out []*credential.Credential
	for _, c := range all {
		if (f.After == "" || key(c.ID) > key(f.After)) && len(out) < f.Limit {
			out = append(out, c)
		}
	}
	return out, nil
}
