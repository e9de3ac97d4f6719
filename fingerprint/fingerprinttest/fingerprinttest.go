// Package fingerprinttest is the conformance suite for fingerprint.Store
// implementations. An adapter's test calls Run with a function that
// returns a Store over a new, empty database:
//
//	func TestFingerprintStore(t *testing.T) {
//		fingerprinttest.Run(t, func(t *testing.T) fingerprint.Store {
//			return openEmptyDatabase(t).FingerprintStore()
//		})
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite checks that Add stores what is absent and keeps what is
// stored, returns every stored fingerprint in order, refuses malformed
// input without storing any of it, and that concurrent Adds of different
// values for one Kind and ID all return the same one. Kinds and ids are
// compared and ordered as bytes: a Kind or an ID that differs from a
// stored one only by trailing spaces, by case or by its non-ASCII bytes
// (a Unicode form, a full-width letter) names another fingerprint, stored
// and returned apart, and Add orders them as Go compares strings, Kind
// then ID. A column with a PAD SPACE collation (MariaDB's utf8mb4_bin:
// 'a' = 'a '), a case-insensitive one or a linguistic order fails. Add
// of nothing to an empty store, and every Add after a refused one that
// left the store empty, returns nil, not an empty slice.
package fingerprinttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/fingerprint"
)

// Run runs the suite on stores made by newStore. Each case makes its own
// store and runs in parallel with the others, so newStore is called
// concurrently, from parallel subtests, and must return independent
// stores: what one case adds must never show in another's store.
func Run(t *testing.T, newStore func(t *testing.T) fingerprint.Store) {
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, st fingerprint.Store)
	}{
		{"AddToEmpty", testAddToEmpty},
		{"KeepsStored", testKeepsStored},
		{"Invalid", testInvalid},
		{"Concurrent", testConcurrent},
		{"IDs", testIDs},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newStore(t))
		})
	}
}

// at is the suite's fixed time, in UTC microseconds as stores keep it.
var at = time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.UTC)

func fp(kind fingerprint.Kind, id string, b byte, created time.Time) fingerprint.Fingerprint {
	return fingerprint.Fingerprint{Kind: kind, ID: id, Value: strings.Repeat(fmt.Sprintf("%02x", b), 32), CreatedAt: created}
}

func add(t *testing.T, st fingerprint.Store, fps ...fingerprint.Fingerprint) []fingerprint.Fingerprint {
	t.Helper()
	got, err := st.Add(context.Background(), fps)
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	return got
}

func same(t *testing.T, what string, got, want []fingerprint.Fingerprint) {
	t.Helper()
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

// none checks that got, what Add returned from an empty store, is nil: a
// store returns no fingerprints as a nil slice, not an empty one.
func none(t *testing.T, what string, got []fingerprint.Fingerprint) {
	t.Helper()
	switch {
	case got == nil:
	case len(got) == 0:
		t.Errorf("%s returned an empty, non-nil slice; a store with no fingerprints returns nil", what)
	default:
		same(t, what, got, nil)
	}
}

func testAddToEmpty(t *testing.T, st fingerprint.Store) {
	none(t, "Add of nothing to an empty store", add(t, st))
	rk, p2, p1 := fp(fingerprint.KindReceiptKey, "", 0xaa, at), fp(fingerprint.KindPepper, "2", 0x02, at), fp(fingerprint.KindPepper, "1", 0x01, at)
	// Ordered by kind, then id: pepper before receipt_key.
	same(t, "first Add", add(t, st, rk, p2, p1), []fingerprint.Fingerprint{p1, p2, rk})
	same(t, "Add of nothing", add(t, st), []fingerprint.Fingerprint{p1, p2, rk})
}

func testKeepsStored(t *testing.T, st fingerprint.Store) {
	p1, rk := fp(fingerprint.KindPepper, "1", 0x01, at), fp(fingerprint.KindReceiptKey, "", 0xaa, at)
	add(t, st, p1, rk)
	later := at.Add(time.Hour)
	p1b, rkb, p3 := fp(fingerprint.KindPepper, "1", 0x11, later), fp(fingerprint.KindReceiptKey, "", 0xbb, later), fp(fingerprint.KindPepper, "3", 0x03, later)
	// A different value for a stored kind and id changes nothing; a new id
	// is added.
	same(t, "second Add", add(t, st, p1b, rkb, p3), []fingerprint.Fingerprint{p1, p3, rk})
}

func testInvalid(t *testing.T, st fingerprint.Store) {
	good := fp(fingerprint.KindPepper, "1", 0x01, at)
	for _, c := range []struct {
		name string
		f    fingerprint.Fingerprint
	}{
		{"empty kind", fp("", "1", 0x01, at)},
		{"long kind", fp(fingerprint.Kind(strings.Repeat("k", fingerprint.MaxKindLen+1)), "1", 0x01, at)},
		{"long id", fp(fingerprint.KindPepper, strings.Repeat("9", fingerprint.MaxIDLen+1), 0x01, at)},
		{"short value", fingerprint.Fingerprint{Kind: fingerprint.KindPepper, ID: "2", Value: "abcd", CreatedAt: at}},
		{"upper-case value", fingerprint.Fingerprint{Kind: fingerprint.KindPepper, ID: "2", Value: strings.Repeat("AB", 32), CreatedAt: at}},
		{"twice", fp(fingerprint.KindPepper, "1", 0x02, at)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := st.Add(context.Background(), []fingerprint.Fingerprint{good, fp(fingerprint.KindPepper, "7", 0x07, at), c.f})
			if !errors.Is(err, fingerprint.ErrInvalidArgument) {
				t.Fatalf("Add with %s: %v, want ErrInvalidArgument", c.name, err)
			}
			none(t, "Add of nothing after a refused Add", add(t, st))
		})
	}
}

func testConcurrent(t *testing.T, st fingerprint.Store) {
	const n = 8
	var (
		wg   sync.WaitGroup
		got  = make([][]fingerprint.Fingerprint, n)
		errs = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = st.Add(context.Background(), []fingerprint.Fingerprint{
				fp(fingerprint.KindPepper, "1", byte(i), at), fp(fingerprint.KindReceiptKey, "", byte(0x80+i), at),
			})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Add %d: %v", i, errs[i])
		}
		if len(got[i]) != 2 {
			t.Fatalf("Add %d returned %d fingerprints, want 2", i, len(got[i]))
		}
		same(t, fmt.Sprintf("Add %d against Add 0", i), got[i], got[0])
	}
	same(t, "stored after the concurrent Adds", add(t, st), got[0])
}

// testIDs: kinds and ids are compared and ordered as bytes. Each pair
// below differs only by trailing spaces, case or non-ASCII bytes, and
// names two fingerprints, whichever Add stores them; Add returns them in
// Go's order of Kind, then ID.
func testIDs(t *testing.T, st fingerprint.Store) {
	keys := []struct {
		kind fingerprint.Kind
		id   string
	}{
		{fingerprint.KindPepper, "1"},
		{fingerprint.KindPepper, "1 "},  // equal to "1" in a PAD SPACE collation
		{fingerprint.KindPepper, "1  "}, // and to "1 "
		{fingerprint.KindPepper, "a"},
		{fingerprint.KindPepper, "A"},          // equal to "a" when case is folded
		{fingerprint.KindPepper, "B"},          // before "a" as bytes, after it when case is folded
		{fingerprint.KindPepper, "\u00e4"},     // ä precomposed (NFC)
		{fingerprint.KindPepper, "a\u0308"},    // the same, decomposed (NFD)
		{fingerprint.KindPepper, "\uff21"},     // FULLWIDTH LATIN CAPITAL LETTER A
		{fingerprint.KindPepper, "\U0001f600"}, // four bytes, beyond the BMP
		{"pepper ", "1"},
		{"Pepper", "1"},
		{"p\u00e9pper", "1"},
		{fingerprint.KindReceiptKey, ""},
		{fingerprint.KindReceiptKey, " "},
		{"RECEIPT_KEY", ""},
	}
	var all []fingerprint.Fingerprint
	for i, k := range keys {
		all = append(all, fp(k.kind, k.id, byte(i+1), at))
	}
	// Go's order, which Add must return.
	sorted := func(fps []fingerprint.Fingerprint) []fingerprint.Fingerprint {
		return slices.SortedFunc(slices.Values(fps), func(a, b fingerprint.Fingerprint) int {
			if c := strings.Compare(string(a.Kind), string(b.Kind)); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
	}
	// Every other key first, in one Add, then the rest, each on its own,
	// last to first: a key must neither be taken for a stored one nor for
	// one of its own Add.
	var first, rest []fingerprint.Fingerprint
	for i, f := range all {
		if i%2 == 0 {
			first = append(first, f)
		} else {
			rest = append(rest, f)
		}
	}
	same(t, "Add of keys that differ only by trailing spaces, case or non-ASCII bytes", add(t, st, first...), sorted(first))
	stored := slices.Clone(first)
	for _, f := range slices.Backward(rest) {
		if t.Failed() {
			return // the first difference says it; the rest repeat it
		}
		stored = append(stored, f)
		same(t, fmt.Sprintf("Add of %q %q next to stored keys that differ from it only by trailing spaces, case or non-ASCII bytes", f.Kind, f.ID), add(t, st, f), sorted(stored))
	}
	if t.Failed() {
		return
	}
	// Other values for every key change nothing.
	var again []fingerprint.Fingerprint
	for i, k := range keys {
		again = append(again, fp(k.kind, k.id, byte(0x80+i), at.Add(time.Hour)))
	}
	same(t, "Add of other values for every stored key", add(t, st, again...), sorted(all))
}
