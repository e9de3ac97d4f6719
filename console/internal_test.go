package console

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// memHashes is a tlog.HashReader over the stored hashes of a tree.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("hash %d is not in the tree", x)
		}
		out[i] = m[x]
	}
	return out, nil
}

// TestFrontier checks the frontier's root against tlog's, over every
// stored hash, for trees of 0 to 70 leaves, and that it keeps one hash
// per bit of the size.
func TestFrontier(t *testing.T) {
	t.Parallel()
	var (
		f      frontier
		stored memHashes
	)
	for n := int64(0); n <= 70; n++ {
		want, err := tlog.TreeHash(n, stored)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.root(); got != want {
			t.Fatalf("%d leaves: root %v, want %v", n, got, want)
		}
		ones := 0
		for m := n; m > 0; m >>= 1 {
			ones += int(m & 1)
		}
		if len(f.hashes) != ones {
			t.Fatalf("%d leaves: %d hashes kept, want %d", n, len(f.hashes), ones)
		}
		h := tlog.RecordHash([]byte(fmt.Sprint("leaf ", n)))
		hs, err := tlog.StoredHashesForRecordHash(n, h, stored)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
		f.append(h)
	}
}

// TestLimiterBounded checks that the sign-in limiter's table holds at
// most its bound of addresses, forgetting refilled ones first, then the
// one seen least recently.
func TestLimiterBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1e9, 0)
	l := newLimiter(time.Minute, 1, 2, func() time.Time { return now })
	for _, a := range []string{"a", "b"} {
		if _, ok := l.allow(a); !ok {
			t.Fatalf("%s's first sign-in refused", a)
		}
		now = now.Add(time.Second)
	}
	if _, ok := l.allow("a"); ok {
		t.Fatal("a's second sign-in allowed with a burst of 1")
	}
	if _, ok := l.allow("c"); !ok || len(l.m) != 2 {
		t.Fatalf("c: allowed %v, %d addresses held, want 2", ok, len(l.m))
	}
	if l.m["b"] != nil || l.m["a"] == nil {
		t.Fatal("the full table did not forget b, the address seen least recently")
	}
	now = now.Add(time.Hour)
	if _, ok := l.allow("d"); !ok || len(l.m) != 1 {
		// a and c refilled: both forgotten, d added.
		t.Fatalf("d: allowed %v, %d addresses held, want 1", ok, len(l.m))
	}
}
