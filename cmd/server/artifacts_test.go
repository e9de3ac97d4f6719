package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
)

// With no -artifact-store, a server on SQLite keeps artifact bytes in the
// directory "artifacts" beside the database, which it creates 0700.
func TestArtifactStoreDefaultSQLite(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialect{Name: "sqlite", New: testdb.SQLite})
	s := serve(t, f.args("127.0.0.1:0")...)
	dir := filepath.Join(filepath.Dir(strings.TrimPrefix(f.db, "sqlite:")), "artifacts")
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("no artifact directory beside the database: %v", err)
	}
	if perm := fi.Mode().Perm(); !fi.IsDir() || perm != 0o700 {
		t.Errorf("%s: mode %v, want a directory 0700", dir, fi.Mode())
	}
	want := `msg="artifact store" store=file://` + filepath.ToSlash(dir) + " presigned=false max_artifact_bytes=10737418240"
	if !strings.Contains(s.stderr.String(), want) {
		t.Errorf("the log does not say %q:\n%s", want, s.stderr)
	}
}

// With PostgreSQL and no -artifact-store the server keeps no bytes, and
// says why: a directory of one replica is no store its replicas share.
func TestArtifactStoreDefaultPostgres(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialect{Name: "postgres", New: testdb.Postgres})
	s := serve(t, f.args("127.0.0.1:0")...)
	log := s.stderr.String()
	if !strings.Contains(log, `msg="artifact storage off: artifacts are metadata only" why="the database is PostgreSQL`) {
		t.Errorf("the log does not say the artifact storage is off because of PostgreSQL:\n%s", log)
	}
	if strings.Contains(log, `msg="artifact store"`) {
		t.Errorf("the log names an artifact store:\n%s", log)
	}
}

// -artifact-store takes a URL, a directory path, or off; the store's URL
// in the log carries no query (it may name an endpoint's parameters).
func TestArtifactStoreFlag(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "elsewhere", "bytes")
	tests := []struct {
		name, flag, want string
	}{
		{"directory", dir, `msg="artifact store" store=file://` + filepath.ToSlash(dir) + " "},
		{"file URL", "file://" + filepath.ToSlash(dir) + "2", `msg="artifact store" store=file://` + filepath.ToSlash(dir) + "2 "},
		{"memory", "mem://", `msg="artifact store" store=mem: presigned=false max_artifact_bytes=1048576`},
		{"off", "off", `msg="artifact storage off: artifacts are metadata only" why="-artifact-store off"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, testdb.Dialect{Name: "sqlite", New: testdb.SQLite})
			s := serve(t, append(f.args("127.0.0.1:0"), "-artifact-store", tc.flag, "-max-artifact-bytes", "1048576")...)
			if !strings.Contains(s.stderr.String(), tc.want) {
				t.Errorf("the log does not say %q:\n%s", tc.want, s.stderr)
			}
			if tc.name == "directory" {
				if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
					t.Errorf("the directory of -artifact-store DIR: %v, %v; want it created 0700", fi, err)
				}
			}
		})
	}
}

// A store that cannot open, or a limit that is not positive, stops the
// server before it serves.
func TestArtifactFlagsRefused(t *testing.T) {
	t.Parallel()
	blocker := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero limit", []string{"-max-artifact-bytes", "0"}, "-max-artifact-bytes must be positive"},
		{"negative limit", []string{"-max-artifact-bytes", "-5"}, "-max-artifact-bytes must be positive"},
		{"unknown scheme", []string{"-artifact-store", "nosuch://bucket"}, "nosuch"},
		{"file URL with a query", []string{"-artifact-store", "file:///tmp/x?metadata=skip"}, "takes no query parameters"},
		{"directory under a file", []string{"-artifact-store", filepath.Join(blocker, "sub")}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, testdb.Dialect{Name: "sqlite", New: testdb.SQLite})
			s, err := tryServe(t, append(f.args("127.0.0.1:0"), tc.args...)...)
			if err == nil {
				s.stop()
				t.Fatalf("the server started with %v", tc.args)
			}
			if !errors.Is(err, errArtifactFlag) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want an artifact store error naming %q", err, tc.want)
			}
		})
	}
}

func TestSQLitePath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dsn, path string
		sqlite    bool
	}{
		{"sqlite:nodelane.db", "nodelane.db", true},
		{"sqlite:/var/lib/nodelane/n.db?_pragma=busy_timeout(5000)", "/var/lib/nodelane/n.db", true},
		{"file:/srv/n.db?cache=shared", "/srv/n.db", true},
		{"file:///srv/n.db", "/srv/n.db", true},
		{"sqlite::memory:", "", true},
		{"file:x?mode=memory", "", true},
		{"postgres://u@h/db", "", false},
		{"postgresql://u@h/db", "", false},
	}
	for _, tc := range tests {
		if p, ok := sqlitePath(tc.dsn); p != tc.path || ok != tc.sqlite {
			t.Errorf("sqlitePath(%q) = %q, %v; want %q, %v", tc.dsn, p, ok, tc.path, tc.sqlite)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"s3://bucket?endpoint=http://127.0.0.1:9000&region=x": "s3://bucket",
		"azblob://user:secret@container/p?sv=sig":             "azblob://container/p",
		"file:///var/lib/nodelane/artifacts":                  "file:///var/lib/nodelane/artifacts",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStreamRoute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method, path string
		want         bool
	}{
		{"PUT", "/workers/jobs/job_1/uploads/upl_x.y/parts/3", true},
		{"GET", "/workers/jobs/job_1/artifacts/art_1/content", true},
		{"GET", "/operator/artifacts/art_1/content", true},
		{"HEAD", "/operator/artifacts/art_1/content", true},
		{"POST", "/workers/jobs/job_1/uploads", false},
		{"POST", "/workers/jobs/job_1/artifacts", false},
		{"GET", "/operator/artifacts", false},
		{"PUT", "/operator/artifacts/art_1/content", false},
		{"GET", "/operator/jobs/job_1", false},
	}
	for _, tc := range tests {
		r, err := http.NewRequest(tc.method, "http://cp"+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := streamRoute(r); got != tc.want {
			t.Errorf("streamRoute(%s %s) = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}

// The server's read and write timeouts bound a whole request; on the
// routes that move artifact bytes they bound a stall instead: a body that
// trickles in for longer than the read timeout is read whole, an answer
// that trickles out for longer than the write timeout is written whole,
// and the same on another route, or a body that stops, is cut.
func TestStreamDeadlines(t *testing.T) {
	t.Parallel()
	const (
		timeout = 300 * time.Millisecond
		chunks  = 12
		pace    = 60 * time.Millisecond // chunks × pace is well over timeout
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, n)
			return
		}
		for range chunks {
			// The pacing is the behaviour under test: an answer written
			// slowly but steadily.
			time.Sleep(pace)
			if _, err := w.Write(bytes.Repeat([]byte("x"), 1000)); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: streamDeadlines(h, timeout, timeout), ReadTimeout: timeout, WriteTimeout: timeout,
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	// trickle gives chunks of 1000 bytes, pausing before each; stallAfter
	// > 0 stops it after that many for three timeouts.
	put := func(path string, stallAfter int) (string, error) {
		pr, pw := io.Pipe()
		go func() {
			for i := range chunks {
				// The pacing is the behaviour under test: a body sent
				// slowly but steadily, or one that stalls.
				time.Sleep(pace)
				if stallAfter > 0 && i == stallAfter {
					time.Sleep(3 * timeout)
				}
				if _, err := pw.Write(bytes.Repeat([]byte("x"), 1000)); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, err := http.NewRequest(http.MethodPut, base+path, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = chunks * 1000
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return string(b), fmt.Errorf("%s", resp.Status)
		}
		return string(b), err
	}
	getAll := func(path string) (int, error) {
		resp, err := hc.Get(base + path)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return len(b), err
	}

	part := "/workers/jobs/job_1/uploads/upl_1/parts/1"
	if got, err := put(part, 0); err != nil || got != fmt.Sprint(chunks*1000) {
		t.Errorf("a slow part upload: %q, %v; want all %d bytes read", got, err, chunks*1000)
	}
	if got, err := put("/workers/jobs/job_1/logs", 0); err == nil {
		t.Errorf("a slow body on another route was read whole (%q): the read timeout no longer bounds it", got)
	}
	if got, err := put(part, 2); err == nil {
		t.Errorf("a part upload that stalled for 3 read timeouts was read whole (%q)", got)
	}
	if n, err := getAll("/operator/artifacts/art_1/content"); err != nil || n != chunks*1000 {
		t.Errorf("a slow download: %d bytes, %v; want %d", n, err, chunks*1000)
	}
	if n, err := getAll("/operator/jobs"); err == nil && n == chunks*1000 {
		t.Errorf("a slow answer on another route was written whole: the write timeout no longer bounds it")
	}
}
