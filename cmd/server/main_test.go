package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// startTimeout bounds a server's start (CI runs on two slow cores).
const startTimeout = time.Minute

// files are one control plane's database and secrets file.
type files struct{ db, secrets, tokens string }

// newFiles makes the files of a new control plane on a fresh database of
// dialect d.
func newFiles(t *testing.T, d testdb.Dialect) files {
	dir := t.TempDir()
	return files{db: d.New(t).DSN, secrets: filepath.Join(dir, "secrets.json"), tokens: filepath.Join(dir, "tokens.json")}
}

func (f files) args(addr string) []string {
	return []string{"-addr", addr, "-db", f.db, "-secrets-file", f.secrets, "-tokens-file", f.tokens}
}

// server is run serving in this process.
type server struct {
	addr           string
	stdout, stderr *syncbuf.Buffer
	stop           func() error
}

// serve runs the server with args and waits until it serves (its
// "serving" log line, which names the address), or fails the test with
// the error it returned.
func serve(t *testing.T, args ...string) *server {
	t.Helper()
	s, err := tryServe(t, args...)
	if err != nil {
		t.Fatalf("the server did not start: %v", err)
	}
	return s
}

func tryServe(t *testing.T, args ...string) (*server, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, s.stdout, pw)
		pw.Close()
		done <- err
	}()
	addrs := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=serving addr=(\S+)`)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.stderr.Write(append(sc.Bytes(), '\n'))
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s.addr = <-addrs:
	case err := <-done:
		cancel()
		return nil, err
	case <-timer.C:
		cancel()
		t.Fatalf("the server did not start within %v:\n%s", startTimeout, s.stderr)
	}
	var once sync.Once
	var stopErr error
	s.stop = func() error {
		once.Do(func() {
			cancel()
			stopErr = <-done
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("the server returned %v", err)
		}
	})
	return s, nil
}

// get sends a GET with a bearer token and decodes the answer into out.
func get(t *testing.T, addr, token, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

var tokenLine = regexp.MustCompile(`(?m)^operator token: +(\S+)$`)

// operatorToken is the operator token the server printed.
func operatorToken(t *testing.T, stdout string) string {
	t.Helper()
	m := tokenLine.FindAllStringSubmatch(stdout, -1)
	if len(m) != 1 {
		t.Fatalf("%d operator token lines on stdout, want 1", len(m))
	}
	return m[0][1]
}

// TestBusyPortBootstrapsNothing checks that a server started on a busy
// port against a fresh database fails before it bootstraps: the next
// start, on a free port, mints and prints the tokens.
func TestBusyPortBootstrapsNothing(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, d)
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			var stdout, stderr syncbuf.Buffer
			err = run(context.Background(), f.args(busy.Addr().String()), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("on a busy port: %v, want address already in use", err)
			}
			if stdout.String() != "" {
				t.Fatalf("printed on a busy port: %q", stdout.String())
			}
			if _, err := os.Stat(f.tokens); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("tokens file after a busy port: %v", err)
			}

			s := serve(t, f.args("127.0.0.1:0")...)
			tok := operatorToken(t, s.stdout.String())
			if !strings.Contains(s.stdout.String(), "provisioning token: nlc_") {
				t.Fatalf("no provisioning token printed")
			}
			if code := get(t, s.addr, tok, "/operator/envelope", nil); code != http.StatusOK {
				t.Fatalf("GET /operator/envelope with the printed token: %d", code)
			}
		})
	}
}

// runMint runs the mint-operator subcommand.
func runMint(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut syncbuf.Buffer
	err = run(context.Background(), append([]string{"mint-operator"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestMintOperator checks that mint-operator mints a working operator
// token with its receipt, prints it once on stdout and logs it nowhere;
// it refuses secrets that are not the database's, a missing secrets file,
// and a database never bootstrapped.
func TestMintOperator(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, d)

			// Never bootstrapped.
			if _, err := controlplane.LoadOrCreateSecrets(f.secrets, receipts.DefaultOrigin); err != nil {
				t.Fatal(err)
			}
			out, _, err := runMint(t, "-db", f.db, "-secrets-file", f.secrets)
			if !errors.Is(err, workerapi.ErrNotBootstrapped) || out != "" {
				t.Fatalf("on a fresh database: %v %q, want ErrNotBootstrapped", err, out)
			}

			s := serve(t, f.args("127.0.0.1:0")...)
			first := operatorToken(t, s.stdout.String())

			// A missing secrets file is not created; another one is refused.
			missing := filepath.Join(t.TempDir(), "missing.json")
			if out, _, err := runMint(t, "-db", f.db, "-secrets-file", missing); !errors.Is(err, fs.ErrNotExist) || out != "" {
				t.Fatalf("missing secrets file: %v %q", err, out)
			}
			if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("mint-operator created the secrets file: %v", err)
			}
			other := filepath.Join(t.TempDir(), "other.json")
			if _, err := controlplane.LoadOrCreateSecrets(other, receipts.DefaultOrigin); err != nil {
				t.Fatal(err)
			}
			if out, _, err := runMint(t, "-db", f.db, "-secrets-file", other); !errors.Is(err, fingerprint.ErrMismatch) || out != "" {
				t.Fatalf("other secrets: %v %q", err, out)
			}
			for _, bad := range [][]string{{"-ttl", "0s"}, {"-ttl", "9000h"}, {"extra"}} {
				if out, _, err := runMint(t, append([]string{"-db", f.db, "-secrets-file", f.secrets}, bad...)...); err == nil || out != "" {
					t.Errorf("mint-operator %v: %v %q", bad, err, out)
				}
			}

			// The break-glass, while the server runs.
			out, logs, err := runMint(t, "-db", f.db, "-secrets-file", f.secrets, "-ttl", "1h")
			if err != nil {
				t.Fatal(err)
			}
			tok := operatorToken(t, out)
			if tok == first || !strings.HasPrefix(tok, "nlc_") {
				t.Fatalf("minted %q", out)
			}
			if strings.Contains(logs, tok) || strings.Contains(logs, "nlc_") {
				t.Fatalf("mint-operator logged the token: %s", logs)
			}
			m := regexp.MustCompile(`receipt_id=(rcp_[0-9a-f]+)`).FindStringSubmatch(logs)
			if m == nil {
				t.Fatalf("no receipt id logged: %s", logs)
			}
			var rr struct {
				Receipt struct {
					Body []byte `json:"body"`
				} `json:"receipt"`
			}
			if code := get(t, s.addr, tok, "/operator/receipts/"+m[1], &rr); code != http.StatusOK {
				t.Fatalf("GET its receipt with the minted token: %d", code)
			}
			var r map[string]any
			if err := json.Unmarshal(rr.Receipt.Body, &r); err != nil {
				t.Fatal(err)
			}
			if r["kind"] != "credential_minted" || r["principal_id"] != workerapi.OperatorPrincipal || r["actor"] != "system" ||
				!strings.Contains(r["scopes"].(string), "operator:credentials") {
				t.Errorf("receipt %v", r)
			}
			if strings.Contains(s.stderr.String(), tok) {
				t.Error("the server logged the minted token")
			}
		})
	}
}

// TestReplicaWithOtherSecretsRefuses checks that a replica started with
// another secrets file on the same database refuses to start and names
// what differs; the database's secrets file still starts.
func TestReplicaWithOtherSecretsRefuses(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, d)
			s := serve(t, f.args("127.0.0.1:0")...)
			s.stop()

			other := f
			other.secrets = filepath.Join(t.TempDir(), "other.json")
			_, err := tryServe(t, other.args("127.0.0.1:0")...)
			var me *fingerprint.MismatchError
			if !errors.As(err, &me) || !strings.Contains(err.Error(), "credential pepper 1") || !strings.Contains(err.Error(), "receipt signing key") {
				t.Fatalf("another secrets file: %v, want a mismatch of the pepper and the receipt key", err)
			}
			serve(t, f.args("127.0.0.1:0")...)
		})
	}
}

// TestStopLetsRequestsFinish checks that a request in flight when the
// server is told to stop finishes with its answer: it is not canceled
// (which, racing its commit, would answer 503 for a job that was queued).
func TestStopLetsRequestsFinish(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialect{Name: "sqlite", New: testdb.SQLite})
	s := serve(t, f.args("127.0.0.1:0")...)
	token := operatorToken(t, s.stdout.String())

	body := `{"job_type":"status_check"}`
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	// A first request on the connection, so that the server has accepted
	// it before it is told to stop.
	if _, err := fmt.Fprintf(conn, "GET /readyz HTTP/1.1\r\nHost: %s\r\n\r\n", s.addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Then headers that ask to continue: the server answers 100 Continue
	// once the handler reads the body, so the request is in flight (the
	// connection no longer counts as idle). Then half the body.
	head := fmt.Sprintf("POST /operator/jobs HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", s.addr, token, len(body))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	if resp, err = http.ReadResponse(rd, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("the answer to the headers: %v %v, want 100 Continue", resp, err)
	}
	if _, err := io.WriteString(conn, body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.stop() }()
	// Once the server no longer accepts connections it is shutting down.
	waitfor.Until(t, "the server to stop accepting connections", func() bool {
		c, err := net.Dial("tcp", s.addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if _, err := io.WriteString(conn, body[len(body)/2:]); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v; server log:\n%s", err, s.stderr)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("the request in flight got %d %s, want 201", resp.StatusCode, b)
	}
	if err := <-stopped; err != nil {
		t.Errorf("the server returned %v", err)
	}
}

// TestSafeTypeFlag checks -safe-type: the envelope lists the type as safe,
// so a job of it runs without an activation, and a canonical blocked
// type given to it stops the server before it serves, naming the type.
func TestSafeTypeFlag(t *testing.T) {
	t.Parallel()
	d := testdb.Dialects()[0] // SQLite: the flag is the same on either
	f := newFiles(t, d)
	s := serve(t, append(f.args("127.0.0.1:0"), "-safe-type", "eval_run", "-safe-type", "my_probe")...)
	var env struct {
		SafeTypes        []string `json:"safe_types"`
		BlockedTypes     []string `json:"blocked_types"`
		RuntimeSafeTypes []string `json:"runtime_safe_types"`
	}
	if st := get(t, s.addr, operatorToken(t, s.stdout.String()), "/operator/envelope", &env); st != http.StatusOK {
		t.Fatalf("GET /operator/envelope: %d", st)
	}
	if !slices.Contains(env.SafeTypes, "eval_run") || !slices.Contains(env.SafeTypes, "my_probe") || slices.Contains(env.SafeTypes, "raw_training") || len(env.RuntimeSafeTypes) != 0 {
		t.Fatalf("the envelope with -safe-type eval_run -safe-type my_probe: %+v", env)
	}
	s.stop()

	g := newFiles(t, d)
	_, err := tryServe(t, append(g.args("127.0.0.1:0"), "-safe-type", "eval_run", "-safe-type", "raw_training")...)
	if err == nil || !strings.Contains(err.Error(), "raw_training") {
		t.Fatalf("-safe-type raw_training: %v, want an error naming it", err)
	}
}
