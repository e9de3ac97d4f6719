package main

import (
	"flag"
	"fmt"
	"strings"
)

// col is a column of a list's table: its header, its cell of an item,
// and whether only -o wide shows it.
type col[T any] struct {
	name string
	cell func(T) string
	wide bool
}

// printList writes a page of a list: with -q the ids only, one a line;
// else a table of cols (the wide ones with -o wide), its header row but
// with -no-headers. next, when not "", is the next page's -after: after
// a table it goes to standard output, with -q or -no-headers to
// standard error, so that what a script reads holds only rows.
func printList[T any](a *app, cols []col[T], items []T, id func(T) string, next string) {
	if a.common.quiet {
		for _, x := range items {
			fmt.Fprintln(a.stdout, escapeText(strings.NewReplacer("\n", " ", "\r", " ").Replace(id(x)), false))
		}
	} else {
		t := newTable(a.stdout)
		var shown []col[T]
		for _, c := range cols {
			if !c.wide || a.wide() {
				shown = append(shown, c)
			}
		}
		if !a.common.noHeaders {
			hdr := make([]string, len(shown))
			for i, c := range shown {
				hdr[i] = c.name
			}
			t.row(hdr...)
		}
		for _, x := range items {
			cells := make([]string, len(shown))
			for i, c := range shown {
				cells[i] = c.cell(x)
			}
			t.row(cells...)
		}
		t.flush()
	}
	if next == "" {
		return
	}
	if a.common.quiet || a.common.noHeaders {
		fmt.Fprintf(a.stderr, "more: -after %s\n", escapeText(next, false))
	} else {
		fmt.Fprintf(a.stdout, "more: -after %s\n", escapeText(next, false))
	}
}

// The values of -order.
const (
	orderAsc  = "asc"
	orderDesc = "desc"
)

// orderFlag defines -order on a list's flags: newest first by default.
func orderFlag(fs *flag.FlagSet) *string {
	return fs.String("order", orderDesc, "desc: newest first; asc: oldest first")
}

// checkOrder refuses an -order that is neither asc nor desc.
func checkOrder(cmd, order string) error {
	if order != orderAsc && order != orderDesc {
		return usagef("%s: -order %q: want asc or desc", cmd, order)
	}
	return nil
}
