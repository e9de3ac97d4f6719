package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// The rows of the latency table, in the order printed.
const (
	rowRegister      = "register"
	rowHeartbeat     = "heartbeat"
	rowDispatch      = "dispatch"
	rowLease         = "lease"
	rowLeaseEmpty    = "lease (no job)"
	rowAccept        = "accept"
	rowComplete      = "complete"
	rowCompleteBatch = "complete (batch)"
	rowRelease       = "release"
	rowDispatchLease = "dispatch→lease"
)

var rowOrder = []string{rowRegister, rowHeartbeat, rowDispatch, rowLease, rowLeaseEmpty, rowAccept, rowComplete, rowCompleteBatch, rowRelease, rowDispatchLease}

// series is the durations and errors of one row.
type series struct {
	d        []time.Duration
	errs     int
	firstErr error
}

// routeStats collects the latency of every call, by row: a route, or a
// derived latency such as dispatch→lease. It is safe for concurrent use.
type routeStats struct {
	mu   sync.Mutex
	rows map[string]*series
}

func newRouteStats() *routeStats { return &routeStats{rows: map[string]*series{}} }

// add records one call of row that took d and ended with err. A call
// that failed counts as an error, and its duration is not kept.
func (s *routeStats) add(row string, d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rows[row]
	if r == nil {
		r = &series{}
		s.rows[row] = r
	}
	if err != nil {
		if r.errs == 0 {
			r.firstErr = err
		}
		r.errs++
		return
	}
	r.d = append(r.d, d)
}

// summary is one row's figures.
type summary struct {
	n, errs       int
	p50, p99, max time.Duration
	firstErr      error
}

// get summarises row.
func (s *routeStats) get(row string) summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rows[row]
	if r == nil {
		return summary{}
	}
	d := slices.Clone(r.d)
	slices.Sort(d)
	out := summary{n: len(d), errs: r.errs, firstErr: r.firstErr}
	if len(d) > 0 {
		out.p50, out.p99, out.max = quantile(d, 0.50), quantile(d, 0.99), d[len(d)-1]
	}
	return out
}

// errors returns how many calls failed, over every row.
func (s *routeStats) errors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rows {
		n += r.errs
	}
	return n
}

// quantile is the nearest-rank q-quantile of sorted, which is not empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// print writes the table of every row that has calls.
func (s *routeStats) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\tcalls\terrors\tp50\tp99\tmax\t")
	for _, row := range rowOrder {
		m := s.get(row)
		if m.n == 0 && m.errs == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t\n", row, m.n, m.errs, ms(m.p50), ms(m.p99), ms(m.max))
	}
	tw.Flush()
	for _, row := range rowOrder {
		if m := s.get(row); m.firstErr != nil {
			fmt.Fprintf(w, "  first %s error: %v\n", row, m.firstErr)
		}
	}
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}

// countingTransport counts the HTTP exchanges of a client: every attempt
// the client sends, retries included.
type countingTransport struct {
	next http.RoundTripper
	// requests is every request sent; retryable the 429 and 5xx answers;
	// noAnswer the requests that got none (a network error or a timeout);
	// canceled those that got none because loadgen stopped waiting (a
	// long-poll at the end of the run).
	requests, retryable, noAnswer, canceled atomic.Int64
}

// RoundTrip sends r through the next transport and counts the exchange.
func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.requests.Add(1)
	resp, err := t.next.RoundTrip(r)
	switch {
	case err != nil && r.Context().Err() != nil:
		t.canceled.Add(1)
	case err != nil:
		t.noAnswer.Add(1)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		t.retryable.Add(1)
	}
	return resp, err
}

// String summarises the counts.
func (t *countingTransport) String() string {
	return fmt.Sprintf("%d requests, %d answered 429 or 5xx, %d unanswered, %d canceled by loadgen",
		t.requests.Load(), t.retryable.Load(), t.noAnswer.Load(), t.canceled.Load())
}

// memory is a process's resident memory in bytes, from /proc/PID/status.
type memory struct {
	rss, peak int64 // VmRSS and VmHWM
}

// readMemory reads the resident memory of process pid (Linux only).
func readMemory(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v) // "12345 kB"
		if len(f) != 2 || f[1] != "kB" {
			return memory{}, fmt.Errorf("/proc/%d/status: unexpected %s line %q", pid, k, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/status: %s: %w", pid, k, err)
		}
		if k == "VmRSS" {
			m.rss = n << 10
		} else {
			m.peak = n << 10
		}
	}
	if err := sc.Err(); err != nil {
		return memory{}, err
	}
	if m.rss == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
	}
	return m, nil
}

// memSampler samples the resident memory of processes at an interval,
// summed over them, keeping the first sample, the largest and the last.
type memSampler struct {
	pids []int
	stop chan struct{}
	done chan struct{}

	mu                sync.Mutex
	first, last, most int64
	err               error
}

// startMemSampler samples pids every interval until stop; with no pids
// it does nothing.
func startMemSampler(pids []int, every time.Duration) *memSampler {
	s := &memSampler{pids: pids, stop: make(chan struct{}), done: make(chan struct{})}
	if len(pids) == 0 {
		close(s.done)
		return s
	}
	s.sample()
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				s.sample()
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *memSampler) sample() {
	var rss int64
	var err error
	for _, pid := range s.pids {
		m, e := readMemory(pid)
		if e != nil {
			err = e
			break
		}
		rss += m.rss
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	if s.first == 0 {
		s.first = rss
	}
	s.last, s.most = rss, max(s.most, rss)
}

// finish takes a last sample and returns the report line.
func (s *memSampler) finish() string {
	if len(s.pids) == 0 {
		return "server RSS: not read (give -server-pid)"
	}
	select {
	case <-s.done:
	default:
		close(s.stop)
		<-s.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first == 0 {
		return fmt.Sprintf("server RSS: not read: %v", s.err)
	}
	return fmt.Sprintf("server RSS: %s at the start, %s at most, %s at the end (pid %s)", mb(s.first), mb(s.most), mb(s.last), joinInts(s.pids))
}

// mb formats a byte count in MiB.
func mb(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

// pgCounters are PostgreSQL's counters of one database.
type pgCounters struct {
	commits, rollbacks int64
	// statements is the calls pg_stat_statements counted in the
	// database, when hasStatements, but those of loadgen's probes (every
	// statement that names a pg_stat view or function).
	statements    int64
	hasStatements bool
}

// pgProbe reads the counters of the database a DSN names.
type pgProbe struct {
	conn   *pgx.Conn
	settle time.Duration
	// cpu measures the CPU time of the database's backends, on a
	// connection of its own.
	cpu *backendCPU
}

// openPG connects to dsn; with dsn "" it returns nil, nil.
func openPG(ctx context.Context, dsn string, settle time.Duration) (*pgProbe, error) {
	if dsn == "" {
		return nil, nil
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("-pg: %w", err)
	}
	cpuConn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("-pg: %w", err)
	}
	exclude := []int{int(conn.PgConn().PID()), int(cpuConn.PgConn().PID())}
	return &pgProbe{conn: conn, settle: settle, cpu: newBackendCPU(ctx, cpuConn, exclude, 200*time.Millisecond)}, nil
}

// close closes the connection.
func (p *pgProbe) close() {
	if p != nil {
		_ = p.conn.Close(context.Background())
		_ = p.cpu.conn.Close(context.Background())
	}
}

// read waits the settle time, so that the server's sessions have reported
// their counts, and reads the counters.
func (p *pgProbe) read(ctx context.Context) (pgCounters, error) {
	select {
	case <-time.After(p.settle):
	case <-ctx.Done():
		return pgCounters{}, context.Cause(ctx)
	}
	var c pgCounters
	err := p.conn.QueryRow(ctx,
		`SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.commits, &c.rollbacks)
	if err != nil {
		return c, fmt.Errorf("-pg: pg_stat_database: %w", err)
	}
	// pg_stat_statements is there only if it is loaded and created.
	err = p.conn.QueryRow(ctx,
		`SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat%'`).Scan(&c.statements)
	c.hasStatements = err == nil
	return c, nil
}

// pgLine is the report line of the counters between before and after,
// per unit (job or heartbeat).
func pgLine(before, after pgCounters, units int, unit string) string {
	commits := after.commits - before.commits
	per := func(n int64) string {
		if units == 0 {
			return "-"
		}
		return strconv.FormatFloat(float64(n)/float64(units), 'f', 2, 64)
	}
	line := fmt.Sprintf("postgres: %d commits (%s per %s), %d rollbacks", commits, per(commits), unit, after.rollbacks-before.rollbacks)
	if after.hasStatements && before.hasStatements {
		st := after.statements - before.statements
		line += fmt.Sprintf(", %d statements (%s per %s)", st, per(st), unit)
	} else {
		line += "; statements: not counted (pg_stat_statements is not loaded)"
	}
	return line
}
