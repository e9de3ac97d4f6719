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
//
// Two attacks use a valid credential (the provisioning token, read from
// the server's -tokens-file, or -token with -addr), to check each
// caller's share of what all callers share:
//
//	go run ./cmd/slowloris -attack authenticated-body   # register requests that send their body but the last byte, and hold it
//	go run ./cmd/slowloris -attack long-poll            # one registered node opens every connection as a lease long-poll
//
// Meanwhile it asks GET /healthz every 100 ms, each on a connection of
// its own, and exits non-zero if the p99 of those answers (one not
// answered within 10 s counts as 10 s) reached -max-healthz-p99.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
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
		maxP99    = fs.Duration("max-healthz-p99", time.Second, "fail if the p99 of GET /healthz during the attack reaches this")
		token     = fs.String("token", "", "with -addr and an authenticated -attack: the provisioning token")
	)
	fs.StringVar(&cfg.Attack, "attack", "", "the attack: slow bodies without a valid credential (default), authenticated-body or long-poll")
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
	if srv != nil {
		*token = srv.provisioningToken
	}
	switch cfg.Attack {
	case "":
	case AttackAuthenticatedBody, AttackLongPoll:
		if *token == "" {
			return fmt.Errorf("-attack %s needs the provisioning token (-token)", cfg.Attack)
		}
		cfg.Token = *token
	default:
		return fmt.Errorf("-attack %q: want authenticated-body or long-poll", cfg.Attack)
	}
	if *pid > 0 {
		cfg.Memory = func() (Memory, error) { return ReadMemory(*pid) }
	}
	switch what := "body"; {
	case cfg.Attack == AttackAuthenticatedBody:
		fmt.Fprintf(stdout, "attacking %s with %d register requests with the provisioning token, each sending %d bytes of body but the last, and holding it, for at most %v\n",
			cfg.Addr, cfg.Conns, cfg.BodyLength, cfg.Duration)
	case cfg.Attack == AttackLongPoll:
		fmt.Fprintf(stdout, "attacking %s with %d lease long-polls of one node, for at most %v\n", cfg.Addr, cfg.Conns, cfg.Duration)
	default:
		if cfg.SlowHeaders {
			what = "header block"
		}
		fmt.Fprintf(stdout, "attacking %s with %d connections announcing %d bytes, trickling the %s a byte every %v, for at most %v\n",
			cfg.Addr, cfg.Conns, cfg.BodyLength, what, cfg.Trickle, cfg.Duration)
	}
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
	if p99 := rep.HealthzP99(); p99 >= *maxP99 {
		problems = append(problems, fmt.Sprintf("the p99 of /healthz was %v, the limit is %v", p99.Round(time.Millisecond), *maxP99))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintln(stdout, "ok: every connection was answered or closed, the server's memory stayed bounded, and /healthz answered")
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
	// Attack, when set, is an attack with a valid credential instead:
	// AttackAuthenticatedBody or AttackLongPoll. Trickle and SlowHeaders
	// do not apply to it.
	Attack string
	// Token is the provisioning token the attacks with a credential use.
	Token string
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

// The attacks with a valid credential (Config.Attack).
const (
	// AttackAuthenticatedBody sends, on each connection, a register
	// request with the provisioning token and well-formed signature
	// fields, then its BodyLength bytes of body but the last, and holds
	// that one: what the server reads of bodies at once is bounded only
	// by its budget.
	AttackAuthenticatedBody = "authenticated-body"
	// AttackLongPoll registers one node, then sends, on each connection,
	// a lease long-poll of that node (60 s): what one node holds is
	// bounded only by its share of long-polls.
	AttackLongPoll = "long-poll"
)

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
	// Healthz are the times GET /healthz took during the attack, each on
	// a connection of its own (healthzTimeout for one not answered).
	Healthz []time.Duration
	// HealthzFailed counts those not answered 200.
	HealthzFailed int
	firstErr      error
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
	case cfg.Attack != "" && cfg.Token == "":
		return nil, fmt.Errorf("attack %s needs the provisioning token", cfg.Attack)
	}
	if cfg.OpenWithin <= 0 {
		cfg.OpenWithin = 10 * time.Second
	}
	if err := checkLoopback(cfg.Addr); err != nil {
		return nil, err
	}
	var request func() ([]byte, error)
	switch cfg.Attack {
	case "":
	case AttackAuthenticatedBody:
		request = func() ([]byte, error) { return registerHead(cfg) }
	case AttackLongPoll:
		var err error
		if request, err = longPolls(ctx, cfg); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown attack %q", cfg.Attack)
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

	probed := make(chan struct{})
	go func() {
		defer close(probed)
		rep.Healthz, rep.HealthzFailed = probeHealthz(ctx, cfg.Addr)
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
		var head []byte
		if request != nil {
			var err error
			if head, err = request(); err != nil {
				<-dials
				outs[i].Err = err
				continue
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if head != nil {
				outs[i] = heldClient(ctx, cfg, head, dials)
				return
			}
			outs[i] = slowClient(ctx, cfg, probes[i%len(probes)].path, probes[i%len(probes)].auth, dials)
		}()
		time.Sleep(gap)
	}
	wg.Wait()
	cancel()
	<-sampled
	<-probed
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

// dial opens one connection to cfg.Addr, then waits for its turn on
// dials, which paces the attack's connections.
func dial(ctx context.Context, cfg Config, dials chan struct{}) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	<-dials
	return conn, err
}

// slowClient opens one connection, sends the request's headers and
// trickles its body until the server answers and closes, closes without
// answering, or the attack ends.
func slowClient(ctx context.Context, cfg Config, path, auth string, dials chan struct{}) Outcome {
	conn, err := dial(ctx, cfg, dials)
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

// healthzTimeout is how long a GET /healthz of the attack may take.
const healthzTimeout = 10 * time.Second

// probeHealthz asks GET /healthz every 100 ms until ctx ends, each on a
// connection of its own, and returns how long each took and how many
// were not answered 200.
func probeHealthz(ctx context.Context, addr string) (took []time.Duration, failed int) {
	c := &http.Client{Timeout: healthzTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		start := time.Now()
		resp, err := c.Get("http://" + addr + "/healthz")
		d := time.Since(start)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if ctx.Err() != nil {
			// The attack ended while this one waited: it says nothing.
			return took, failed
		}
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			d = max(d, healthzTimeout)
		}
		took = append(took, d)
		select {
		case <-ctx.Done():
			return took, failed
		case <-tick.C:
		}
	}
}

// HealthzP99 is the 99th percentile of Healthz, 0 without any.
func (r *Report) HealthzP99() time.Duration {
	if len(r.Healthz) == 0 {
		return 0
	}
	d := slices.Clone(r.Healthz)
	slices.Sort(d)
	return d[(len(d)*99+99)/100-1]
}

// signedHead is the request line and header block of a signed POST of
// body to path with token, announcing length bytes of body.
func signedHead(addr, path, token string, key ed25519.PrivateKey, body []byte, length int64) ([]byte, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if err := replay.NewSigner(key, nil).Sign(req, body); err != nil {
		return nil, err
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", path, addr, length)
	if err := req.Header.Write(&head); err != nil {
		return nil, err
	}
	head.WriteString("\r\n")
	return head.Bytes(), nil
}

// registerHead is the head of a register request of a fresh node with
// the provisioning token, announcing BodyLength bytes: its signature
// fields are well formed, so that the server reads its body.
func registerHead(cfg Config) ([]byte, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(registerBody(pub))
	if err != nil {
		return nil, err
	}
	return signedHead(cfg.Addr, wire.PathRegister, cfg.Token, key, body, cfg.BodyLength)
}

func registerBody(pub ed25519.PublicKey) wire.RegisterRequest {
	id := base64.RawURLEncoding.EncodeToString(pub[:9])
	return wire.RegisterRequest{
		NodeID: "slowloris-" + id, Name: "slowloris", Hostname: "slowloris.local", Role: "local_gpu_compute",
		Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}},
		Version:      "slowloris/1", HeartbeatIntervalSeconds: 30,
		PublicKey: base64.RawURLEncoding.EncodeToString(pub),
	}
}

// longPolls registers one node and returns what makes each of its lease
// long-polls (60 s, signed with a fresh nonce), body included.
func longPolls(ctx context.Context, cfg Config) (func() ([]byte, error), error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(registerBody(pub))
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+cfg.Addr+wire.PathRegister, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	if err := replay.NewSigner(key, nil).Sign(req, body); err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("registering the node: %w", err)
	}
	defer resp.Body.Close()
	var out wire.RegisterResponse
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("registering the node: %d %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("registering the node: %w", err)
	}
	lease, err := json.Marshal(wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 1, WaitSeconds: wire.MaxWaitSeconds})
	if err != nil {
		return nil, err
	}
	return func() ([]byte, error) {
		head, err := signedHead(cfg.Addr, wire.PathLease, out.WorkerToken, key, lease, int64(len(lease)))
		return append(head, lease...), err
	}, nil
}

// heldClient opens one connection and sends head; with
// AttackAuthenticatedBody, then BodyLength bytes of body but the last,
// which it holds. It waits until the server answers and closes, closes
// without answering, or the attack ends.
func heldClient(ctx context.Context, cfg Config, head []byte, dials chan struct{}) Outcome {
	conn, err := dial(ctx, cfg, dials)
	if err != nil {
		return Outcome{Err: err}
	}
	defer conn.Close()
	opened := time.Now()
	done := make(chan Outcome, 1)
	go func() {
		var o Outcome
		br := bufio.NewReader(conn)
		if resp, err := http.ReadResponse(br, nil); err == nil {
			o.Status = resp.StatusCode
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		// A long-poll answered keeps its connection: the attack closes
		// it, as a client done with it would.
		if cfg.Attack == AttackLongPoll && o.Status != 0 {
			o.After = time.Since(opened)
			done <- o
			return
		}
		_, err := io.Copy(io.Discard, br)
		o.Closed = err == nil || !errors.Is(err, net.ErrClosed)
		o.After = time.Since(opened)
		done <- o
	}()
	var sent int
	if _, err := conn.Write(head); err == nil && cfg.Attack == AttackAuthenticatedBody {
		n, _ := conn.Write(bytes.Repeat([]byte{' '}, int(cfg.BodyLength-1)))
		sent = n
	}
	select {
	case o := <-done:
		o.Sent = sent
		if cfg.Attack == AttackLongPoll {
			o.Closed = true
		}
		return o
	case <-ctx.Done():
		conn.Close()
		o := <-done
		return Outcome{Status: o.Status, Sent: sent}
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
	if len(r.Healthz) > 0 {
		fmt.Fprintf(w, "GET /healthz:         %d asked, %d not answered 200; p99 %v, max %v\n",
			len(r.Healthz), r.HealthzFailed, r.HealthzP99().Round(time.Millisecond), slices.Max(r.Healthz).Round(time.Millisecond))
	}
}

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// serverProc is an cmd/server this program started.
type serverProc struct {
	cmd  *exec.Cmd
	addr string
	dir  string
	done chan struct{}
	// provisioningToken is the one the server minted on its first start.
	provisioningToken string
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
		b, err := os.ReadFile(filepath.Join(dir, "tokens.json"))
		var tok struct {
			ProvisioningToken string `json:"provisioning_token"`
		}
		if err == nil {
			err = json.Unmarshal(b, &tok)
		}
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("reading the server's tokens: %w", err)
		}
		p.provisioningToken = tok.ProvisioningToken
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
