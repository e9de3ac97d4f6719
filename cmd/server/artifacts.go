package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/blobstore"
	"github.com/nodelane/nodelane/workerapi"
)

// artifactFlags are the flags of the artifact store.
type artifactFlags struct {
	store     string
	maxBytes  int64
	noPresign bool
}

func artifactFlagsOn(fs *flag.FlagSet) *artifactFlags {
	a := &artifactFlags{}
	fs.StringVar(&a.store, "artifact-store", "", "where artifact bytes are kept: file:///dir, a directory path, s3://bucket?region=…&endpoint=…, gs://bucket, azblob://container, or off "+
		"(default: the directory \"artifacts\" beside the SQLite database, created 0700; with PostgreSQL, off: replicas need a store they share)")
	fs.Int64Var(&a.maxBytes, "max-artifact-bytes", workerapi.DefaultMaxArtifactBytes, "the largest artifact a worker may upload, in bytes")
	fs.BoolVar(&a.noPresign, "artifact-no-presign", false, "never hand workers presigned URLs of the store: every byte passes through this server (a bucket the workers cannot reach)")
	return a
}

// errArtifactFlag is wrapped by the errors of the artifact flags.
var errArtifactFlag = errors.New("artifact store")

// check checks the flags that need no I/O.
func (a *artifactFlags) check() error {
	if a.maxBytes <= 0 {
		return fmt.Errorf("%w: -max-artifact-bytes must be positive (%d)", errArtifactFlag, a.maxBytes)
	}
	return nil
}

// storeURL returns the URL of the store the flags choose for the
// database dsn, "" for none, and why when the default chose none.
func (a *artifactFlags) storeURL(dsn string) (u, why string, err error) {
	switch s := a.store; {
	case s == "off":
		return "", "-artifact-store off", nil
	case strings.Contains(s, "://"):
		return s, "", nil
	case s != "":
		abs, err := filepath.Abs(s)
		if err != nil {
			return "", "", fmt.Errorf("%w: %w", errArtifactFlag, err)
		}
		return fileURL(abs), "", nil
	}
	path, ok := sqlitePath(dsn)
	if !ok {
		return "", "the database is PostgreSQL: the replicas of a control plane need an artifact store they share (-artifact-store s3://…)", nil
	}
	dir := "artifacts"
	if path != "" {
		dir = filepath.Join(filepath.Dir(path), "artifacts")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", errArtifactFlag, err)
	}
	return fileURL(abs), "", nil
}

func fileURL(abs string) string {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String()
}

// sqlitePath returns the file of a SQLite DSN ("" for an in-memory
// database), and false for another database.
func sqlitePath(dsn string) (string, bool) {
	p, ok := strings.CutPrefix(dsn, "sqlite:")
	if !ok {
		if p, ok = strings.CutPrefix(dsn, "file:"); !ok {
			return "", false
		}
	}
	p, query, _ := strings.Cut(p, "?")
	if strings.HasPrefix(p, "//") {
		p = p[2:]
		if i := strings.IndexByte(p, '/'); i >= 0 {
			p = p[i:]
		}
	}
	if p == "" || p == ":memory:" || strings.Contains(query, "mode=memory") {
		return "", true
	}
	return p, true
}

// open opens the store the flags choose and returns the Server's
// artifact settings, and what closes the store.
func (a *artifactFlags) open(ctx context.Context, dsn string, log *slog.Logger) (workerapi.ArtifactConfig, io.Closer, error) {
	cfg := workerapi.ArtifactConfig{MaxBytes: a.maxBytes, NoPresign: a.noPresign}
	u, why, err := a.storeURL(dsn)
	if err != nil {
		return cfg, nil, err
	}
	if u == "" {
		log.Warn("artifact storage off: artifacts are metadata only", "why", why)
		return cfg, io.NopCloser(nil), nil
	}
	store, bucket, err := blobstore.Open(ctx, u, blobstore.Options{NoPresign: a.noPresign})
	if err != nil {
		return cfg, nil, fmt.Errorf("%w: %w", errArtifactFlag, err)
	}
	cfg.Store = store
	_, presigns := store.(workerapi.ArtifactPresigner)
	log.Info("artifact store", "store", redactURL(u), "presigned", presigns && !a.noPresign, "max_artifact_bytes", a.maxBytes)
	return cfg, bucket, nil
}

// redactURL is u without its query and user information, for the log.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	p.User, p.RawQuery, p.Fragment = nil, "", ""
	return p.String()
}

// streamRoute reports whether r moves artifact bytes: a part upload or
// a content download, which may take longer than -read-timeout and
// -write-timeout allow a whole request.
func streamRoute(r *http.Request) bool {
	p := r.URL.Path
	switch r.Method {
	case http.MethodPut:
		return strings.HasPrefix(p, "/workers/jobs/") && strings.Contains(p, "/uploads/") && strings.Contains(p, "/parts/")
	case http.MethodGet, http.MethodHead:
		return strings.HasSuffix(p, "/content") && (strings.HasPrefix(p, "/workers/jobs/") || strings.HasPrefix(p, "/operator/artifacts/"))
	}
	return false
}

// streamDeadlines lets the requests of streamRoute run as long as their
// bytes move: the read and write deadlines (-read-timeout,
// -write-timeout) are pushed on as the body is read and the answer
// written, so a transfer that stalls for that long still ends, and a
// slow but steady one does not.
func streamDeadlines(h http.Handler, read, write time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !streamRoute(r) || (read <= 0 && write <= 0) {
			h.ServeHTTP(w, r)
			return
		}
		d := &deadlines{rc: http.NewResponseController(w), read: read, write: write}
		d.push(time.Now())
		r.Body = &progressBody{ReadCloser: r.Body, d: d}
		h.ServeHTTP(&progressWriter{ResponseWriter: w, d: d}, r)
	})
}

// deadlines pushes a connection's deadlines on, at most every tenth of
// their span (a deadline is a timer reset, not free on every read). A
// store may read the body from a goroutine of its own.
type deadlines struct {
	rc          *http.ResponseController
	read, write time.Duration

	mu     sync.Mutex
	pushed time.Time
}

func (d *deadlines) push(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now.Sub(d.pushed) < min(nonZero(d.read), nonZero(d.write))/10 {
		return
	}
	d.pushed = now
	if d.read > 0 {
		_ = d.rc.SetReadDeadline(now.Add(d.read))
	}
	if d.write > 0 {
		// An upload answers once its body is read: its write deadline
		// moves with the body too.
		_ = d.rc.SetWriteDeadline(now.Add(d.write))
	}
}

func nonZero(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Duration(1<<63 - 1)
	}
	return d
}

type progressBody struct {
	io.ReadCloser
	d *deadlines
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.d.push(time.Now())
	}
	return n, err
}

type progressWriter struct {
	http.ResponseWriter
	d *deadlines
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.d.push(time.Now())
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *progressWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
