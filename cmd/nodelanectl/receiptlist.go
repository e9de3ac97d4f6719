package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// receiptRow is a sequenced receipt with the fields of its body, read
// as JSON whatever its kind (a newer server's kinds included).
type receiptRow struct {
	receipts.WireReceipt
	fields map[string]string
	// keys are the body's fields in their order.
	keys []string
}

// rowOf reads a receipt's body; a body that is not a JSON object leaves
// the fields empty.
func rowOf(w receipts.WireReceipt) receiptRow {
	r := receiptRow{WireReceipt: w, fields: map[string]string{}}
	n, err := parseJSON(w.Body)
	if err != nil || n.kind != '{' {
		return r
	}
	for i, k := range n.keys {
		v := n.items[i]
		switch v.kind {
		case '{':
			r.fields[k] = "(object)" // canonical bodies are flat
		case '[':
			r.fields[k] = "(array)"
		default:
			r.fields[k] = v.text
		}
		r.keys = append(r.keys, k)
	}
	return r
}

// field is a body field's value, "-" when it has none.
func (r receiptRow) field(names ...string) string {
	for _, k := range names {
		if v := r.fields[k]; v != "" {
			return v
		}
	}
	return "-"
}

// subject is what a receipt is about: its job, worker, credential, ....
func (r receiptRow) subject() string {
	return r.field("job_id", "worker_id", "credential_id", "artifact_id", "principal_id", "node_id")
}

func (r receiptRow) index() string {
	if r.Index == nil {
		return "-"
	}
	return strconv.FormatInt(*r.Index, 10)
}

// receiptCols are the columns of receipts list.
var receiptCols = []col[receiptRow]{
	{name: "INDEX", cell: receiptRow.index},
	{name: "ID", cell: func(r receiptRow) string { return r.ID }},
	{name: "KIND", cell: func(r receiptRow) string { return string(r.Kind) }},
	{name: "TIME", cell: func(r receiptRow) string { return r.field("server_time") }},
	{name: "SUBJECT", cell: receiptRow.subject},
	{name: "ACTOR", wide: true, cell: func(r receiptRow) string { return r.field("actor") }},
	{name: "POLICY", wide: true, cell: func(r receiptRow) string { return r.field("policy_version") }},
	{name: "DETAIL", wide: true, cell: func(r receiptRow) string {
		return r.field("reason", "error_code", "actual_cost_usd", "event_type", "artifact_type")
	}},
}

// envelopeCols are the columns of envelope history.
var envelopeCols = []col[receiptRow]{
	{name: "INDEX", cell: receiptRow.index},
	{name: "TIME", cell: func(r receiptRow) string { return r.field("server_time") }},
	{name: "KIND", cell: func(r receiptRow) string { return string(r.Kind) }},
	{name: "POLICY", cell: func(r receiptRow) string { return r.field("policy_version") }},
	{name: "ACTOR", cell: func(r receiptRow) string { return r.field("actor") }},
	{name: "UNTIL", cell: func(r receiptRow) string { return r.field("until") }},
	// An envelope_safe_types_changed receipt's safe types after the change.
	{name: "SAFE_TYPES", cell: func(r receiptRow) string {
		if r.Kind != "envelope_safe_types_changed" {
			return "-"
		}
		return r.field("job_types")
	}},
	{name: "REASON", cell: func(r receiptRow) string { return r.field("reason") }},
	{name: "RECEIPT", wide: true, cell: func(r receiptRow) string { return r.ID }},
}

// receiptPage reads one page of GET /operator/receipts as it came.
func (a *app) receiptPage(ctx context.Context, api *operator.Client, kind, after string, limit int, order string) ([]byte, *wire.ReceiptListResponse, error) {
	q := url.Values{}
	if kind != "" {
		q.Set("kind", kind)
	}
	if after != "" {
		q.Set("after", after)
	}
	q.Set("limit", strconv.Itoa(limit))
	q.Set("order", order)
	b, err := api.Call(ctx, "GET", "/operator/receipts?"+q.Encode(), nil)
	if err != nil {
		return nil, nil, err
	}
	var out wire.ReceiptListResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, nil, fmt.Errorf("GET /operator/receipts: %w: %v", operator.ErrMalformedAnswer, err)
	}
	return b, &out, nil
}

// checkIndex refuses an -after that is not a log index.
func checkIndex(cmd, after string) error {
	if after == "" {
		return nil
	}
	if n, err := strconv.ParseInt(after, 10, 64); err != nil || n < 0 {
		return usagef("%s: -after %q is not a receipt index (a whole number, the answer's next)", cmd, after)
	}
	return nil
}

func receiptsList(a *app, args []string) error {
	fs := a.flags("receipts list", "")
	kind := fs.String("kind", "", "only receipts of this kind ("+kindList()+")")
	after := fs.String("after", "", "list receipts after this log index, in the order listed (the answer's next)")
	limit := fs.Int("limit", 100, "receipts a page, 1 to 1000")
	order := orderFlag(fs)
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("receipts list", *limit); err != nil {
		return err
	}
	if err := checkOrder("receipts list", *order); err != nil {
		return err
	}
	if err := checkIndex("receipts list", *after); err != nil {
		return err
	}
	if *kind != "" && !receipts.Kind(*kind).Valid() {
		return usagef("receipts list: -kind %q: want one of %s", *kind, kindList())
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	b, out, err := a.receiptPage(a.ctx, api, *kind, *after, *limit, *order)
	if err != nil {
		return err
	}
	if a.raw() && !a.common.quiet {
		return a.printRaw(b)
	}
	rows := make([]receiptRow, len(out.Receipts))
	for i, w := range out.Receipts {
		rows[i] = rowOf(w)
	}
	next := ""
	if out.Next != nil {
		next = strconv.FormatInt(*out.Next, 10)
	}
	printList(a, receiptCols, rows, func(r receiptRow) string { return r.ID }, next)
	return nil
}

// kindList is the receipt kinds, comma-separated.
func kindList() string {
	var ks []string
	for _, k := range receipts.Kinds() {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}

func receiptsShow(a *app, args []string) error {
	fs := a.flags("receipts show", "RECEIPT_ID")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.ReceiptResponse, error) {
		return api.Receipt(ctx, a.arg(0))
	})
	if out == nil || err != nil {
		return err
	}
	if a.common.quiet {
		fmt.Fprintln(a.stdout, escapeText(out.Receipt.ID, false))
		return nil
	}
	r := rowOf(out.Receipt)
	t := newTable(a.stdout)
	t.row("id", r.ID)
	t.row("kind", string(r.Kind))
	t.row("index", r.index())
	if out.Proof != nil {
		t.row("proof", fmt.Sprintf("inclusion in the tree of %d receipts (%d hashes)", out.Proof.TreeSize, len(out.Proof.Hashes)))
	} else {
		t.row("proof", "- (not sequenced yet)")
	}
	for _, k := range r.keys {
		if k == "kind" || k == "id" {
			continue
		}
		t.row(k, r.fields[k])
	}
	t.flush()
	return nil
}

// maxHistoryPages bounds the pages envelope history reads of each kind:
// a page of a kind reads at most wire.MaxReceiptKindScan receipts of the
// log, so it looks through the last 1,000,000 receipts at most.
const maxHistoryPages = 100

// envelopeKinds are the receipt kinds of the envelope's changes.
func envelopeKinds() []receipts.Kind {
	var ks []receipts.Kind
	for _, k := range receipts.Kinds() {
		if strings.HasPrefix(string(k), "envelope_") {
			ks = append(ks, k)
		}
	}
	return ks
}

func envelopeHistory(a *app, args []string) error {
	fs := a.flags("envelope history", "")
	after := fs.String("after", "", "list changes older than this log index (the answer's next)")
	limit := fs.Int("limit", 20, "changes to list, 1 to 1000")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("envelope history", *limit); err != nil {
		return err
	}
	if err := checkIndex("envelope history", *after); err != nil {
		return err
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	// The newest of each kind, merged newest first.
	var all []receipts.WireReceipt
	more := false
	for _, kind := range envelopeKinds() {
		got, cursor := 0, *after
		for page := 0; got < *limit; page++ {
			if page == maxHistoryPages {
				more = true
				break
			}
			_, out, err := a.receiptPage(a.ctx, api, string(kind), cursor, *limit, orderDesc)
			if err != nil {
				return err
			}
			all = append(all, out.Receipts...)
			got += len(out.Receipts)
			if out.Next == nil {
				break
			}
			if got >= *limit {
				more = true
			}
			cursor = strconv.FormatInt(*out.Next, 10)
		}
	}
	slices.SortFunc(all, func(x, y receipts.WireReceipt) int { return -cmpIndex(x.Index, y.Index) })
	if len(all) > *limit {
		all, more = all[:*limit], true
	}
	next := ""
	if more && len(all) > 0 && all[len(all)-1].Index != nil {
		next = strconv.FormatInt(*all[len(all)-1].Index, 10)
	}
	if a.raw() && !a.common.quiet {
		var n *int64
		if next != "" {
			n = all[len(all)-1].Index
		}
		if all == nil {
			all = []receipts.WireReceipt{}
		}
		b, err := json.Marshal(wire.ReceiptListResponse{Receipts: all, Next: n})
		if err != nil {
			return err
		}
		return a.printRaw(b)
	}
	rows := make([]receiptRow, len(all))
	for i, w := range all {
		rows[i] = rowOf(w)
	}
	printList(a, envelopeCols, rows, func(r receiptRow) string { return r.ID }, next)
	return nil
}

// cmpIndex orders receipt indexes, an unsequenced one (nil) first.
func cmpIndex(x, y *int64) int {
	switch {
	case x == nil && y == nil:
		return 0
	case x == nil:
		return -1
	case y == nil:
		return 1
	case *x < *y:
		return -1
	case *x > *y:
		return 1
	}
	return 0
}
