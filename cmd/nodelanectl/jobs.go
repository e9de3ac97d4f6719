package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table {
	return &table{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		// A cell is one line, and a tab would break the columns; nothing
		// in it reaches the terminal as a control (escapeText).
		cells[i] = escapeText(strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(c), false)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { t.tw.Flush() }

// Helpers for table cells.
func strp(p *string) string {
	if p == nil {
		return "-"
	}
	return *p
}

func timep(p *time.Time) string {
	if p == nil {
		return "-"
	}
	return p.UTC().Format(time.RFC3339)
}

func tstr(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stringList is a repeatable flag; a value may also hold several,
// comma-separated.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func jobsSubmit(a *app, args []string) error {
	fs := a.flags("jobs submit", "")
	jobType := fs.String("type", "", "the job type (required)")
	payload := fs.String("payload", "", "the payload, a JSON object")
	payloadFile := fs.String("payload-file", "", "read the payload from `file` (- for standard input)")
	sku := fs.String("gpu-sku", "", "the GPU SKU required")
	gpus := fs.Int("gpu-count", 0, "the GPUs required")
	vram := fs.Int("min-vram-mb", 0, "the VRAM per GPU required, in MB")
	maxRuntime := fs.Duration("max-runtime", 0, "the runtime cap of one attempt (0: the server's default)")
	var tags stringList
	fs.Var(&tags, "tag", "a tag the worker must have (repeatable)")
	priority := fs.Int("priority", 0, "the priority, higher first")
	attempts := fs.Int("max-attempts", 0, "the attempts allowed (0: the server's default, 3)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *jobType == "" {
		return usagef("jobs submit: -type is required")
	}
	if *payload != "" && *payloadFile != "" {
		return usagef("jobs submit: give -payload or -payload-file, not both")
	}
	if *maxRuntime < 0 || *maxRuntime%time.Second != 0 {
		return usagef("jobs submit: -max-runtime %v is not a whole number of seconds", *maxRuntime)
	}
	body := []byte(*payload)
	if *payloadFile != "" {
		var err error
		if *payloadFile == "-" {
			body, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		} else {
			body, err = os.ReadFile(*payloadFile)
		}
		if err != nil {
			return fmt.Errorf("-payload-file: %w", err)
		}
	}
	if len(body) == 0 {
		body = []byte("{}")
	}
	if !json.Valid(body) {
		return usagef("jobs submit: the payload is not JSON")
	}
	req := wire.DispatchRequest{JobType: *jobType, Payload: body, Priority: *priority, MaxAttempts: *attempts,
		Requirements: wire.Requirements{GPUSKU: *sku, GPUCount: *gpus, MinVRAMMB: *vram,
			MaxRuntimeSeconds: int(*maxRuntime / time.Second), Tags: tags}}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.DispatchResponse, error) {
		return api.Dispatch(ctx, req)
	})
	if out == nil || err != nil {
		return err
	}
	t := newTable(a.stdout)
	t.row("ID", "TYPE", "STATE", "LEASABLE", "REASON")
	t.row(out.Job.ID, out.Job.JobType, out.Job.State, strconv.FormatBool(out.Leasable), orDash(out.Reason))
	t.flush()
	return nil
}

func jobsList(a *app, args []string) error {
	fs := a.flags("jobs list", "")
	state := fs.String("state", "", "only jobs in this state (queued, leased, running, succeeded, failed, canceled)")
	jobType := fs.String("type", "", "only jobs of this type")
	worker := fs.String("worker", "", "only jobs of this worker id")
	tag := fs.String("tag", "", "only jobs requiring this tag")
	after := fs.String("after", "", "list jobs after this id (the answer's next)")
	limit := fs.Int("limit", 100, "jobs a page, 1 to 1000")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("jobs list", *limit); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.JobListResponse, error) {
		return api.ListJobs(ctx, operator.JobQuery{State: *state, JobType: *jobType, WorkerID: *worker, Tag: *tag, After: *after, Limit: *limit})
	})
	if out == nil || err != nil {
		return err
	}
	t := newTable(a.stdout)
	t.row("ID", "TYPE", "STATE", "ATTEMPT", "WORKER", "CREATED", "COST_USD")
	for _, j := range out.Jobs {
		t.row(j.ID, j.JobType, j.State, fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts), strp(j.WorkerID), tstr(j.CreatedAt), strp(j.ActualCostUSD))
	}
	t.flush()
	if out.Next != nil {
		fmt.Fprintf(a.stdout, "more: -after %s\n", *out.Next)
	}
	return nil
}

// checkLimit refuses a page size -limit outside 1 to 1,000, the API's
// bounds (the client would send 0 as no limit at all).
func checkLimit(cmd string, n int) error {
	if n < 1 || n > 1000 {
		return usagef("%s: -limit %d is outside 1 to 1000", cmd, n)
	}
	return nil
}

func jobsShow(a *app, args []string) error {
	fs := a.flags("jobs show", "JOB_ID")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	d, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.JobDetailResponse, error) {
		return api.Job(ctx, a.arg(0), 0)
	})
	if d == nil || err != nil {
		return err
	}
	j := d.Job
	t := newTable(a.stdout)
	t.row("id", j.ID)
	t.row("type", j.JobType)
	t.row("state", j.State)
	if j.State == "queued" {
		t.row("leasable", strconv.FormatBool(d.Leasable)+" "+d.Reason)
	}
	t.row("attempt", fmt.Sprintf("%d of %d", j.Attempt, j.MaxAttempts))
	t.row("priority", strconv.Itoa(j.Priority))
	r := j.Requirements
	t.row("requirements", fmt.Sprintf("gpu_sku=%s gpu_count=%d min_vram_mb=%d max_runtime_seconds=%d tags=%s",
		orDash(r.GPUSKU), r.GPUCount, r.MinVRAMMB, r.MaxRuntimeSeconds, orDash(strings.Join(r.Tags, ","))))
	t.row("worker", strp(j.WorkerID))
	t.row("created", tstr(j.CreatedAt))
	t.row("accepted", timep(j.AcceptedAt))
	t.row("finished", timep(j.FinishedAt))
	t.row("cancel_requested", strconv.FormatBool(j.CancelRequested))
	if j.LastError != nil {
		t.row("last_error", j.LastError.Code+": "+j.LastError.Message)
	}
	t.row("receipt", strp(j.ReceiptID))
	if j.ActualMS != nil {
		t.row("actual_ms", strconv.FormatInt(*j.ActualMS, 10))
	}
	if j.ActualCostUSD != nil {
		t.row("cost_usd", *j.ActualCostUSD)
	}
	if d.Result != nil {
		t.row("output_uri", strp(d.Result.OutputURI))
		if len(d.Result.Metrics) > 0 && string(d.Result.Metrics) != "null" {
			t.row("metrics", string(d.Result.Metrics))
		}
	}
	t.row("events", strconv.Itoa(len(d.Events)))
	t.flush()
	if len(d.Artifacts) > 0 {
		fmt.Fprintln(a.stdout)
		t = newTable(a.stdout)
		t.row("ARTIFACT", "TYPE", "STATUS", "SIZE", "BYTES", "URI")
		for _, x := range d.Artifacts {
			bytes := "metadata"
			if x.Stored {
				bytes = "stored"
			}
			t.row(x.ArtifactID, x.ArtifactType, x.Status, strconv.FormatInt(x.SizeBytes, 10), bytes, x.URI)
		}
		t.flush()
	}
	return nil
}

func jobsCancel(a *app, args []string) error {
	fs := a.flags("jobs cancel", "JOB_ID")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.OperatorJobResponse, error) {
		return api.CancelJob(ctx, a.arg(0))
	})
	if out == nil || err != nil {
		return err
	}
	t := newTable(a.stdout)
	t.row("ID", "STATE", "CANCEL_REQUESTED")
	t.row(out.Job.ID, out.Job.State, strconv.FormatBool(out.Job.CancelRequested))
	t.flush()
	return nil
}

// The bounds of jobs logs -interval.
const (
	minFollowInterval = 100 * time.Millisecond
	maxFollowInterval = time.Minute
)

// ended reports whether a job's state is final.
func ended(state string) bool {
	return state == "succeeded" || state == "failed" || state == "canceled"
}

func jobsLogs(a *app, args []string) error {
	fs := a.flags("jobs logs", "JOB_ID")
	follow := fs.Bool("follow", false, "poll for new events until the job ends (or SIGINT)")
	fs.BoolVar(follow, "f", false, "short for -follow")
	interval := fs.Duration("interval", time.Second, "how often -follow polls, 100ms to 1m")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	if *interval < minFollowInterval || *interval > maxFollowInterval {
		return usagef("jobs logs: -interval %v is outside %v to %v", *interval, minFollowInterval, maxFollowInterval)
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	id := a.arg(0)
	var after int64
	enc := json.NewEncoder(a.stdout)
	for {
		d, err := api.Job(a.ctx, id, after)
		if err != nil {
			return err
		}
		for _, e := range d.Events {
			if a.json() {
				if err := enc.Encode(e); err != nil {
					return err
				}
			} else {
				what := "log"
				if e.EventType != nil {
					what = *e.EventType
				}
				// One event is one line: a newline in a message is shown
				// as \n, so that no message can pass for another event.
				fmt.Fprintf(a.stdout, "%s  %-10s %s\n", e.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z"),
					escapeText(what, false), escapeText(strings.TrimRight(e.Message, "\n"), true))
			}
			after = e.ID
		}
		if d.EventsNext != nil {
			after = *d.EventsNext
			continue
		}
		if !*follow || ended(d.Job.State) {
			return nil
		}
		select {
		case <-a.ctx.Done():
			return a.ctx.Err()
		case <-time.After(*interval):
		}
	}
}
