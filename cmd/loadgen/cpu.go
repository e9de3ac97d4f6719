package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// userHZ is the unit of the CPU times of /proc/PID/stat: USER_HZ, 100
// on every architecture Linux and Go share.
const userHZ = 100

// procCPU returns the CPU time process pid has used, user and system,
// over all its threads, from /proc/PID/stat (Linux only). It does not
// count children.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(pid, b)
}

// parseStat returns the utime and stime of b, the contents of
// /proc/PID/stat, as a duration.
func parseStat(pid int, b []byte) (time.Duration, error) {
	// The command name, in parentheses, may hold spaces: the fields
	// start after its last ')', at field 3 (state); utime and stime are
	// fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// procsCPU sums procCPU over pids.
func procsCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// cpuMark is the CPU time of the processes loadgen measures at one
// moment.
type cpuMark struct {
	server, self time.Duration
	serverErr    error
}

// markCPU reads the CPU time of the server's processes (none without
// -server-pid) and of loadgen itself.
func markCPU(pids []int) cpuMark {
	var m cpuMark
	m.server, m.serverErr = procsCPU(pids)
	m.self, _ = procCPU(os.Getpid())
	return m
}

// backendCPU measures the CPU time of the PostgreSQL backends serving
// one database: those pg_stat_activity lists for it, the probes' own
// excepted. It samples them from start to finish, each backend's
// /proc/PID/stat, and sums what each used between its first sample (0
// for a backend that began after start) and its last. A backend that
// ends between two samples loses what it used after the earlier one, and
// PostgreSQL's shared processes (WAL writer, checkpointer, autovacuum)
// are not counted: the sum is of the work done on the server's
// connections, and needs PostgreSQL on this machine.
type backendCPU struct {
	conn    *pgx.Conn
	exclude []int // the probes' backends
	every   time.Duration
	stop    chan struct{}
	done    chan struct{}

	mu          sync.Mutex
	base, last  map[int]time.Duration
	started     bool
	err         error
	unavailable error // why the backends cannot be measured, or nil
}

// newBackendCPU prepares to measure the backends of conn's database,
// checking that conn's own backend is a process of this machine.
func newBackendCPU(ctx context.Context, conn *pgx.Conn, exclude []int, every time.Duration) *backendCPU {
	b := &backendCPU{conn: conn, exclude: exclude, every: every, stop: make(chan struct{}), done: make(chan struct{}),
		base: map[int]time.Duration{}, last: map[int]time.Duration{}}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", conn.PgConn().PID()))
	switch {
	case err != nil:
		b.unavailable = fmt.Errorf("PostgreSQL's backend %d is not a process of this machine: %w", conn.PgConn().PID(), err)
	case !strings.HasPrefix(string(comm), "postgres"):
		b.unavailable = fmt.Errorf("process %d of this machine is %q, not PostgreSQL's backend (another host, or another pid namespace)", conn.PgConn().PID(), strings.TrimSpace(string(comm)))
	}
	return b
}

// sample reads the CPU time of every backend of the database. It queries
// inside the transaction start opened, so that the samples commit
// nothing the report counts; pg_stat_clear_snapshot makes each see the
// backends of the moment.
func (b *backendCPU) sample(ctx context.Context) error {
	if _, err := b.conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return err
	}
	rows, err := b.conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND NOT pid = ANY($1)`, b.exclude)
	if err != nil {
		return err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		d, err := procCPU(int(pid))
		if errors.Is(err, os.ErrNotExist) {
			continue // it ended since the query
		}
		if err != nil {
			return err
		}
		if _, ok := b.last[int(pid)]; !ok && !b.started {
			b.base[int(pid)] = d
		}
		b.last[int(pid)] = d
	}
	return nil
}

// start takes the first sample, then samples every b.every until finish.
func (b *backendCPU) start(ctx context.Context) {
	if b.unavailable != nil {
		close(b.done)
		return
	}
	if _, err := b.conn.Exec(ctx, `BEGIN READ ONLY`); err != nil {
		b.err = err
	} else {
		b.err = b.sample(ctx)
	}
	b.mu.Lock()
	b.started = true
	b.mu.Unlock()
	go func() {
		defer close(b.done)
		t := time.NewTicker(b.every)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				if err := b.sample(ctx); err != nil && b.err == nil {
					b.err = err
				}
			}
		}
	}()
}

// finish takes a last sample and returns the CPU time the backends used
// since start, and how many backends were seen.
func (b *backendCPU) finish(ctx context.Context) (time.Duration, int, error) {
	if b.unavailable != nil {
		return 0, 0, b.unavailable
	}
	close(b.stop)
	<-b.done
	if err := b.sample(ctx); err != nil && b.err == nil {
		b.err = err
	}
	// A rollback: the report counts it, but not among the commits.
	if _, err := b.conn.Exec(ctx, `ROLLBACK`); err != nil && b.err == nil {
		b.err = err
	}
	if b.err != nil {
		return 0, 0, b.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var sum time.Duration
	for pid, d := range b.last {
		sum += d - b.base[pid]
	}
	return sum, len(b.last), nil
}

// cpuLine is the report line of the CPU time used between two marks, per
// unit; pgCPU, pgBackends and pgErr are backendCPU.finish's answer, and
// pgErr is errNoPG when there was no -pg.
func cpuLine(pids []int, before, after cpuMark, pgCPU time.Duration, pgBackends int, pgErr error, units int, unit string) string {
	per := func(d time.Duration) string {
		if units == 0 {
			return "-"
		}
		return strconv.FormatFloat(d.Seconds()*1000/float64(units), 'f', 2, 64) + " ms per " + unit
	}
	var b strings.Builder
	b.WriteString("CPU: ")
	switch {
	case len(pids) == 0:
		b.WriteString("server not read (give -server-pid)")
	case before.serverErr != nil || after.serverErr != nil:
		fmt.Fprintf(&b, "server not read: %v", errors.Join(before.serverErr, after.serverErr))
	default:
		d := after.server - before.server
		fmt.Fprintf(&b, "server %.2f s (%s, pid %s)", d.Seconds(), per(d), joinInts(pids))
	}
	switch {
	case errors.Is(pgErr, errNoPG):
		b.WriteString("; postgres not read (give -pg)")
	case pgErr != nil:
		fmt.Fprintf(&b, "; postgres not read: %v", pgErr)
	default:
		fmt.Fprintf(&b, "; postgres %.2f s in %d backends of the database (%s)", pgCPU.Seconds(), pgBackends, per(pgCPU))
	}
	d := after.self - before.self
	fmt.Fprintf(&b, "; loadgen %.2f s (%s)", d.Seconds(), per(d))
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(la)); len(f) >= 3 {
			fmt.Fprintf(&b, "; load average %s %s %s", f[0], f[1], f[2])
		}
	}
	return b.String()
}

// errNoPG is cpuLine's pgErr when there was no -pg.
var errNoPG = errors.New("no -pg")

// joinInts joins ns with commas.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
