package credentialtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/credential"
)

// ids returns the ids of cs.
func ids(cs []*credential.Credential) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

// testListingPages: Store.ListCredentials pages in byte order of the ids
// (descending with Desc), after an exclusive bound, for one principal or
// all, at most Limit, and
// refuses a Limit below 1; Issuer.ListCredentials adds its page sizes, the
// next bound and its argument checks.
func testListingPages(t *testing.T, f *fixture) {
	// Ids chosen so that byte order differs from case-insensitive,
	// accent-insensitive and numeric orders: "B" < "Z" < "a" (ASCII),
	// "e\u0301" (0x65 0xcc 0x81) < "~" < "é" (0xc3 0xa9), "10" < "9".
	// No two differ only in case, which IDsAreBytes covers.
	type row struct{ id, principal string }
	rows := []row{
		{"a", "p1"}, {"B", "p2"}, {"é", "p1"}, {"Z", "p1"}, {"e\u0301", "p2"}, {"~", "p1"},
		{"9", "p2"}, {"10", "p1"}, {"a ", "p1"}, {"Y", "p2"},
	}
	now := epoch.Truncate(time.Microsecond)
	for _, pid := range []string{"p1", "p2"} {
		p := &credential.Principal{ID: pid, Kind: credential.KindOperator, Name: pid, CreatedAt: now, Rev: 1}
		if err := f.store.CreatePrincipal(f.ctx, p); err != nil {
			t.Fatalf("Store.CreatePrincipal(%s): %v", pid, err)
		}
	}
	written := map[string]*credential.Credential{}
	for i, r := range rows {
		c := &credential.Credential{ID: r.id, PrincipalID: r.principal, Scopes: []credential.Scope{credential.ScopeOperatorJobs},
			Digest: []byte{byte(i), 1}, PepperVersion: 1, CreatedAt: now.Add(time.Duration(len(rows)-i) * time.Second),
			ExpiresAt: now.Add(time.Hour), Rev: 1}
		if err := f.store.CreateCredential(f.ctx, c); err != nil {
			t.Fatalf("Store.CreateCredential(%q): %v", r.id, err)
		}
		written[r.id] = c
	}
	all := []string{"10", "9", "B", "Y", "Z", "a", "a ", "e\u0301", "~", "é"}
	of := map[string][]string{
		"p1": {"10", "Z", "a", "a ", "~", "é"},
		"p2": {"9", "B", "Y", "e\u0301"},
	}
	list := func(cf credential.CredentialFilter) []*credential.Credential {
		t.Helper()
		cs, err := f.store.ListCredentials(f.ctx, cf)
		if err != nil {
			t.Fatalf("Store.ListCredentials(%+v): %v", cf, err)
		}
		return cs
	}
	// Every page size, for every principal and for all: the pages, put
	// together, are the ids in byte order, each page at most Limit long.
	for _, pid := range []string{"", "p1", "p2"} {
		want := all
		if pid != "" {
			want = of[pid]
		}
		for limit := 1; limit <= len(all)+1; limit++ {
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				if pages > len(all)+1 {
					t.Fatalf("principal %q, limit %d: the pages do not end: %q", pid, limit, got)
				}
				cs := list(credential.CredentialFilter{PrincipalID: pid, After: after, Limit: limit})
				if len(cs) > limit {
					t.Fatalf("principal %q, limit %d, after %q: %d credentials", pid, limit, after, len(cs))
				}
				for _, c := range cs {
					if pid != "" && c.PrincipalID != pid {
						t.Fatalf("principal %q: listed %q of %q", pid, c.ID, c.PrincipalID)
					}
				}
				got = append(got, ids(cs)...)
				if len(cs) < limit {
					break
				}
				after = cs[len(cs)-1].ID
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("principal %q, limit %d: ids (-want +got):\n%s", pid, limit, d)
			}
		}
	}
	// Desc: the same pages in descending byte order, After an exclusive
	// upper bound ("" from the highest id).
	for _, pid := range []string{"", "p1", "p2"} {
		want := slices.Clone(all)
		if pid != "" {
			want = slices.Clone(of[pid])
		}
		slices.Reverse(want)
		for _, limit := range []int{1, 3, len(all) + 1} {
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				if pages > len(all)+1 {
					t.Fatalf("desc, principal %q, limit %d: the pages do not end: %q", pid, limit, got)
				}
				cs := list(credential.CredentialFilter{PrincipalID: pid, After: after, Limit: limit, Desc: true})
				got = append(got, ids(cs)...)
				if len(cs) < limit {
					break
				}
				after = cs[len(cs)-1].ID
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("desc, principal %q, limit %d: ids (-want +got):\n%s", pid, limit, d)
			}
		}
	}
	for _, tc := range []struct {
		after string
		want  []string
	}{
		{"a", []string{"Z", "Y", "B", "9", "10"}},
		{"0", nil},
		{"\U0010ffff", []string{"é", "~", "e\u0301", "a ", "a", "Z", "Y", "B", "9", "10"}},
	} {
		cs := list(credential.CredentialFilter{After: tc.after, Limit: 100, Desc: true})
		if d := cmp.Diff(tc.want, ids(cs), cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("desc, after %q: ids (-want +got):\n%s", tc.after, d)
		}
	}
	if got, next, err := f.is.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: "p1", Limit: 2, Desc: true}); err != nil || !slices.Equal(ids(got), []string{"é", "~"}) || next != "~" {
		t.Fatalf("Issuer.ListCredentials(p1, 2, desc) = %q, %q, %v", ids(got), next, err)
	}

	// After is exclusive and need not be an id; records come back whole.
	for _, tc := range []struct {
		after string
		want  []string
	}{
		{"a", []string{"a ", "e\u0301", "~", "é"}},
		{"Y", []string{"Z", "a", "a ", "e\u0301", "~", "é"}},
		{"é", nil},
		{"\U0010ffff", nil},
		{"0", all},
	} {
		cs := list(credential.CredentialFilter{After: tc.after, Limit: 100})
		if d := cmp.Diff(tc.want, ids(cs), cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("after %q: ids (-want +got):\n%s", tc.after, d)
		}
		for _, c := range cs {
			if d := cmp.Diff(written[c.ID], c, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("listed credential %q differs from the one written (-written +listed):\n%s", c.ID, d)
			}
		}
	}
	if cs := list(credential.CredentialFilter{PrincipalID: "nobody", Limit: 5}); len(cs) != 0 {
		t.Fatalf("an unknown principal's credentials: %q", ids(cs))
	}
	// A listed record is a copy.
	cs := list(credential.CredentialFilter{Limit: 1})
	cs[0].Scopes[0], cs[0].Digest[0] = credential.ScopeOperatorReceipts, 0xff
	f.stored(written[cs[0].ID])
	for _, limit := range []int{0, -1} {
		_, err := f.store.ListCredentials(f.ctx, credential.CredentialFilter{Limit: limit})
		wantErr(t, fmt.Sprintf("Store.ListCredentials with limit %d", limit), err, credential.ErrInvalidArgument)
	}

	// The Issuer's pages.
	got, next, err := f.is.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: "p1", Limit: 2})
	if err != nil || !slices.Equal(ids(got), []string{"10", "Z"}) || next != "Z" {
		t.Fatalf("Issuer.ListCredentials(p1, 2) = %q, %q, %v", ids(got), next, err)
	}
	got, next, err = f.is.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: "p1", After: "~", Limit: 2})
	if err != nil || !slices.Equal(ids(got), []string{"é"}) || next != "" {
		t.Fatalf("Issuer.ListCredentials(p1, after ~) = %q, %q, %v", ids(got), next, err)
	}
	got, next, err = f.is.ListCredentials(f.ctx, credential.CredentialFilter{})
	if err != nil || !slices.Equal(ids(got), all) || next != "" {
		t.Fatalf("Issuer.ListCredentials(default limit) = %q, %q, %v", ids(got), next, err)
	}
	for _, tc := range []struct {
		name string
		cf   credential.CredentialFilter
		want error
	}{
		{"negative limit", credential.CredentialFilter{Limit: -1}, credential.ErrInvalidArgument},
		{"limit over the maximum", credential.CredentialFilter{Limit: credential.MaxListLimit + 1}, credential.ErrInvalidArgument},
		{"after not UTF-8", credential.CredentialFilter{After: "a\xff"}, credential.ErrInvalidArgument},
		{"after with NUL", credential.CredentialFilter{After: "a\x00"}, credential.ErrInvalidArgument},
		{"unknown principal", credential.CredentialFilter{PrincipalID: "nobody"}, credential.ErrNotFound},
		{"principal not UTF-8", credential.CredentialFilter{PrincipalID: "p1\xff"}, credential.ErrNotFound},
	} {
		_, _, err := f.is.ListCredentials(f.ctx, tc.cf)
		wantErr(t, "Issuer.ListCredentials: "+tc.name, err, tc.want)
	}
	// Credentials, which pages through the store, finds every one and
	// orders them by creation time.
	p1 := f.credentials("p1")
	if d := cmp.Diff([]string{"a ", "10", "~", "Z", "é", "a"}, ids(p1)); d != "" {
		t.Fatalf("Credentials(p1) (-want +got):\n%s", d)
	}
}

// testListingMany: Issuer.Credentials finds every credential of a
// principal with more than a store page of them.
func testListingMany(t *testing.T, f *fixture) {
	p := f.principal(credential.KindOperator, "many")
	other := f.principal(credential.KindOperator, "other")
	now := epoch.Truncate(time.Microsecond)
	n := credential.MaxListLimit + 3
	for i := range n {
		for _, pid := range []string{p.ID, other.ID} {
			if pid == other.ID && i%500 != 0 {
				continue
			}
			c := &credential.Credential{ID: fmt.Sprintf("%s-%05d", pid, i), PrincipalID: pid, Scopes: []credential.Scope{credential.ScopeOperatorJobs},
				Digest: []byte{1}, PepperVersion: 1, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Rev: 1}
			if err := f.store.CreateCredential(f.ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs := f.credentials(p.ID)
	if len(cs) != n {
		t.Fatalf("Credentials = %d, want %d", len(cs), n)
	}
	for i, c := range cs {
		if want := fmt.Sprintf("%s-%05d", p.ID, i); c.ID != want {
			t.Fatalf("credential %d is %q, want %q", i, c.ID, want)
		}
	}
}
