package receipts_test

import (
	"context"
	"slices"
	"testing"

	"github.com/nodelane/nodelane/receipts"
)

// Log.ListDesc lists sequenced receipts newest first, below an index (or
// from the newest), a page at a time; a receipt minted but not sequenced
// is not listed.
func TestListDesc(t *testing.T) {
	t.Parallel()
	l := newTestLog(t, 7)
	ctx := context.Background()
	if _, err := l.log.Mint(ctx, receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: "wrk_pending", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	indexes := func(rs []*receipts.Stored) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.Index)
		}
		return out
	}
	for _, c := range []struct {
		before int64
		limit  int
		want   []int64
	}{
		{-1, 3, []int64{6, 5, 4}},
		{-1, 100, []int64{6, 5, 4, 3, 2, 1, 0}},
		{4, 3, []int64{3, 2, 1}},
		{2, 10, []int64{1, 0}},
		{1, 10, []int64{0}},
		{0, 10, nil},
		{100, 2, []int64{6, 5}},
	} {
		rs, err := l.log.ListDesc(ctx, c.before, c.limit)
		if err != nil {
			t.Fatalf("ListDesc(%d, %d): %v", c.before, c.limit, err)
		}
		if got := indexes(rs); !slices.Equal(got, c.want) {
			t.Errorf("ListDesc(%d, %d) = %v, want %v", c.before, c.limit, got, c.want)
		}
	}
	// Paging down with the last index as the next bound lists each once.
	var all []int64
	for before := int64(-1); ; {
		rs, err := l.log.ListDesc(ctx, before, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, indexes(rs)...)
		if len(rs) < 2 {
			break
		}
		before = rs[len(rs)-1].Index
	}
	if !slices.Equal(all, []int64{6, 5, 4, 3, 2, 1, 0}) {
		t.Errorf("paged down: %v", all)
	}
}
