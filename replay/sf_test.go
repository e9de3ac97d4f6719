package replay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// digestField is a Content-Digest-like dictionary of n distinct members,
// each a byte sequence, optionally followed by a repeat of the first.
func digestField(n int, repeat bool) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "k%d=:AAAA:", i)
	}
	if repeat {
		b.WriteString(", k0=:AAAA:")
	}
	return b.String()
}

// paramsField is one member with n distinct parameters, optionally
// followed by a repeat of the first.
func paramsField(n int, repeat bool) string {
	var b strings.Builder
	b.WriteString("sig=()")
	for i := range n {
		fmt.Fprintf(&b, ";p%d=1", i)
	}
	if repeat {
		b.WriteString(";p0=2")
	}
	return b.String()
}

func TestKeySet(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, smallKeys - 1, smallKeys, smallKeys + 1, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			var s keySet
			for i := range n {
				if !s.add(fmt.Sprint("k", i)) {
					t.Fatalf("key %d reported as seen", i)
				}
			}
			for i := range n {
				if s.add(fmt.Sprint("k", i)) {
					t.Fatalf("key %d of %d not reported as seen", i, n)
				}
			}
			if !s.add("other") {
				t.Fatal("a new key reported as seen")
			}
		})
	}
}

func TestDuplicatesAmongMany(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, field string
		dup         bool
	}{
		{"members", digestField(1000, false), false},
		{"member repeated last", digestField(1000, true), true},
		{"parameters", paramsField(1000, false), false},
		{"parameter repeated last", paramsField(1000, true), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseDictionary([]string{tc.field})
			if got := err != nil; got != tc.dup {
				t.Fatalf("parseDictionary: %v, want a duplicate: %v", err, tc.dup)
			}
			if tc.dup && !strings.Contains(err.Error(), "duplicate") {
				t.Fatalf("parseDictionary: %v, want a duplicate", err)
			}
		})
	}
}

// TestDuplicateScanIsLinear checks that the scan of a dictionary of 100,000 members
// (1.1 MB) takes a fraction of a second. Comparing each key with every one
// before it, as the scanner once did, is 5·10⁹ comparisons: half a minute
// or more.
func TestDuplicateScanIsLinear(t *testing.T) {
	t.Parallel()
	for _, f := range []string{digestField(100_000, true), paramsField(100_000, true)} {
		start := time.Now()
		err := checkDuplicates(f)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("scanning %d bytes took %v", len(f), d)
		}
		if err == nil || errors.Is(err, errRawSyntax) {
			t.Errorf("checkDuplicates: %v, want the duplicate", err)
		}
	}
}

// BenchmarkDuplicateScan measures the raw duplicate scan, the part of
// parsing a signature field that was quadratic, for dictionaries of n and
// 10n members (and one item of n and 10n parameters): ns/op grows tenfold.
func BenchmarkDuplicateScan(b *testing.B) {
	for _, n := range []int{1000, 10_000, 100_000} {
		for _, kind := range []struct {
			name  string
			field func(int, bool) string
		}{{"members", digestField}, {"params", paramsField}} {
			f := kind.field(n, false)
			b.Run(fmt.Sprintf("%s=%d", kind.name, n), func(b *testing.B) {
				b.SetBytes(int64(len(f)))
				for b.Loop() {
					if err := checkDuplicates(f); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkContentDigestMembers measures CheckContentDigest's parse of a
// Content-Digest of n and 10n members (httpsfv's parse and the duplicate
// scan), refused after the parse for its unknown algorithms.
func BenchmarkContentDigestMembers(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		f := digestField(n, false)
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(f)))
			for b.Loop() {
				if err := CheckContentDigest(f, nil); !errors.Is(err, ErrBadDigest) {
					b.Fatal(err)
				}
			}
		})
	}
}
