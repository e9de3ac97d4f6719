package main

import (
	"context"
	"encoding/json"
	"flag"
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
	w := waitFlags(fs, "follow the job until it ends; the exit status is its end (0 succeeded, 6 failed, 7 canceled)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := w.check("jobs submit"); err != nil {
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
	if w.on() {
		// The job as it ends is the answer, not the dispatch's.
		api, err := a.client()
		if err != nil {
			return err
		}
		out, err := api.Dispatch(a.ctx, req)
		if err != nil {
			return err
		}
		a.printDispatched(out)
		if !out.Leasable {
			// It may wait for good: say why.
			fmt.Fprintf(a.stderr, "nodelanectl: no worker can take job %s now (%s); waiting for it to end\n",
				escapeText(out.Job.ID, false), escapeText(out.Reason, false))
		}
		return a.waitJob(out.Job.ID, w)
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.DispatchResponse, error) {
		return api.Dispatch(ctx, req)
	})
	if out == nil || err != nil {
		return err
	}
	a.printDispatched(out)
	return nil
}

// printDispatched prints a dispatch's answer as a table, or its id with
// -q; nothing with -o json or yaml.
func (a *app) printDispatched(out *wire.DispatchResponse) {
	switch {
	case a.common.quiet:
		fmt.Fprintln(a.stdout, escapeText(out.Job.ID, false))
	case !a.raw():
		t := newTable(a.stdout)
		if !a.common.noHeaders {
			t.row("ID", "TYPE", "STATE", "LEASABLE", "REASON")
		}
		t.row(out.Job.ID, out.Job.JobType, out.Job.State, strconv.FormatBool(out.Leasable), orDash(out.Reason))
		t.flush()
	}
}

func jobsList(a *app, args []string) error {
	fs := a.flags("jobs list", "")
	state := fs.String("state", "", "only jobs in this state (queued, leased, running, succeeded, failed, canceled)")
	jobType := fs.String("type", "", "only jobs of this type")
	worker := fs.String("worker", "", "only jobs of this worker id")
	tag := fs.String("tag", "", "only jobs requiring this tag")
	after := fs.String("after", "", "list jobs after this id (the answer's next)")
	limit := fs.Int("limit", 100, "jobs a page, 1 to 1000")
	order := orderFlag(fs)
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("jobs list", *limit); err != nil {
		return err
	}
	if err := checkOrder("jobs list", *order); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.JobListResponse, error) {
		return api.ListJobs(ctx, operator.JobQuery{State: *state, JobType: *jobType, WorkerID: *worker, Tag: *tag, After: *after, Limit: *limit, Order: *order})
	})
	if out == nil || err != nil {
		return err
	}
	printList(a, jobCols, out.Jobs, func(j wire.OperatorJob) string { return j.ID }, derefStr(out.Next))
	return nil
}

// jobCols are the columns of jobs list.
var jobCols = []col[wire.OperatorJob]{
	{name: "ID", cell: func(j wire.OperatorJob) string { return j.ID }},
	{name: "TYPE", cell: func(j wire.OperatorJob) string { return j.JobType }},
	{name: "STATE", cell: func(j wire.OperatorJob) string { return j.State }},
	{name: "ATTEMPT", cell: func(j wire.OperatorJob) string { return fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts) }},
	{name: "WORKER", cell: func(j wire.OperatorJob) string { return strp(j.WorkerID) }},
	{name: "CREATED", cell: func(j wire.OperatorJob) string { return tstr(j.CreatedAt) }},
	{name: "COST_USD", cell: func(j wire.OperatorJob) string { return strp(j.ActualCostUSD) }},
	{name: "PRIORITY", wide: true, cell: func(j wire.OperatorJob) string { return strconv.Itoa(j.Priority) }},
	{name: "GPUS", wide: true, cell: func(j wire.OperatorJob) string {
		r := j.Requirements
		if r.GPUCount == 0 && r.GPUSKU == "" {
			return "-"
		}
		return fmt.Sprintf("%d×%s", max(r.GPUCount, 1), orDash(r.GPUSKU))
	}},
	{name: "TAGS", wide: true, cell: func(j wire.OperatorJob) string { return orDash(strings.Join(j.Requirements.Tags, ",")) }},
	{name: "FINISHED", wide: true, cell: func(j wire.OperatorJob) string { return timep(j.FinishedAt) }},
	{name: "RUNTIME_MS", wide: true, cell: func(j wire.OperatorJob) string {
		if j.ActualMS == nil {
			return "-"
		}
		return strconv.FormatInt(*j.ActualMS, 10)
	}},
	{name: "LAST_ERROR", wide: true, cell: func(j wire.OperatorJob) string {
		if j.LastError == nil {
			return "-"
		}
		return j.LastError.Code
	}},
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
	if a.common.quiet {
		fmt.Fprintln(a.stdout, escapeText(out.Job.ID, false))
		return nil
	}
	t := newTable(a.stdout)
	if !a.common.noHeaders {
		t.row("ID", "STATE", "CANCEL_REQUESTED")
	}
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
	follow := fs.Bool("follow", false, "poll for new events until the job ends (or SIGINT), then print its final state to standard error")
	fs.BoolVar(follow, "f", false, "short for -follow")
	exitStatus := fs.Bool("exit-status", false, "follow, and exit with the job's end: 0 succeeded, 6 failed, 7 canceled")
	interval := fs.Duration("interval", time.Second, "how often -follow polls, 100ms to 1m")
	timeout := fs.Duration("timeout", 0, "with -follow, give up after this long (exit status 8; 0: never)")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	w := &waitOpts{wait: *follow || *exitStatus, interval: *interval, timeout: *timeout}
	if err := w.check("jobs logs"); err != nil {
		return err
	}
	d, err := a.follow(a.arg(0), true, w)
	if err != nil || !w.wait {
		return err
	}
	a.reportEnd(a.stderr, d)
	if *exitStatus {
		return endError(d)
	}
	return nil
}

// waitOpts are the flags of a command that may follow a job until it
// ends.
type waitOpts struct {
	wait              bool
	interval, timeout time.Duration
}

// waitFlags defines -wait (usage: its help), -exit-status (the same),
// -interval and -timeout.
func waitFlags(fs *flag.FlagSet, usage string) *waitOpts {
	w := &waitOpts{}
	fs.BoolVar(&w.wait, "wait", false, usage)
	fs.BoolVar(&w.wait, "exit-status", false, "the same as -wait")
	fs.DurationVar(&w.interval, "interval", time.Second, "how often -wait polls the job, 100ms to 1m")
	fs.DurationVar(&w.timeout, "timeout", 0, "with -wait, give up after this long (exit status 8; the job goes on; 0: never)")
	return w
}

func (w *waitOpts) on() bool { return w.wait }

// check refuses an -interval or a -timeout out of bounds.
func (w *waitOpts) check(cmd string) error {
	if w.interval < minFollowInterval || w.interval > maxFollowInterval {
		return usagef("%s: -interval %v is outside %v to %v", cmd, w.interval, minFollowInterval, maxFollowInterval)
	}
	if w.timeout < 0 {
		return usagef("%s: -timeout %v is negative", cmd, w.timeout)
	}
	return nil
}

// waitJob follows job id until it ends, then prints it: with -o json or
// yaml the job as GET /operator/jobs/{id} answers then, else (but with
// -q) a line of its end. Its error is the job's end: nil when it
// succeeded, a *jobEndError when not.
func (a *app) waitJob(id string, w *waitOpts) error {
	d, err := a.follow(id, false, w)
	if err != nil {
		return err
	}
	switch {
	case a.raw():
		api, err := a.client()
		if err != nil {
			return err
		}
		ctx, raw := a.keepAnswer()
		if _, err := api.Job(ctx, id, 0); err != nil {
			return err
		}
		if err := a.printRaw(raw.Bytes()); err != nil {
			return err
		}
	case !a.common.quiet:
		a.reportEnd(a.stdout, d)
	}
	return endError(d)
}

// endError is nil for a job that succeeded, a *jobEndError for one that
// ended otherwise.
func endError(d *wire.JobDetailResponse) error {
	if d.Job.State == "succeeded" {
		return nil
	}
	return &jobEndError{ID: d.Job.ID, State: d.Job.State, LastError: d.Job.LastError}
}

// reportEnd writes a line of how a job ended.
func (a *app) reportEnd(w io.Writer, d *wire.JobDetailResponse) {
	j := d.Job
	line := fmt.Sprintf("job %s %s after attempt %d of %d", j.ID, j.State, j.Attempt, j.MaxAttempts)
	if j.ActualMS != nil {
		line += fmt.Sprintf(", %d ms", *j.ActualMS)
	}
	if j.ActualCostUSD != nil {
		line += ", " + *j.ActualCostUSD + " USD"
	}
	if j.LastError != nil && j.State != "succeeded" {
		line += ": " + j.LastError.Code + ": " + j.LastError.Message
	}
	fmt.Fprintln(w, escapeText(line, false))
}

// follow reads job id's events, printing them when print (a line each,
// or with -o json a JSON line, with -o yaml a YAML sequence item), and
// with w.wait polls every w.interval until the job ends, for w.timeout
// at most (errWaitTimeout). It returns the job as last read.
func (a *app) follow(id string, print bool, w *waitOpts) (*wire.JobDetailResponse, error) {
	api, err := a.client()
	if err != nil {
		return nil, err
	}
	var deadline <-chan time.Time
	if w.wait && w.timeout > 0 {
		t := time.NewTimer(w.timeout)
		defer t.Stop()
		deadline = t.C
	}
	var after int64
	for {
		d, err := api.Job(a.ctx, id, after)
		if err != nil {
			return nil, err
		}
		for _, e := range d.Events {
			if print {
				if err := a.printEvent(e); err != nil {
					return nil, err
				}
			}
			after = e.ID
		}
		if d.EventsNext != nil {
			after = *d.EventsNext
			continue
		}
		if !w.wait || ended(d.Job.State) {
			return d, nil
		}
		select {
		case <-a.ctx.Done():
			return nil, a.ctx.Err()
		case <-deadline:
			return nil, fmt.Errorf("%w: job %s is still %s after %v", errWaitTimeout, id, d.Job.State, w.timeout)
		case <-time.After(w.interval):
		}
	}
}

// printEvent prints one event of jobs logs.
func (a *app) printEvent(e wire.JobEventView) error {
	switch a.common.output {
	case outJSON, outYAML:
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if a.common.output == outJSON {
			return a.printJSON(safeJSON(b))
		}
		y, err := yamlItem(b)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(y)
		return err
	}
	what := "log"
	if e.EventType != nil {
		what = *e.EventType
	}
	// One event is one line: a newline in a message is shown as \n, so
	// that no message can pass for another event.
	_, err := fmt.Fprintf(a.stdout, "%s  %-10s %s\n", e.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z"),
		escapeText(what, false), escapeText(strings.TrimRight(e.Message, "\n"), true))
	return err
}

func jobsRetry(a *app, args []string) error {
	fs := a.flags("jobs retry", "JOB_ID")
	reason := fs.String("reason", "", "the reason, recorded in the receipt (at most 1 KiB)")
	w := waitFlags(fs, "follow the job until it ends again; the exit status is its end (0 succeeded, 6 failed, 7 canceled)")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	if err := w.check("jobs retry"); err != nil {
		return err
	}
	if len(*reason) > wire.MaxReasonBytes {
		return usagef("jobs retry: -reason is %d bytes, over %d", len(*reason), wire.MaxReasonBytes)
	}
	call := func(ctx context.Context, api *operator.Client) (*wire.OperatorJobResponse, error) {
		return api.RetryJob(ctx, a.arg(0), *reason)
	}
	var out *wire.OperatorJobResponse
	var err error
	if w.on() {
		// The job as it ends is the answer, not the retry's.
		api, cerr := a.client()
		if cerr != nil {
			return cerr
		}
		out, err = call(a.ctx, api)
	} else {
		out, err = ask(a, call)
	}
	if out == nil || err != nil {
		return err
	}
	switch {
	case a.common.quiet:
		fmt.Fprintln(a.stdout, escapeText(out.Job.ID, false))
	case !a.raw():
		t := newTable(a.stdout)
		if !a.common.noHeaders {
			t.row("ID", "TYPE", "STATE", "ATTEMPT", "RECEIPT")
		}
		t.row(out.Job.ID, out.Job.JobType, out.Job.State, fmt.Sprintf("%d/%d", out.Job.Attempt, out.Job.MaxAttempts), strp(out.ReceiptID))
		t.flush()
	}
	if w.on() {
		return a.waitJob(out.Job.ID, w)
	}
	return nil
}
