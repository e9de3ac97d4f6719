package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Bounds of what one page reads from the API, so that a page's cost does
// not grow with the control plane's history.
const (
	// MaxCounted is the most jobs of one state, and workers, the overview
	// counts; beyond it, it shows the count as a lower bound.
	MaxCounted = 5000
	// RecentReceipts is how many of the latest receipts the overview (for
	// jobs/s), the envelope's history and a job's receipts look through.
	RecentReceipts = 5000
	// PageSize is the rows of a list page.
	PageSize = 100
)

// pageData is what every template gets.
type pageData struct {
	Title    string
	Base     string
	Nav      string
	Flashes  []flash
	SignedIn bool
	// Scopes are the signed-in token's operator scopes: the nav links
	// only the pages they allow.
	Scopes []string
	Now    time.Time
	// Data is the page's own.
	Data any
}

// funcs are the templates' functions; now is the clock relative times
// are counted from.
func funcs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"when":  func(t any) template.HTML { return when(now(), t) },
		"exact": exact,
		"dur":   dur,
		"deref": func(p any) string {
			switch v := p.(type) {
			case *string:
				if v == nil {
					return "—"
				}
				return *v
			case *int64:
				if v == nil {
					return "—"
				}
				return strconv.FormatInt(*v, 10)
			}
			return fmt.Sprint(p)
		},
		"pretty": pretty,
		"join":   strings.Join,
		"has":    slices.Contains[[]string],
		"states": func() []string { return jobStates },
		"path":   url.PathEscape,
		"query":  url.QueryEscape,
		"ended":  ended,
		"size":   humanBytes,
	}
}

// ended reports whether a job in state has ended.
func ended(state string) bool {
	return state == "succeeded" || state == "failed" || state == "canceled"
}

// timeOf is t as a time, nil for none (a nil or zero time).
func timeOf(t any) *time.Time {
	switch v := t.(type) {
	case time.Time:
		if !v.IsZero() {
			return &v
		}
	case *time.Time:
		if v != nil && !v.IsZero() {
			return v
		}
	}
	return nil
}

// exact is t to the second in UTC, "—" for none.
func exact(t any) string {
	if v := timeOf(t); v != nil {
		return v.UTC().Format("2006-01-02 15:04:05Z")
	}
	return "—"
}

// when renders t as a <time> element: relative to now ("5 min ago",
// "in 2 h"), with the exact UTC time as its datetime and on hover.
func when(now time.Time, t any) template.HTML {
	v := timeOf(t)
	if v == nil {
		return "—"
	}
	return template.HTML(`<time datetime="` + v.UTC().Format(time.RFC3339) + `" title="` + exact(v) + `">` +
		template.HTMLEscapeString(relative(now, *v)) + `</time>`)
}

// relative is t as an operator reads it next to now: seconds, minutes,
// hours or days ago (or ahead); past 30 days, the date.
func relative(now, t time.Time) string {
	d := now.Sub(t)
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < 5*time.Second:
		return "just now"
	case d < time.Minute:
		s = strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		s = strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		s = strconv.Itoa(int(d/time.Hour)) + " h"
	case d < 30*24*time.Hour:
		s = strconv.Itoa(int(d/(24*time.Hour))) + " d"
	default:
		return t.UTC().Format("2006-01-02")
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// dur is the time from a to b (b nil: until now is not known here, so
// "—"), as "850 ms", "42 s", "3 min 5 s", "2 h 10 min" or "3 d 4 h".
func dur(a, b any) string {
	from, to := timeOf(a), timeOf(b)
	if from == nil || to == nil || to.Before(*from) {
		return "—"
	}
	return formatDur(to.Sub(*from))
}

// formatDur is d as dur writes it.
func formatDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%d d %d h", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// pretty indents a JSON value for reading, "" for none. It writes <, >
// and & as themselves, not \u003c escapes: html/template escapes the text
// for the page.
func pretty(b json.RawMessage) string {
	if len(b) == 0 || string(b) == "null" {
		return ""
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if enc.Encode(v) != nil {
		return string(b)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

var pageNames = []string{"signin", "error", "overview", "workers", "worker", "jobs", "job", "envelope", "receipts", "receipt", "credentials"}

func parsePages(now func() time.Time) (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs(now)).ParseFS(templateFS, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

// render writes page name with pd; s, when set, gives the flashes.
func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, name string, s *session, pd *pageData) {
	pd.Base = c.base(r)
	pd.Now = c.cfg.Now().UTC()
	if s != nil {
		pd.SignedIn = true
		pd.Scopes = s.scopes
		pd.Flashes = append(c.sessions.pop(s), pd.Flashes...)
	}
	if pd.Nav == "" {
		pd.Nav = name
	}
	var buf strings.Builder
	if err := c.pages[name].ExecuteTemplate(&buf, "layout", pd); err != nil {
		http.Error(w, "console: rendering "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(buf.String()))
}

func (c *Console) renderError(w http.ResponseWriter, r *http.Request, code int, msg string) {
	s := c.session(r)
	c.render(w, r, code, "error", s, &pageData{Title: http.StatusText(code), Data: msg, Flashes: []flash{{Error: true, Text: msg}}})
}

// act runs do, records its outcome as a flash and sends the browser to
// back (Post/Redirect/Get).
func (c *Console) act(w http.ResponseWriter, r *http.Request, s *session, back string, do func(ctx context.Context) (flash, error)) {
	c.actTo(w, r, s, &back, do)
}

// actTo is act where do may change where the browser goes.
func (c *Console) actTo(w http.ResponseWriter, r *http.Request, s *session, back *string, do func(ctx context.Context) (flash, error)) {
	f, err := do(r.Context())
	if err != nil {
		f = flash{Error: true, Text: explain(err)}
	}
	c.sessions.push(s, f)
	http.Redirect(w, r, c.base(r)+*back, http.StatusSeeOther)
}

// form parses a bounded form body.
func form(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("the form could not be read: %w", err)
	}
	return nil
}

// --- overview

// stateCounts is how many jobs are in each state, for one job type.
type stateCounts struct {
	Type   string
	Counts []int
}

type overviewData struct {
	States      []string
	Types       []stateCounts
	Totals      []int
	Capped      bool
	JobsErr     string
	Liveness    map[string]int
	Workers     int
	WorkersErr  string
	Rate        string
	RateErr     string
	SpendToday  *wire.CostReport
	SpendMonth  *wire.CostReport
	SpendErr    string
	Envelope    *wire.EnvelopeResponse
	EnvelopeErr string
	// Charts are the queue depth, throughput and spend over time;
	// ChartsErr says why the spend chart is missing.
	Charts    []chart
	ChartsErr string
	// Unpriced are the SKUs charged 0 USD for their GPU time this month.
	Unpriced []string
}

var jobStates = []string{"queued", "leased", "running", "succeeded", "failed", "canceled"}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	d := overviewData{States: jobStates, Liveness: map[string]int{}, Totals: make([]int, len(jobStates))}
	byType := map[string][]int{}
	var times []jobTimes
	for i, st := range jobStates {
		n := 0
		err := c.eachJob(ctx, s.token, operator.JobQuery{State: st, Order: wire.OrderDesc}, MaxCounted, func(j wire.OperatorJob) {
			times = append(times, jobTimes{state: j.State, created: j.CreatedAt, leased: j.LeasedAt, finished: j.FinishedAt})
			if byType[j.JobType] == nil {
				byType[j.JobType] = make([]int, len(jobStates))
			}
			byType[j.JobType][i]++
			n++
		})
		if err != nil {
			d.JobsErr = explain(err)
			break
		}
		d.Totals[i] = n
		if n >= MaxCounted {
			d.Capped = true
		}
	}
	for _, t := range sortedKeys(byType) {
		d.Types = append(d.Types, stateCounts{Type: t, Counts: byType[t]})
	}
	if err := c.eachWorker(ctx, s.token, MaxCounted, func(v wire.WorkerView) {
		d.Workers++
		d.Liveness[v.Liveness]++
	}); err != nil {
		d.WorkersErr = explain(err)
	}
	if rs, _, err := c.recent(ctx, s.token, 1000); err != nil {
		d.RateErr = explain(err)
	} else {
		// Jobs ended in the last minute, from their receipts.
		since := c.cfg.Now().Add(-time.Minute)
		n := 0
		for _, w := range rs {
			if w.Kind != receipts.KindJobCompleted && w.Kind != receipts.KindJobFailed {
				continue
			}
			rc, err := receipts.Decode(w.Body)
			if err != nil || rc.ServerTime.Before(since) || (rc.Kind == receipts.KindJobFailed && rc.Outcome == receipts.OutcomeRequeued) {
				continue
			}
			n++
		}
		d.Rate = strconv.FormatFloat(float64(n)/60, 'f', 2, 64)
	}
	now := c.cfg.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	api := c.op(s.token)
	if today, err := api.Costs(ctx, operator.CostQuery{From: day, To: now.Add(time.Second)}); err != nil {
		d.SpendErr = explain(err)
	} else if month, err := api.Costs(ctx, operator.CostQuery{}); err != nil {
		d.SpendErr = explain(err)
	} else {
		d.SpendToday, d.SpendMonth = today, month
		d.Unpriced = unpriced(month)
	}
	if d.JobsErr == "" {
		q, t := hourCharts(now, times)
		d.Charts = append(d.Charts, q, t)
	}
	if sp, err := c.spendChart(ctx, api); err != nil {
		d.ChartsErr = explain(err)
	} else {
		d.Charts = append(d.Charts, sp)
	}
	if env, err := api.Envelope(ctx); err != nil {
		d.EnvelopeErr = explain(err)
	} else {
		d.Envelope = env
	}
	c.render(w, r, http.StatusOK, "overview", s, &pageData{Title: "Overview", Data: d})
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// eachJob calls f for each job q lists, at most max (1 or more), and
// reads no page beyond the one that holds the last.
func (c *Console) eachJob(ctx context.Context, token string, q operator.JobQuery, max int, f func(wire.OperatorJob)) error {
	q.Limit = 1000
	n := 0
	for j, err := range c.op(token).Jobs(ctx, q) {
		if err != nil {
			return err
		}
		f(j)
		if n++; n == max {
			break
		}
	}
	return nil
}

// eachWorker calls f for each worker, at most max (1 or more).
func (c *Console) eachWorker(ctx context.Context, token string, max int, f func(wire.WorkerView)) error {
	n := 0
	for v, err := range c.op(token).Workers(ctx, operator.WorkerQuery{Limit: 1000}) {
		if err != nil {
			return err
		}
		f(v)
		if n++; n == max {
			break
		}
	}
	return nil
}

// checkpoint reads the current signed checkpoint and verifies it.
func (c *Console) checkpoint(ctx context.Context, token string) (*receipts.Checkpoint, error) {
	note, err := c.op(token).Checkpoint(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := receipts.OpenCheckpoint(note, c.cfg.VerifierKey, c.cfg.Origin)
	if err != nil {
		return nil, fmt.Errorf("the control plane's checkpoint does not verify with the configured key: %w", err)
	}
	return cp, nil
}

// recent returns the last n (at most RecentReceipts) receipts of the
// current checkpoint's tree, in index order, and the checkpoint.
func (c *Console) recent(ctx context.Context, token string, n int) ([]receipts.WireReceipt, *receipts.Checkpoint, error) {
	cp, err := c.checkpoint(ctx, token)
	if err != nil {
		return nil, nil, err
	}
	n = min(n, RecentReceipts)
	from := max(cp.Size-int64(n), 0)
	var out []receipts.WireReceipt
	if from >= cp.Size {
		return out, cp, nil
	}
	for w, err := range c.op(token).Receipts(ctx, operator.ReceiptQuery{From: from, Limit: 1000}) {
		if err != nil {
			return nil, nil, err
		}
		if w.Index == nil {
			continue
		}
		if *w.Index >= cp.Size {
			break // sequenced after the checkpoint
		}
		out = append(out, w)
	}
	return out, cp, nil
}

// --- workers

func (c *Console) workers(w http.ResponseWriter, r *http.Request, s *session) {
	page, err := c.op(s.token).ListWorkers(r.Context(), operator.WorkerQuery{After: r.URL.Query().Get("after"), Limit: PageSize, Order: wire.OrderDesc})
	if err != nil {
		c.render(w, r, status(err), "workers", s, &pageData{Title: "Workers", Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	c.render(w, r, http.StatusOK, "workers", s, &pageData{Title: "Workers", Data: page})
}

type workerData struct {
	wire.WorkerDetailResponse
	// Retired is the spec's "status":"retired".
	Retired    bool
	History    []wire.OperatorJob
	HistoryErr string
}

func (c *Console) worker(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	api := c.op(s.token)
	wd, err := api.Worker(r.Context(), id)
	if err != nil {
		c.render(w, r, status(err), "worker", s, &pageData{Title: "Worker " + id, Nav: "workers", Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	d := workerData{WorkerDetailResponse: *wd, Retired: wd.Worker.Status == "retired"}
	page, err := api.ListJobs(r.Context(), operator.JobQuery{WorkerID: id, Limit: PageSize, Order: wire.OrderDesc})
	if err != nil {
		d.HistoryErr = explain(err)
		page = &wire.JobListResponse{}
	}
	for _, j := range page.Jobs {
		// Kept only when the API filtered as asked.
		if j.WorkerID != nil && *j.WorkerID == id {
			d.History = append(d.History, j)
		}
	}
	c.render(w, r, http.StatusOK, "worker", s, &pageData{Title: "Worker " + d.Worker.Name, Nav: "workers", Data: d})
}

// fields splits a space- or comma-separated list.
func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' })
}

func (c *Console) workerAction(w http.ResponseWriter, r *http.Request, s *session) {
	id, action := r.PathValue("id"), r.PathValue("action")
	back := "/workers/" + url.PathEscape(id)
	c.act(w, r, s, back, func(ctx context.Context) (flash, error) {
		if err := form(w, r); err != nil {
			return flash{}, err
		}
		reason := r.PostForm.Get("reason")
		api := c.op(s.token)
		var (
			out *wire.WorkerResponse
			err error
		)
		switch action {
		case "ban":
			out, err = api.BanWorker(ctx, id, reason)
		case "unban":
			out, err = api.UnbanWorker(ctx, id, reason)
		case "retire":
			out, err = api.RetireWorker(ctx, id, reason)
		case "drain":
			out, err = api.DrainWorker(ctx, id)
		case "resume":
			out, err = api.ResumeWorker(ctx, id)
		case "approve":
			a := wire.ApproveRequest{Reason: reason}
			if t := fields(r.PostForm.Get("job_types")); len(t) > 0 {
				a.JobTypes = &t
			}
			if t := fields(r.PostForm.Get("tags")); len(t) > 0 {
				a.Tags = &t
			}
			out, err = api.ApproveWorker(ctx, id, a)
		default:
			return flash{}, fmt.Errorf("there is no worker action %q", action)
		}
		if err != nil {
			return flash{}, err
		}
		msg := fmt.Sprintf("Worker %s: %s done.", id, action)
		switch {
		case action == "drain" || action == "resume":
			// A drain request mints no receipt.
		case out.ReceiptID != nil:
			msg += " Receipt " + *out.ReceiptID + "."
		default:
			msg += " (Nothing changed.)"
		}
		return flash{Text: msg}, nil
	})
}

// --- jobs

type jobsData struct {
	State, Type, Worker, Tag string
	Jobs                     []wire.OperatorJob
	// FirstQuery (on a later page) and NextQuery are the query strings
	// of the newest page and of the next, older one.
	FirstQuery, NextQuery   string
	SafeTypes, BlockedTypes []string
	// Form is what the dispatch form shows: empty, or what was sent when
	// a dispatch failed.
	Form *dispatchForm
}

// dispatchForm is the dispatch form's input, kept when a dispatch fails.
type dispatchForm struct {
	JobType, Payload, GPUSKU, GPUCount, Tags, Priority, MaxAttempts string
	// PayloadErr says where the payload is not JSON; PayloadOffset is
	// the byte offset of the error in Payload, where the script puts the
	// cursor.
	PayloadErr    string
	PayloadOffset int64
}

func (c *Console) jobs(w http.ResponseWriter, r *http.Request, s *session) {
	c.jobsPage(w, r, s, http.StatusOK, &dispatchForm{Payload: "{}"}, nil)
}

// jobsPage renders the job list and the dispatch form holding form; fl,
// when set, is the flash of a failed dispatch, answered with code.
func (c *Console) jobsPage(w http.ResponseWriter, r *http.Request, s *session, code int, form *dispatchForm, fl *flash) {
	in := r.URL.Query()
	d := jobsData{State: in.Get("state"), Type: in.Get("job_type"), Worker: in.Get("worker_id"), Tag: in.Get("tag"), Form: form}
	pd := &pageData{Title: "Jobs", Data: &d}
	if fl != nil {
		pd.Flashes = append(pd.Flashes, *fl)
	}
	api := c.op(s.token)
	if env, err := api.Envelope(r.Context()); err == nil {
		d.SafeTypes, d.BlockedTypes = env.SafeTypes, env.BlockedTypes
	}
	page, err := api.ListJobs(r.Context(), operator.JobQuery{State: d.State, JobType: d.Type, WorkerID: d.Worker, Tag: d.Tag, After: in.Get("after"), Limit: PageSize, Order: wire.OrderDesc})
	if err != nil {
		pd.Flashes = append(pd.Flashes, flash{Error: true, Text: explain(err)})
		if code == http.StatusOK {
			code = status(err)
		}
		c.render(w, r, code, "jobs", s, pd)
		return
	}
	for _, j := range page.Jobs {
		// Filter here too, so that a control plane that ignores a
		// filter shows no job that does not match it.
		if (d.State != "" && j.State != d.State) || (d.Type != "" && j.JobType != d.Type) ||
			(d.Worker != "" && (j.WorkerID == nil || *j.WorkerID != d.Worker)) ||
			(d.Tag != "" && !slices.Contains(j.Requirements.Tags, d.Tag)) {
			continue
		}
		d.Jobs = append(d.Jobs, j)
	}
	filters := url.Values{}
	for k, v := range map[string]string{"state": d.State, "job_type": d.Type, "worker_id": d.Worker, "tag": d.Tag} {
		if v != "" {
			filters.Set(k, v)
		}
	}
	if in.Get("after") != "" {
		d.FirstQuery = filters.Encode()
		if d.FirstQuery == "" {
			d.FirstQuery = "state="
		}
	}
	if page.Next != nil {
		q := url.Values{"after": {*page.Next}}
		for k, v := range filters {
			q[k] = v
		}
		d.NextQuery = q.Encode()
	}
	c.render(w, r, code, "jobs", s, pd)
}

// dispatch dispatches the form's job and shows it; a dispatch that fails
// shows the job list again with the form as sent and what was wrong.
func (c *Console) dispatch(w http.ResponseWriter, r *http.Request, s *session) {
	if err := form(w, r); err != nil {
		fl := flash{Error: true, Text: explain(&requestError{err.Error()})}
		c.jobsPage(w, r, s, http.StatusBadRequest, &dispatchForm{Payload: "{}"}, &fl)
		return
	}
	f := r.PostForm
	// A browser sends a textarea's line breaks as CRLF and shows them as
	// LF: the offset of an error is counted in what it shows.
	df := &dispatchForm{JobType: f.Get("job_type"), Payload: strings.ReplaceAll(f.Get("payload"), "\r\n", "\n"), GPUSKU: f.Get("gpu_sku"), GPUCount: f.Get("gpu_count"),
		Tags: f.Get("tags"), Priority: f.Get("priority"), MaxAttempts: f.Get("max_attempts")}
	fail := func(err error) {
		fl := flash{Error: true, Text: explain(err)}
		c.jobsPage(w, r, s, status(err), df, &fl)
	}
	req := wire.DispatchRequest{JobType: strings.TrimSpace(df.JobType), Requirements: wire.Requirements{GPUSKU: strings.TrimSpace(df.GPUSKU), Tags: fields(df.Tags)}}
	if p := strings.TrimSpace(df.Payload); p != "" {
		if err := checkJSON(df.Payload); err != nil {
			df.PayloadErr, df.PayloadOffset = err.msg, err.offset
			fail(&requestError{"the payload is not JSON: " + err.msg})
			return
		}
		req.Payload = json.RawMessage(p)
	}
	for name, v := range map[string]string{"gpu_count": df.GPUCount, "priority": df.Priority, "max_attempts": df.MaxAttempts} {
		dst := map[string]*int{"gpu_count": &req.Requirements.GPUCount, "priority": &req.Priority, "max_attempts": &req.MaxAttempts}[name]
		if v = strings.TrimSpace(v); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				fail(&requestError{fmt.Sprintf("%s %q is not a whole number", name, v)})
				return
			}
			*dst = n
		}
	}
	out, err := c.op(s.token).Dispatch(r.Context(), req)
	if err != nil {
		fail(err)
		return
	}
	msg := "Dispatched " + out.Job.JobType + " as job " + out.Job.ID + "."
	if !out.Leasable {
		msg += " Not leasable now: " + out.Reason
	}
	c.sessions.push(s, flash{Text: msg})
	http.Redirect(w, r, c.base(r)+"/jobs/"+url.PathEscape(out.Job.ID), http.StatusSeeOther)
}

// jsonError is where a payload is not JSON.
type jsonError struct {
	msg    string
	offset int64
}

// checkJSON reports where p is not one JSON value: the line and column
// (counted in characters, from 1) and the byte offset of the error.
func checkJSON(p string) *jsonError {
	var v any
	dec := json.NewDecoder(strings.NewReader(p))
	err := dec.Decode(&v)
	if err == nil {
		rest := p[dec.InputOffset():]
		more := strings.TrimLeft(rest, " \t\r\n")
		if more == "" {
			return nil
		}
		off := dec.InputOffset() + int64(len(rest)-len(more))
		return &jsonError{msg: "more follows the JSON value at " + position(p, off), offset: off}
	}
	off := int64(len(p))
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off = se.Offset
		// The offset is just past the character at fault.
		if off > 0 {
			off--
		}
	}
	msg := err.Error()
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		msg = "it ends before the JSON value does"
	}
	return &jsonError{msg: msg + " at " + position(p, off), offset: off}
}

// position is byte offset off of p as "line L, column C" (from 1, in
// characters).
func position(p string, off int64) string {
	off = min(max(off, 0), int64(len(p)))
	before := p[:off]
	line := strings.Count(before, "\n") + 1
	col := utf8.RuneCountInString(before[strings.LastIndexByte(before, '\n')+1:]) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

// receiptRow is one receipt as a page shows it, with the outcome of its
// verification.
type receiptRow struct {
	ID       string
	Kind     receipts.Kind
	Index    *int64
	Receipt  *receipts.Receipt
	Verified bool
	Note     string
	Proof    *receipts.Proof
	Body     string
}

// cost is what a job cost, from its view or its job_charged receipt.
type cost struct {
	MS, Hours, USD, SKU, Rate string
	From                      string
	// Unpriced is a charge at a rate of 0: the SKU has no price.
	Unpriced bool
}

type jobData struct {
	wire.JobDetailResponse
	// WorkerHint, for a job not ended, says that the worker holding it
	// is banned or offline, and what becomes of the job.
	WorkerHint  string
	Cost        *cost
	Receipts    []receiptRow
	ReceiptsErr string
	Checkpoint  *receipts.Checkpoint
	LastEvent   int64
}

// jobDetail reads job id with its events after the event id after ("":
// from the first).
func (c *Console) jobDetail(ctx context.Context, token, id, after string) (*wire.JobDetailResponse, error) {
	var n int64
	if after != "" {
		var err error
		if n, err = strconv.ParseInt(after, 10, 64); err != nil || n < 0 {
			return nil, &requestError{fmt.Sprintf("the event id %q is not a whole number", after)}
		}
	}
	return c.op(token).Job(ctx, id, n)
}

func (c *Console) job(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id := r.PathValue("id")
	jd, err := c.jobDetail(ctx, s.token, id, r.URL.Query().Get("events_after"))
	if err != nil {
		c.render(w, r, status(err), "job", s, &pageData{Title: "Job " + id, Nav: "jobs", Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	d := jobData{JobDetailResponse: *jd}
	if n := len(jd.Events); n > 0 {
		d.LastEvent = jd.Events[n-1].ID
	}
	if j := jd.Job; j.ActualCostUSD != nil {
		d.Cost = &cost{MS: deref(j.ActualMS), Hours: derefS(j.ActualHours), USD: *j.ActualCostUSD, From: "the job"}
	}
	if j := jd.Job; j.WorkerID != nil && !ended(j.State) {
		d.WorkerHint = c.workerHint(ctx, s.token, *j.WorkerID, j.ID)
	}
	d.Receipts, d.Checkpoint, err = c.jobReceipts(ctx, s.token, jd)
	if err != nil {
		d.ReceiptsErr = explain(err)
	}
	for _, rr := range d.Receipts {
		if rr.Kind != receipts.KindJobCharged || rr.Receipt == nil {
			continue
		}
		rc := rr.Receipt
		if d.Cost == nil {
			d.Cost = &cost{MS: strconv.FormatInt(rc.ActualMS, 10), Hours: receipts.Hours(rc.ActualMS), USD: receipts.FormatMicros(rc.CostMicros),
				From: "its job_charged receipt"}
		}
		// The SKU and rate are the receipt's in either case.
		d.Cost.SKU, d.Cost.Rate, d.Cost.Unpriced = rc.GPUSKU, receipts.FormatMicros(rc.RateMicros), rc.RateMicros == 0
	}
	c.render(w, r, http.StatusOK, "job", s, &pageData{Title: "Job " + id, Nav: "jobs", Data: d})
}

// workerHint says what is wrong with worker id, which holds job: banned
// or offline, and when the lease it holds on the job expires; "" when
// nothing is, or the worker cannot be read (its page says why).
func (c *Console) workerHint(ctx context.Context, token, id, job string) string {
	wd, err := c.op(token).Worker(ctx, id)
	if err != nil {
		return ""
	}
	var what string
	switch v := wd.Worker; {
	case v.Banned:
		what = "The worker holding this job is banned"
		if v.BanReason != nil && *v.BanReason != "" {
			what += " (" + *v.BanReason + ")"
		}
		what += ": it can report nothing more for it."
	case v.Liveness == "offline":
		what = "The worker holding this job is offline (last seen " + exact(v.LastSeenAt) + "): nothing follows until it returns."
	default:
		return ""
	}
	for _, l := range wd.Leases {
		if l.JobID == job {
			return what + " Its lease expires " + exact(l.ExpiresAt) + "; the job is then requeued while attempts remain, or failed."
		}
	}
	return what + " The job is requeued or failed when its lease expires."
}

func deref(p *int64) string {
	if p == nil {
		return "—"
	}
	return strconv.FormatInt(*p, 10)
}

func derefS(p *string) string {
	if p == nil {
		return "—"
	}
	return *p
}

// jobReceipts finds the receipts of a job (those its view and its
// artifacts name, and those among the latest RecentReceipts that name
// it) and verifies each against the current checkpoint.
func (c *Console) jobReceipts(ctx context.Context, token string, jd *wire.JobDetailResponse) ([]receiptRow, *receipts.Checkpoint, error) {
	var ids []string
	add := func(id string) {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if jd.Job.ReceiptID != nil {
		add(*jd.Job.ReceiptID)
	}
	for _, a := range jd.Artifacts {
		if a.ReceiptID != nil {
			add(*a.ReceiptID)
		}
	}
	recent, cp, err := c.recent(ctx, token, RecentReceipts)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range recent {
		if rc, err := receipts.Decode(w.Body); err == nil && rc.JobID == jd.Job.ID {
			add(w.ID)
		}
	}
	rows := make([]receiptRow, 0, len(ids))
	for _, id := range ids {
		rows = append(rows, c.verifyReceipt(ctx, token, id, cp))
	}
	slices.SortStableFunc(rows, func(a, b receiptRow) int {
		if a.Index == nil || b.Index == nil {
			return 0
		}
		return int(*a.Index - *b.Index)
	})
	return rows, cp, nil
}

// verifyReceipt reads receipt id with its proof and verifies it with the
// configured key; it notes when the proof is against another checkpoint
// than cp (the current one).
func (c *Console) verifyReceipt(ctx context.Context, token, id string, cp *receipts.Checkpoint) receiptRow {
	row := receiptRow{ID: id}
	rr, err := c.op(token).Receipt(ctx, id)
	if err != nil {
		row.Note = explain(err)
		return row
	}
	row.Kind, row.Index, row.Body = rr.Receipt.Kind, rr.Receipt.Index, string(rr.Receipt.Body)
	if rc, err := receipts.Decode(rr.Receipt.Body); err == nil {
		row.Receipt = rc
	}
	if rr.Proof == nil || rr.Checkpoint == nil {
		row.Note = "not yet sequenced: no proof yet"
		return row
	}
	row.Proof = rr.Proof
	rc, err := receipts.Verify(c.cfg.VerifierKey, c.cfg.Origin, rr.Receipt.Body, *rr.Proof, []byte(*rr.Checkpoint))
	switch {
	case err != nil:
		row.Note = "does not verify: " + err.Error()
	case rc.ID != rr.Receipt.ID || rc.Kind != rr.Receipt.Kind:
		row.Note = "does not verify: its body is receipt " + rc.ID + " (" + string(rc.Kind) + ")"
	case cp != nil && rr.Proof.TreeSize != cp.Size:
		row.Verified = true
		row.Note = fmt.Sprintf("verified against the signed checkpoint of %d receipts (the current one has %d)", rr.Proof.TreeSize, cp.Size)
	default:
		row.Verified = true
		row.Note = fmt.Sprintf("verified: included in the current signed checkpoint of %d receipts", rr.Proof.TreeSize)
	}
	return row
}

// eventsAnswer is what GET /jobs/{id}/events answers the log follower.
type eventsAnswer struct {
	State  string              `json:"state"`
	Ended  bool                `json:"ended"`
	Events []wire.JobEventView `json:"events"`
	Next   *int64              `json:"next"`
}

// MaxEventsAnswer bounds the events one answer of GET /jobs/{id}/events
// holds (it reads up to ten pages of the API for them); past it, next
// says where the following answer starts.
const MaxEventsAnswer = 10000

// jobEvents answers the job's events after ?after= as JSON, for the
// script that makes the job page's log viewer load and follow them.
func (c *Console) jobEvents(w http.ResponseWriter, r *http.Request, s *session) {
	after := r.URL.Query().Get("after")
	if after != "" {
		if n, err := strconv.ParseInt(after, 10, 64); err != nil || n < 0 {
			http.Error(w, "after is not a whole number", http.StatusBadRequest)
			return
		}
	}
	jd, err := c.jobDetail(r.Context(), s.token, r.PathValue("id"), after)
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(status(err))
		_ = json.NewEncoder(w).Encode(map[string]string{"error": explain(err)})
		return
	}
	out := eventsAnswer{State: jd.Job.State, Events: jd.Events, Next: jd.EventsNext}
	for out.Next != nil && len(out.Events) < MaxEventsAnswer {
		more, err := c.op(s.token).Job(r.Context(), jd.Job.ID, *out.Next)
		if err != nil || len(more.Events) == 0 {
			break // the events so far, and where to go on
		}
		out.State, out.Next = more.Job.State, more.EventsNext
		out.Events = append(out.Events, more.Events...)
	}
	out.Ended = ended(out.State)
	if out.Events == nil {
		out.Events = []wire.JobEventView{}
	}
	_ = json.NewEncoder(w).Encode(out)
}

// retry requeues a failed or canceled job with a fresh attempt budget
// (POST /operator/jobs/{id}/retry, receipted); the API refuses a job in
// any other state (409).
func (c *Console) retry(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	c.act(w, r, s, "/jobs/"+url.PathEscape(id), func(ctx context.Context) (flash, error) {
		if err := form(w, r); err != nil {
			return flash{}, err
		}
		out, err := c.op(s.token).RetryJob(ctx, id, strings.TrimSpace(r.PostForm.Get("reason")))
		if err != nil {
			return flash{}, err
		}
		msg := "Job " + id + " is " + out.Job.State + " again."
		if out.ReceiptID != nil {
			msg += " Receipt " + *out.ReceiptID + "."
		}
		return flash{Text: msg}, nil
	})
}

func (c *Console) cancel(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	c.act(w, r, s, "/jobs/"+url.PathEscape(id), func(ctx context.Context) (flash, error) {
		out, err := c.op(s.token).CancelJob(ctx, id)
		if err != nil {
			return flash{}, err
		}
		return flash{Text: "Job " + id + " is " + out.Job.State + map[bool]string{true: " (cancel requested)", false: ""}[out.Job.CancelRequested] + "."}, nil
	})
}

// --- envelope

type envelopeData struct {
	Envelope   *wire.EnvelopeResponse
	History    []receiptRow
	HistoryErr string
}

func (c *Console) envelope(w http.ResponseWriter, r *http.Request, s *session) {
	var d envelopeData
	env, err := c.op(s.token).Envelope(r.Context())
	if err != nil {
		c.render(w, r, status(err), "envelope", s, &pageData{Title: "Envelope", Data: d, Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	d.Envelope = env
	if rs, _, err := c.recent(r.Context(), s.token, RecentReceipts); err != nil {
		d.HistoryErr = explain(err)
	} else {
		for i := len(rs) - 1; i >= 0; i-- {
			if k := rs[i].Kind; k == receipts.KindEnvelopeActivated || k == receipts.KindEnvelopeDeactivated || k == receipts.KindEnvelopeSafeTypesChanged {
				row := receiptRow{ID: rs[i].ID, Kind: k, Index: rs[i].Index}
				row.Receipt, _ = receipts.Decode(rs[i].Body)
				d.History = append(d.History, row)
			}
		}
	}
	c.render(w, r, http.StatusOK, "envelope", s, &pageData{Title: "Envelope", Data: d})
}

func (c *Console) envelopeAction(w http.ResponseWriter, r *http.Request, s *session) {
	action := r.PathValue("action")
	c.act(w, r, s, "/envelope", func(ctx context.Context) (flash, error) {
		if err := form(w, r); err != nil {
			return flash{}, err
		}
		reason := strings.TrimSpace(r.PostForm.Get("reason"))
		var (
			out *wire.EnvelopeResponse
			err error
		)
		switch action {
		case "activate":
			a := wire.ActivateRequest{Reason: reason}
			if u := strings.TrimSpace(r.PostForm.Get("until")); u != "" {
				t, err := parseUntil(u)
				if err != nil {
					return flash{}, err
				}
				a.Until = &t
			}
			out, err = c.op(s.token).ActivateEnvelope(ctx, a)
		case "deactivate":
			out, err = c.op(s.token).DeactivateEnvelope(ctx, reason)
		case "safe-types":
			out, err = c.op(s.token).SetSafeTypes(ctx, wire.SafeTypesRequest{Add: fields(r.PostForm.Get("add")), Remove: fields(r.PostForm.Get("remove")), Reason: reason})
			if err == nil {
				return flash{Text: fmt.Sprintf("Safe types now %s: policy version %d.", strings.Join(out.SafeTypes, " "), out.PolicyVersion)}, nil
			}
		default:
			return flash{}, fmt.Errorf("there is no envelope action %q", action)
		}
		if err != nil {
			return flash{}, err
		}
		return flash{Text: fmt.Sprintf("Envelope %sd: runtime active=%t, policy version %d, receipt %s.", action, out.Active, out.PolicyVersion, out.ReceiptID)}, nil
	})
}

// parseUntil reads a deadline: RFC 3339, or a browser's datetime-local
// (2006-01-02T15:04, taken as UTC).
func parseUntil(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("the deadline %q is not a time (2006-01-02T15:04 UTC, or RFC 3339)", s)
}

// --- credentials

type credentialsData struct {
	Credentials []wire.CredentialView
	NextQuery   string
	Scopes      []string
}

var operatorScopes = []string{"operator:jobs", "operator:workers", "operator:credentials", "operator:envelope", "operator:receipts",
	"node:register", "node:heartbeat", "node:poll", "node:result:submit", "node:audit:submit"}

func (c *Console) credentials(w http.ResponseWriter, r *http.Request, s *session) {
	in := r.URL.Query()
	d := credentialsData{Scopes: operatorScopes}
	page, err := c.op(s.token).ListCredentials(r.Context(), operator.CredentialQuery{Principal: in.Get("principal"), After: in.Get("after"), Limit: PageSize, Order: wire.OrderDesc})
	if err != nil {
		c.render(w, r, status(err), "credentials", s, &pageData{Title: "Credentials", Data: d, Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	d.Credentials = page.Credentials
	if page.Next != nil {
		q := url.Values{"after": {*page.Next}}
		if p := in.Get("principal"); p != "" {
			q.Set("principal", p)
		}
		d.NextQuery = q.Encode()
	}
	c.render(w, r, http.StatusOK, "credentials", s, &pageData{Title: "Credentials", Data: d})
}

func (c *Console) mint(w http.ResponseWriter, r *http.Request, s *session) {
	c.act(w, r, s, "/credentials", func(ctx context.Context) (flash, error) {
		if err := form(w, r); err != nil {
			return flash{}, err
		}
		f := r.PostForm
		req := wire.MintCredentialRequest{Principal: strings.TrimSpace(f.Get("principal")), Scopes: f["scope"]}
		if v := strings.TrimSpace(f.Get("ttl_hours")); v != "" {
			h, err := strconv.ParseInt(v, 10, 64)
			if err != nil || h < 0 || h > 1<<20 {
				return flash{}, fmt.Errorf("the lifetime %q is not a number of hours", v)
			}
			req.TTLSeconds = h * 3600
		}
		if v := strings.TrimSpace(f.Get("max_registrations")); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return flash{}, fmt.Errorf("max registrations %q is not a whole number", v)
			}
			req.MaxRegistrations = &n
		}
		out, err := c.op(s.token).MintCredential(ctx, req)
		if err != nil {
			return flash{}, err
		}
		return flash{Text: fmt.Sprintf("Minted credential %s for %s (%s), expiring %s. Copy its token now: it is shown this once.",
			out.CredentialID, out.Principal, strings.Join(out.Scopes, " "), out.ExpiresAt.UTC().Format(time.RFC3339)), Secret: out.Token}, nil
	})
}

func (c *Console) revoke(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	c.act(w, r, s, "/credentials", func(ctx context.Context) (flash, error) {
		if err := form(w, r); err != nil {
			return flash{}, err
		}
		out, err := c.op(s.token).RevokeCredential(ctx, id, r.PostForm.Get("reason"))
		if err != nil {
			return flash{}, err
		}
		if out.ReceiptID == nil {
			return flash{Text: "Credential " + id + " was revoked already."}, nil
		}
		return flash{Text: "Revoked credential " + id + " of " + out.Principal + "; receipt " + *out.ReceiptID + "."}, nil
	})
}
