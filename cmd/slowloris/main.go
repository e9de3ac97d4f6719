// Command slowloris checks, on loopback only, that a nodelane control
// plane bounds what unauthenticated slow clients cost it: it opens many
// connections that each announce a 1 MiB body on a valid-looking route,
// without a credential or with an invalid one, and then trickle that body
// a byte at a time. Each connection must be answered (401) or closed by a
// server timeout, and the server's memory must stay bounded.
//
//	go run ./cmd/slowloris                        # builds and starts cmd/server on SQLite
//	go run ./cmd/slowloris -addr 127.0.0.1:8080 -pid 4242
//
// Without -addr it builds cmd/server, starts it on a fresh SQLite
// database in a temporary directory, attacks it and stops it. With -addr
// it attacks a server already running there (its memory is read only
// with -pid). The memory is the server process's VmRSS (sampled) and
// VmHWM (its peak) from /proc/PID/status. The attack is bounded: at most
// 10,000 connections and 10 minutes; it stops by itself once every
// connection is settled or -duration has passed, and exits non-zero if a
// connection was neither answered nor closed, or the peak VmRSS during
// the attack reached -max-rss.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "slowloris:", err)
		os.Exit(1)
	}
}

// Bounds of one run, whatever the flags say.
const (
	maxConns    = 10_000
	maxDuration = 10 * time.Minute
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("slowloris", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addr      = fs.String("addr", "", "attack the loopback server at host:port (default: build and start cmd/server)")
		pid       = fs.Int("pid", 0, "with -addr: the server's process id, to read its memory")
		serverBin = fs.String("server-bin", "", "without -addr: a built cmd/server to start (default: go build it)")
		cfg       = Config{}
		maxRSS    = fs.Int64("max-rss", 100<<20, "fail if the server's VmRSS reaches this many bytes during the attack")
	)
	fs.IntVar(&cfg.Conns, "conns", 1000, "connections to open (at most 10,000)")
	fs.Int64Var(&cfg.BodyLength, "body", 1<<20, "the Content-Length each connection announces")
	fs.DurationVar(&cfg.Trickle, "trickle", 10*time.Second, "the interval between two bytes of a body")
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long the attack may last (at most 10m)")
	fs.DurationVar(&cfg.OpenWithin, "open-within", 10*time.Second, "how long opening all connections may take")
	fs.BoolVar(&cfg.SlowHeaders, "slow-headers", false, "trickle the header block instead of the body: each connection must be closed by the server's header timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	var srv *serverProc
	if *addr == "" {
		var err error
		if srv, err = startServer(ctx, *serverBin, stderr); err != nil {
			return err
		}
		defer srv.stop()
		*addr, *pid = srv.addr, srv.cmd.Process.Pid
	}
	cfg.Addr = *addr
	if *pid > 0 {
		cfg.Memory = func() (Memory, error) { return ReadMemory(*pid) }
	}
	what := "body"
	if cfg.SlowHeaders {
		what = "header block"
	}
	fmt.Fprintf(stdout, "attacking %s with %d connections announcing %d bytes, trickling the %s a byte every %v, for at most %v\n",
		cfg.Addr, cfg.Conns, cfg.BodyLength, what, cfg.Trickle, cfg.Duration)
	rep, err := Attack(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Print(stdout)
	var problems []string
	if rep.Open > 0 {
		problems = append(problems, fmt.Sprintf("%d connections were neither answered nor closed", rep.Open))
	}
	if rep.Failed > 0 {
		problems = append(problems, fmt.Sprintf("%d connections could not be opened", rep.Failed))
	}
	if rep.PeakRSS >= *maxRSS {
		problems = append(problems, fmt.Sprintf("the server's VmRSS reached %s, the limit is %s", mb(rep.PeakRSS), mb(*maxRSS)))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintln(stdout, "ok: every connection was answered or closed, and the server's memory stayed bounded")
	return nil
}

// Config is one attack.
type Config struct {
	// Addr is the server's host:port; its host must be a loopback address.
	Addr string
	// Conns is how many connections to open (at most 10,000).
	Conns int
	// BodyLength is the Content-Length each announces.
	BodyLength int64
	// Trickle is the interval between two bytes of a body.
	Trickle time.Duration
	// Duration bounds the attack (at most 10 minutes).
	Duration time.Duration
	// OpenWithin bounds the time to open every connection.
	OpenWithin time.Duration
	// SlowHeaders trickles the header block (one byte of an endless
	// header field at a time) instead of the body.
	SlowHeaders bool
	// Memory, if set, reads the server's memory; it is sampled every
	// 100 ms.
	Memory func() (Memory, error)
}

// The requests the connections send, in turn: worker and operator
// routes, without a credential and with a well-formed token that no
// control plane issued.
var probes = []struct{ path, auth string }{
	{"/workers/heartbeat", ""},
	{"/workers/register", "Bearer nlc_3pHm0Tz4XkQ2bW9aVn7rYc1sLd5eUf8gJh6iKo0pMq2nNr4tSv6wUx8yZa1bCd3eFg5hIj7kLm9nOp"},
	{"/workers/jobs/job_01a2b3c4d5e6f708090a0b0c0d0e0f10/logs", ""},
	{"/operator/jobs", "Bearer nlc_notatoken"},
}

// Outcome is how one connection ended.
type Outcome struct {
	// Status is the answer's status, 0 if none came.
	Status int
	// Closed reports that the server closed the connection.
	Closed bool
	// After is when the connection was settled (answered and closed, or
	// closed), from its opening.
	After time.Duration
	// Sent is how many body bytes were sent.
	Sent int
	// Err is why the connection could not be opened, if it could not.
	Err error
}

// Report sums an attack up.
type Report struct {
	Conns    int
	Statuses map[int]int // answers by status
	// How the connections ended.
	AnsweredClosed   int // answered, then closed by the server
	AnsweredOpen     int // answered, left open (kept alive)
	ClosedUnanswered int // closed by the server without an answer (a timeout)
	Open             int // neither answered nor closed when the attack ended
	Failed           int // could not be opened
	// SlowestSettled is the longest a connection took to be settled;
	// MaxSent the most body bytes one connection got to send.
	SlowestSettled time.Duration
	MaxSent        int
	Elapsed        time.Duration
	// The server's VmRSS before, at its sampled peak and after the
	// attack, and its VmHWM after it (zero without Config.Memory).
	BeforeRSS, PeakRSS, AfterRSS, HWM int64
	Samples                           int
	MemoryErr                         error
	// Outcomes are the connections' outcomes, in the order opened.
	Outcomes []Outcome
	firstErr error
}

// Memory is a process's resident memory, in bytes.
type Memory struct{ RSS, HWM int64 }

var memLine = regexp.MustCompile(`(?m)^(VmRSS|VmHWM):\s+(\d+) kB$`)

// ReadMemory reads VmRSS and VmHWM of process pid from /proc.
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	for _, g := range memLine.FindAllSubmatch(b, -1) {
		kb, _ := strconv.ParseInt(string(g[2]), 10, 64)
		if string(g[1]) == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.HWM = kb << 10
		}
	}
	if m.RSS == 0 {
		return Memory{}, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}

// checkLoopback refuses an address that is not on loopback: this is a
// load program, for one's own machine only.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("%s is not a loopback address: slowloris attacks only this machine", addr)
		}
	}
	return nil
}

// Attack runs one attack and reports how every connection ended.
func Attack(ctx context.Context, cfg Config) (*Report, error) {
	switch {
	case cfg.Conns < 1 || cfg.Conns > maxConns:
		return nil, fmt.Errorf("conns must be 1 to %d", maxConns)
	case cfg.Duration <= 0 || cfg.Duration > maxDuration:
		return nil, fmt.Errorf("duration must be positive and at most %v", maxDuration)
	case cfg.Trickle <= 0:
		return nil, errors.New("trickle must be positive")
	case cfg.BodyLength < 1:
		return nil, errors.New("body must be positive")
	}
	if cfg.OpenWithin <= 0 {
		cfg.OpenWithin = 10 * time.Second
	}
	if err := checkLoopback(cfg.Addr); err != nil {
		return nil, err
	}
	rep := &Report{Conns: cfg.Conns, Statuses: map[int]int{}}
	if cfg.Memory != nil {
		m, err := cfg.Memory()
		if err != nil {
			return nil, fmt.Errorf("reading the server's memory: %w", err)
		}
		rep.BeforeRSS = m.RSS
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	start := time.Now()

	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if cfg.Memory == nil {
			return
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := cfg.Memory(); err == nil {
				rep.PeakRSS = max(rep.PeakRSS, m.RSS)
				rep.Samples++
			} else if rep.MemoryErr == nil {
				rep.MemoryErr = err
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	outs := make([]Outcome, cfg.Conns)
	var wg sync.WaitGroup
	// Opening is spread over OpenWithin, at most 200 dials at once, so
	// that the attack is the slow bodies, not a burst of dials.
	dials := make(chan struct{}, 200)
	gap := cfg.OpenWithin / time.Duration(cfg.Conns)
	for i := range cfg.Conns {
		select {
		case <-ctx.Done():
			outs[i].Err = ctx.Err()
			continue
		case dials <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = slowClient(ctx, cfg, probes[i%len(probes)].path, probes[i%len(probes)].auth, dials)
		}()
		time.Sleep(gap)
	}
	wg.Wait()
	cancel()
	<-sampled
	rep.Elapsed = time.Since(start)
	if cfg.Memory != nil {
		if m, err := cfg.Memory(); err == nil {
			rep.AfterRSS, rep.HWM = m.RSS, m.HWM
			rep.PeakRSS = max(rep.PeakRSS, m.RSS)
		}
	}
	rep.Outcomes = outs
	for _, o := range outs {
		switch {
		case o.Err != nil:
			rep.Failed++
			if rep.firstErr == nil {
				rep.firstErr = o.Err
			}
			continue
		case o.Status != 0 && o.Closed:
			rep.AnsweredClosed++
		case o.Status != 0:
			rep.AnsweredOpen++
		case o.Closed:
			rep.ClosedUnanswered++
		default:
			rep.Open++
		}
		if o.Status != 0 {
			rep.Statuses[o.Status]++
		}
		if o.Status != 0 || o.Closed {
			rep.SlowestSettled = max(rep.SlowestSettled, o.After)
		}
		rep.MaxSent = max(rep.MaxSent, o.Sent)
	}
	return rep, nil
}

// slowClient opens one connection, sends the request's headers and
// trickles its body until the server answers and closes, closes without
// answering, or the attack ends.
func slowClient(ctx context.Context, cfg Config, path, auth string, dials chan struct{}) Outcome {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	<-dials
	if err != nil {
		return Outcome{Err: err}
	}
	defer conn.Close()
	opened := time.Now()
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, cfg.Addr, cfg.BodyLength)
	if auth != "" {
		fmt.Fprintf(&head, "Authorization: %s\r\n", auth)
	}
	if cfg.SlowHeaders {
		head.WriteString("X-Slow: ")
	} else {
		head.WriteString("\r\n")
	}
	if _, err := conn.Write(head.Bytes()); err != nil {
		return Outcome{Closed: true, After: time.Since(opened)}
	}

	// The reader waits for an answer, then for the server to close.
	type read struct {
		status int
		closed bool
	}
	done := make(chan read, 1)
	go func() {
		var r read
		br := bufio.NewReader(conn)
		if resp, err := http.ReadResponse(br, nil); err == nil {
			r.status = resp.StatusCode
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		// Anything after the answer is read until the server closes.
		_, err := io.Copy(io.Discard, br)
		r.closed = err == nil || !errors.Is(err, net.ErrClosed)
		done <- r
	}()

	var out Outcome
	tick := time.NewTicker(cfg.Trickle)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			out.Status, out.Closed, out.After = r.status, r.closed, time.Since(opened)
			return out
		case <-ctx.Done():
			// The attack ended: whatever the reader saw, the connection is
			// still open.
			conn.Close()
			r := <-done
			out.Status = r.status
			return out
		case <-tick.C:
			if cfg.SlowHeaders || int64(out.Sent) < cfg.BodyLength {
				if _, err := conn.Write([]byte{'x'}); err == nil {
					out.Sent++
				}
			}
		}
	}
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "connections:          %d in %v\n", r.Conns, r.Elapsed.Round(time.Millisecond))
	var codes []int
	for c := range r.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		fmt.Fprintf(w, "  answered %d %-9s %d\n", c, http.StatusText(c)+":", r.Statuses[c])
	}
	fmt.Fprintf(w, "  answered, then closed by the server: %d\n", r.AnsweredClosed)
	fmt.Fprintf(w, "  answered, kept open:                 %d\n", r.AnsweredOpen)
	fmt.Fprintf(w, "  closed unanswered (a timeout):       %d\n", r.ClosedUnanswered)
	fmt.Fprintf(w, "  neither answered nor closed:         %d\n", r.Open)
	fmt.Fprintf(w, "  could not be opened:                 %d\n", r.Failed)
	if r.firstErr != nil {
		fmt.Fprintf(w, "    first error: %v\n", r.firstErr)
	}
	fmt.Fprintf(w, "slowest settled:      %v; most bytes trickled on one connection: %d\n", r.SlowestSettled.Round(time.Millisecond), r.MaxSent)
	if r.BeforeRSS > 0 {
		fmt.Fprintf(w, "server memory:        VmRSS %s before, %s at the peak (%d samples), %s after; VmHWM %s\n",
			mb(r.BeforeRSS), mb(r.PeakRSS), r.Samples, mb(r.AfterRSS), mb(r.HWM))
	}
	if r.MemoryErr != nil {
		fmt.Fprintf(w, "  reading memory failed: %v\n", r.MemoryErr)
	}
}

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// serverProc is an cmd/server this program started.
type serverProc struct {
	cmd  *exec.Cmd
	addr string
	dir  string
	done chan struct{}
}

var servingLine = regexp.MustCompile(`msg=serving addr=(\S+)`)

// startServer starts cmd/server (bin, or one built now) on a fresh
// SQLite database in a temporary directory, on a free loopback port, and
// waits until it serves.
func startServer(ctx context.Context, bin string, stderr io.Writer) (*serverProc, error) {
	dir, err := os.MkdirTemp("", "nodelane-slowloris-*")
	if err != nil {
		return nil, err
	}
	if bin == "" {
		bin = filepath.Join(dir, "server")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nodelane/nodelane/cmd/server")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("building cmd/server: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", "sqlite:"+filepath.Join(dir, "nodelane.db"),
		"-secrets-file", filepath.Join(dir, "secrets.json"), "-tokens-file", filepath.Join(dir, "tokens.json"))
	cmd.Stdout = io.Discard
	logs, err := cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &serverProc{cmd: cmd, dir: dir, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case p.addr = <-addr:
		fmt.Fprintf(stderr, "started cmd/server (pid %d) on %s\n", cmd.Process.Pid, p.addr)
		return p, nil
	case <-p.done:
		os.RemoveAll(dir)
		return nil, errors.New("cmd/server exited before serving")
	case <-time.After(60 * time.Second):
	case <-ctx.Done():
	}
	p.stop()
	return nil, errors.New("cmd/server did not start serving")
}

// stop ends the server (SIGTERM, then SIGKILL after 10 s) and removes
// its directory.
func (p *serverProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	os.RemoveAll(p.dir)
}
