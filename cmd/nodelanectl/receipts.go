package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/receiptexport"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// listReceipts lists the first n sequenced receipts of kind (all kinds
// when ""), or all of them when n is negative, in index order, following
// the pages of GET /operator/receipts.
func (a *app) listReceipts(kind receipts.Kind, n int64) ([]receipts.WireReceipt, error) {
	api, err := a.client()
	if err != nil {
		return nil, err
	}
	var all []receipts.WireReceipt
	if n == 0 {
		return all, nil
	}
	for w, err := range api.Receipts(a.ctx, operator.ReceiptQuery{Kind: kind, Limit: 1000}) {
		if err != nil {
			return nil, err
		}
		if all = append(all, w); int64(len(all)) == n {
			break
		}
	}
	return all, nil
}

// writeFile writes to path, or standard output for "-".
func (a *app) writeFile(path string, write func(w io.Writer) error) error {
	if path == "-" {
		return write(a.stdout)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func receiptsExport(a *app, args []string) error {
	fs := a.flags("receipts export", "")
	out := fs.String("out", "", "write the receipts, one JSON line each, to this `file` (- for standard output; required)")
	cpFile := fs.String("checkpoint", "", "write the signed checkpoint to this `file` (required)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *out == "" || *cpFile == "" {
		return usagef("receipts export: -out and -checkpoint are required")
	}
	if *cpFile == "-" {
		return usagef("receipts export: -checkpoint needs a file")
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	signed, err := api.Checkpoint(a.ctx)
	if err != nil {
		return err
	}
	// The checkpoint's size, read without its signature: verify checks it.
	i := bytes.LastIndex(signed, []byte("\n\n"))
	if i < 0 {
		return errors.New("the server's checkpoint is not a signed note")
	}
	_, tree, err := receipts.ParseCheckpoint(signed[:i+1])
	if err != nil {
		return fmt.Errorf("the server's checkpoint: %w", err)
	}
	recs, err := a.listReceipts("", tree.Size)
	if err != nil {
		return err
	}
	if err := a.writeFile(*out, func(w io.Writer) error { return receiptexport.Write(w, recs, tree.Size) }); err != nil {
		return fmt.Errorf("-out: %w", err)
	}
	if err := os.WriteFile(*cpFile, signed, 0o644); err != nil {
		return fmt.Errorf("-checkpoint: %w", err)
	}
	if *out != "-" {
		fmt.Fprintf(a.stderr, "exported %d receipts to %s, checkpoint (size %d) to %s; check them with: nodelanectl receipts verify -key KEY -checkpoint %s %s\n",
			tree.Size, *out, tree.Size, *cpFile, *cpFile, *out)
	}
	return nil
}

// errInvalid is an export that does not verify, or a cost check that
// fails.
var errInvalid = errors.New("check failed")

func receiptsVerify(a *app, args []string) error {
	fs := a.flags("receipts verify", "RECEIPTS_FILE (- for standard input)")
	key := fs.String("key", "", "the log's note verifier key, receipt_public_key (default: the config file's)")
	origin := fs.String("origin", receipts.DefaultOrigin, "the log's checkpoint origin")
	cpFile := fs.String("checkpoint", "", "the signed checkpoint `file` (required)")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	if *cpFile == "" {
		return usagef("receipts verify: -checkpoint is required")
	}
	if *key == "" {
		// Offline: only the config file, no server.
		s, err := a.settings()
		if err != nil {
			return err
		}
		if *key = s.receiptKey; *key == "" {
			return usagef("receipts verify: -key is required (or receipt_public_key in the config file)")
		}
	}
	signed, err := os.ReadFile(*cpFile)
	if err != nil {
		return fmt.Errorf("-checkpoint: %w", err)
	}
	var in io.Reader = os.Stdin
	if name := a.arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	cp, err := receiptexport.Verify(in, signed, *key, *origin)
	var re *receiptexport.ReadError
	switch {
	case errors.As(err, &re):
		return err
	case err != nil:
		return fmt.Errorf("%w: the export does not verify: %v", errInvalid, err)
	}
	if a.raw() {
		b, err := json.Marshal(map[string]any{"ok": true, "origin": cp.Origin, "size": cp.Size, "root": cp.Root.String()})
		if err != nil {
			return err
		}
		return a.printRaw(b)
	}
	fmt.Fprintf(a.stdout, "ok: %d receipts of %s verified against the checkpoint of %d, root %s\n", cp.Size, cp.Origin, cp.Size, cp.Root)
	return nil
}

// sumUnbilled sums the GPU time (actual_ms × gpu_count) of the sequenced
// receipts of uncharged attempts minted in [from, to): every job_failed,
// and every job_completed whose charged is "no".
func (a *app) sumUnbilled(from, to time.Time) (attempts, gpuMS int64, err error) {
	for _, kind := range []receipts.Kind{receipts.KindJobFailed, receipts.KindJobCompleted} {
		recs, err := a.listReceipts(kind, -1)
		if err != nil {
			return 0, 0, err
		}
		for _, w := range recs {
			if w.Kind != kind {
				continue // a server that ignores kind= lists them all
			}
			r, err := receipts.Decode(w.Body)
			if err != nil {
				return 0, 0, fmt.Errorf("receipt %s: %w", w.ID, err)
			}
			if r.ServerTime.Before(from) || !r.ServerTime.Before(to) || (kind == receipts.KindJobCompleted && r.Charged != receipts.ChargedNo) {
				continue
			}
			attempts++
			gpuMS += r.ActualMS * r.GPUCount
		}
	}
	return attempts, gpuMS, nil
}

// receiptSum is what the job_charged receipts of a window sum to,
// counted here.
type receiptSum struct {
	Receipts     int64 `json:"receipts"`
	Jobs         int64 `json:"jobs"`
	ActualMS     int64 `json:"actual_ms"`
	CostMicroUSD int64 `json:"cost_micro_usd"`
}

// sumCharged sums the sequenced job_charged receipts minted in [from, to).
func (a *app) sumCharged(from, to time.Time) (*receiptSum, error) {
	recs, err := a.listReceipts(receipts.KindJobCharged, -1)
	if err != nil {
		return nil, err
	}
	var s receiptSum
	jobs := map[string]bool{}
	for _, w := range recs {
		if w.Kind != receipts.KindJobCharged {
			continue // a server that ignores kind= lists them all
		}
		r, err := receipts.Decode(w.Body)
		if err != nil {
			return nil, fmt.Errorf("receipt %s: %w", w.ID, err)
		}
		if r.Kind != receipts.KindJobCharged || r.ServerTime.Before(from) || !r.ServerTime.Before(to) {
			continue
		}
		s.Receipts++
		s.ActualMS += r.ActualMS
		s.CostMicroUSD += r.CostMicros
		if !jobs[r.JobID] {
			jobs[r.JobID] = true
			s.Jobs++
		}
	}
	return &s, nil
}

// The grouping cost report accepts.
var costGroupings = []string{"sku", "worker", "job_type"}

func costReport(a *app, args []string) error {
	fs := a.flags("cost report", "")
	from := fs.String("from", "", "the window's start: RFC 3339, a date (2026-12-01, UTC) or an age (24h, 7d) (default: the start of the current UTC month)")
	to := fs.String("to", "", "the window's end, excluded, as -from (default: now)")
	by := fs.String("by", "sku", "group by sku, worker or job_type")
	noCheck := fs.Bool("no-check", false, "skip checking the total against the job_charged receipts")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if !slices.Contains(costGroupings, *by) {
		return usagef("cost report: -by %q: want one of %v", *by, costGroupings)
	}
	q := operator.CostQuery{GroupBy: *by}
	for _, t := range []struct {
		flag, val string
		dst       *time.Time
	}{{"-from", *from, &q.From}, {"-to", *to, &q.To}} {
		if t.val == "" {
			continue
		}
		var err error
		if *t.dst, err = wire.ParseWhen(t.val, a.now()); err != nil {
			return usagef("cost report: %s: %v", t.flag, err)
		}
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	ctx, raw := a.keepAnswer()
	rep, err := api.Costs(ctx, q)
	if err != nil {
		return err
	}
	b := raw.Bytes()
	// A server older than the unbilled report answers none: there is
	// nothing of it to show or check.
	var has struct {
		Unbilled *struct{} `json:"unbilled"`
	}
	var unbilled *wire.Unbilled
	if json.Unmarshal(b, &has) == nil && has.Unbilled != nil {
		unbilled = &rep.Unbilled
	}
	var (
		sum                      *receiptSum
		unbilledN, unbilledGPUMS int64
	)
	if !*noCheck {
		// The receipts of the window may still be sequencing: look again
		// a few times before calling a difference a failure.
		for attempt := 0; ; attempt++ {
			if sum, err = a.sumCharged(rep.From, rep.To); err != nil {
				return err
			}
			same := sum.CostMicroUSD == rep.Total.CostMicroUSD && sum.ActualMS == rep.Total.ActualMS
			if unbilled != nil {
				if unbilledN, unbilledGPUMS, err = a.sumUnbilled(rep.From, rep.To); err != nil {
					return err
				}
				same = same && unbilledN == unbilled.Total.Attempts && unbilledGPUMS == unbilled.Total.GPUMS
			}
			if same || attempt == 4 {
				break
			}
			select {
			case <-a.ctx.Done():
				return a.ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	if a.raw() {
		if err := a.printRaw(b); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "cost from %s to %s by %s\n", tstr(rep.From), tstr(rep.To), rep.GroupBy)
		t := newTable(a.stdout)
		t.row(string(bytes.ToUpper([]byte(rep.GroupBy))), "JOBS", "ACTUAL_MS", "GPU_HOURS", "COST_USD")
		for _, g := range rep.Groups {
			t.row(orDash(g.Key), strconv.FormatInt(g.Jobs, 10), strconv.FormatInt(g.ActualMS, 10), g.GPUHours, g.CostUSD)
		}
		t.row("TOTAL", strconv.FormatInt(rep.Total.Jobs, 10), strconv.FormatInt(rep.Total.ActualMS, 10), rep.Total.GPUHours, rep.Total.CostUSD)
		t.flush()
		if u := unbilled; u != nil {
			fmt.Fprintf(a.stdout, "\nunbilled GPU time by reason (attempts that ended uncharged)\n")
			t := newTable(a.stdout)
			t.row("REASON", "ATTEMPTS", "GPU_MS", "GPU_HOURS")
			for _, g := range u.Groups {
				t.row(orDash(g.Reason), strconv.FormatInt(g.Attempts, 10), strconv.FormatInt(g.GPUMS, 10), g.GPUHours)
			}
			t.row("TOTAL", strconv.FormatInt(u.Total.Attempts, 10), strconv.FormatInt(u.Total.GPUMS, 10), u.Total.GPUHours)
			t.flush()
		}
	}
	if sum == nil {
		return nil
	}
	if sum.CostMicroUSD != rep.Total.CostMicroUSD || sum.ActualMS != rep.Total.ActualMS {
		return fmt.Errorf("%w: the report's total is %s USD (%d micro-USD) over %d ms, the job_charged receipts of the window sum to %s USD (%d micro-USD) over %d ms in %d receipts",
			errInvalid, receipts.FormatMicros(rep.Total.CostMicroUSD), rep.Total.CostMicroUSD, rep.Total.ActualMS,
			receipts.FormatMicros(sum.CostMicroUSD), sum.CostMicroUSD, sum.ActualMS, sum.Receipts)
	}
	if u := unbilled; u != nil && (unbilledN != u.Total.Attempts || unbilledGPUMS != u.Total.GPUMS) {
		return fmt.Errorf("%w: the report's unbilled total is %d attempts of %d GPU-ms, the receipts of uncharged attempts of the window sum to %d of %d GPU-ms",
			errInvalid, u.Total.Attempts, u.Total.GPUMS, unbilledN, unbilledGPUMS)
	}
	// The check goes to standard error, so that -o json stays the API's.
	fmt.Fprintf(a.stderr, "check: the %d job_charged receipts of the window sum to %s USD (%d micro-USD), as the report\n",
		sum.Receipts, receipts.FormatMicros(sum.CostMicroUSD), sum.CostMicroUSD)
	if unbilled != nil {
		fmt.Fprintf(a.stderr, "check: the %d receipts of uncharged attempts of the window sum to %d GPU-ms, as the report\n", unbilledN, unbilledGPUMS)
	}
	return nil
}
