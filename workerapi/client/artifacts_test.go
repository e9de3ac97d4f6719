package client_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Uploads and downloads of artifact bytes against the real Server
// (apitest on SQLite, a memory store) over HTTP, through upProxy, which
// streams every request to the Server and can cut one mid-body.

// partSize is the Server's part size in these tests: the smallest.
const partSize = workerapi.MinPartSize

// upProxy streams requests to an Env's handler. cut, when set, ends the
// path of the next request the proxy cuts after cutAfter bytes of its
// body (of its answer, for a GET): the connection is closed with no
// answer.
type upProxy struct {
	env *apitest.Env
	URL string

	mu       sync.Mutex
	cut      string
	cutAfter int64
	// gone ends the paths the proxy answers 404 not_found, as a server
	// without the route.
	gone string
	// hold, when set, ends the paths of PUTs the proxy holds unanswered
	// until their client goes away; held is told of each.
	hold  string
	held  chan string
	seen  map[string]int // requests by method and path
	order []string
}

func newUpProxy(t *testing.T, store workerapi.ArtifactStore) *upProxy {
	t.Helper()
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		if store != nil {
			c.Artifacts = workerapi.ArtifactConfig{Store: store, PartSize: partSize, MaxBytes: 1 << 30}
		}
		// A failed attempt runs again at once.
		c.Lease.RetryBase, c.Lease.RetryMax = time.Millisecond, time.Millisecond
	}))
	p := &upProxy{env: env, seen: map[string]int{}}
	h := env.Server.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Method + " " + r.URL.Path
		p.mu.Lock()
		p.seen[key]++
		p.order = append(p.order, key)
		cut := p.cut != "" && strings.HasSuffix(r.URL.Path, p.cut)
		if cut {
			p.cut = ""
		}
		after := p.cutAfter
		gone := p.gone != "" && strings.HasSuffix(r.URL.Path, p.gone)
		p.mu.Unlock()
		if r.Method == http.MethodPut && p.hold != "" && strings.HasSuffix(r.URL.Path, p.hold) {
			select {
			case p.held <- r.URL.Path:
			default:
			}
			// Read the body, so that the server notices when the client
			// goes away.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		if gone {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeNotFound,
				Message: "no route " + r.URL.Path, ServerTime: time.Now().UTC()}})
			return
		}
		if !cut {
			h.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodGet {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes()[:min(int64(rec.Body.Len()), after)])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		// The Server gets a body that breaks off, as a dropped
		// connection gives it; the worker gets no answer.
		r.Body = io.NopCloser(io.MultiReader(io.LimitReader(r.Body, after), errReader{}))
		h.ServeHTTP(httptest.NewRecorder(), r)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func (p *upProxy) count(method, path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[method+" "+path]
}

// leased registers a Client and leases (accepting) a job of type
// "status_check" with it.
func leased(t *testing.T, p *upProxy, node string, mod func(*client.Config)) (*client.Client, wire.Grant) {
	t.Helper()
	c := newClClient(t, p.URL, mod)
	if _, err := c.Register(context.Background(), p.env.ProvisioningToken, clRegistration(node)); err != nil {
		t.Fatal(err)
	}
	p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	lr, err := c.Lease(context.Background(), wire.LeaseRequest{MaxJobs: 1, Accept: true})
	if err != nil || len(lr.Leases) != 1 {
		t.Fatalf("lease: %v %+v", err, lr)
	}
	return c, lr.Leases[0]
}

// randomBytes returns n bytes, the same for the same seed.
func randomBytes(seed string, n int) []byte {
	out := make([]byte, 0, n+sha256.Size)
	s := sha256.Sum256([]byte(seed))
	for len(out) < n {
		out = append(out, s[:]...)
		s = sha256.Sum256(s[:])
	}
	return out[:n]
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// storedBytes reads an artifact back through the Server.
func storedBytes(t *testing.T, env *apitest.Env, id string) (*lease.Artifact, []byte) {
	t.Helper()
	a, rc, err := env.Server.OpenArtifact(context.Background(), id)
	if err != nil {
		t.Fatalf("OpenArtifact %s: %v", id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// TestUploadArtifact uploads artifacts of 0 bytes to a few parts through
// the control plane: each is recorded as stored with the bytes sent, in
// one PUT per part; and a file in the process is refused.
func TestUploadArtifact(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, artifacttest.NewMemory())
	c, g := leased(t, p, "node-up", nil)
	ctx := context.Background()
	for _, n := range []int{0, 1, partSize, 2*partSize + partSize/2 + 7} {
		data := randomBytes(fmt.Sprint(n), n)
		out, err := c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(n),
			client.ArtifactFile{Name: fmt.Sprintf("f%d.bin", n), Type: "file", Metadata: map[string]int{"n": n}})
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !out.Stored || out.ArtifactID == "" || out.ReceiptID == "" {
			t.Errorf("%d bytes: answer %+v", n, out)
		}
		a, got := storedBytes(t, p.env, out.ArtifactID)
		if !bytes.Equal(got, data) || a.SHA256 != hexSum(data) || a.SizeBytes != int64(n) || a.Object == "" {
			t.Errorf("%d bytes: stored %d bytes, artifact %+v", n, len(got), a)
		}
		parts := max(1, (n+partSize-1)/partSize)
		for i := 1; i <= parts; i++ {
			if got := p.countPart(t, g.Job.ID, i); got < 1 {
				t.Errorf("%d bytes: part %d sent %d times", n, i, got)
			}
		}
	}
	// A declared sum that is not the bytes' is refused, and nothing is
	// recorded.
	data := randomBytes("x", 1000)
	_, err := c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, bytes.NewReader(data), 1000,
		client.ArtifactFile{Name: "bad", Type: "file", SHA256: hexSum(data[1:])})
	if client.ErrorCode(err) != wire.CodeArtifactMismatch {
		t.Errorf("a wrong sum: %v", err)
	}
	// A lease token that is not the job's: lease_lost, before any part.
	_, err = c.UploadArtifact(ctx, g.Job.ID, "nlt_wrong", bytes.NewReader(data), 1000, client.ArtifactFile{Name: "x", Type: "file"})
	if !client.IsLeaseLost(err) && client.ErrorCode(err) != wire.CodeInvalidRequest {
		t.Errorf("a wrong lease token: %v", err)
	}
}

// countPart counts the PUTs of part n of any upload of job.
func (p *upProxy) countPart(t *testing.T, job string, n int) int {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	total := 0
	prefix := "PUT " + wire.JobPath(job, wire.ActionUploads) + "/"
	for k, v := range p.seen {
		if strings.HasPrefix(k, prefix) && strings.HasSuffix(k, "/parts/"+strconv.Itoa(n)) {
			total += v
		}
	}
	return total
}

// TestUploadArtifactResumesCutPart cuts the connection of part 2 midway
// through its body: the upload sends part 2 again, and only part 2, and
// completes with the right bytes.
func TestUploadArtifactResumesCutPart(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, artifacttest.NewMemory())
	c, g := leased(t, p, "node-cut", nil)
	data := randomBytes("cut", 3*partSize-5)
	p.mu.Lock()
	p.cut, p.cutAfter = "/parts/2", partSize/3
	p.mu.Unlock()
	done := make(chan error, 1)
	var out *wire.ArtifactResponse
	go func() {
		var err error
		out, err = c.UploadArtifact(context.Background(), g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(len(data)),
			client.ArtifactFile{Name: "model.bin", Type: "file"})
		done <- err
	}()
	if err := clWait(t, done, "the upload"); err != nil {
		t.Fatal(err)
	}
	if got := [3]int{p.countPart(t, g.Job.ID, 1), p.countPart(t, g.Job.ID, 2), p.countPart(t, g.Job.ID, 3)}; got != [3]int{1, 2, 1} {
		t.Errorf("PUTs of parts 1, 2, 3: %v, want [1 2 1]", got)
	}
	_, got := storedBytes(t, p.env, out.ArtifactID)
	if !bytes.Equal(got, data) {
		t.Errorf("stored %d bytes, not the %d sent", len(got), len(data))
	}
}

// TestUploadArtifactStorageOff checks that a Server without a store
// refuses an upload with artifact_storage_off, which the error says with
// ErrArtifactStorageOff, and takes the metadata-only report instead.
func TestUploadArtifactStorageOff(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, nil)
	c, g := leased(t, p, "node-off", nil)
	ctx := context.Background()
	data := []byte("weights")
	_, err := c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(len(data)), client.ArtifactFile{Name: "w", Type: "file"})
	if !errors.Is(err, client.ErrArtifactStorageOff) || client.ErrorCode(err) != wire.CodeArtifactStorageOff || client.IsRetryable(err) {
		t.Fatalf("upload without storage: %v", err)
	}
	sum, size := hexSum(data), int64(len(data))
	out, err := c.Artifact(ctx, g.Job.ID, wire.ArtifactRequest{LeaseToken: g.LeaseToken, ArtifactType: "file", Name: "w",
		URI: "file:///w", ChecksumSHA256: &sum, SizeBytes: &size})
	if err != nil || out.Stored {
		t.Fatalf("metadata-only report: %+v %v", out, err)
	}
	if _, _, err := p.env.Server.OpenArtifact(ctx, out.ArtifactID); err == nil {
		t.Error("a metadata-only artifact opened")
	}

	// A server older than the route stores no bytes either.
	old := newUpProxy(t, artifacttest.NewMemory())
	old.gone = "/" + wire.ActionUploads
	c, g = leased(t, old, "node-old", nil)
	_, err = c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(len(data)), client.ArtifactFile{Name: "w", Type: "file"})
	if !errors.Is(err, client.ErrArtifactStorageOff) || client.ErrorCode(err) != wire.CodeNotFound {
		t.Errorf("upload to an older server: %v", err)
	}
}

// presignStore is a memory store behind a fake bucket: its presigned
// URLs name its own HTTP server, with a signature in the query. The
// bucket refuses a request that carries a credential of the node or a
// bad signature, and can cut its next GET midway.
type presignStore struct {
	*artifacttest.Memory
	URL string
	key []byte

	mu     sync.Mutex
	puts   int
	gets   int
	leaks  []string
	cutGet bool
}

func newPresignStore(t *testing.T) *presignStore {
	t.Helper()
	s := &presignStore{Memory: artifacttest.NewMemory(), key: randomBytes(t.Name(), 32)}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func (s *presignStore) sign(method, key, exp string) string {
	m := hmac.New(sha256.New, s.key)
	fmt.Fprintf(m, "%s %s %s", method, key, exp)
	return hex.EncodeToString(m.Sum(nil))
}

func (s *presignStore) presign(method, key string, expiry time.Duration) string {
	exp := strconv.FormatInt(time.Now().Add(expiry).Unix(), 10)
	return s.URL + "/bucket/" + key + "?" + url.Values{"exp": {exp}, "sig": {s.sign(method, key, exp)}}.Encode()
}

func (s *presignStore) PresignPut(_ context.Context, key string, expiry time.Duration) (string, http.Header, error) {
	return s.presign(http.MethodPut, key, expiry), http.Header{"X-Bucket-Check": {"part"}}, nil
}

func (s *presignStore) PresignGet(_ context.Context, key string, expiry time.Duration) (string, error) {
	return s.presign(http.MethodGet, key, expiry), nil
}

func (s *presignStore) serve(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/bucket/")
	q := r.URL.Query()
	s.mu.Lock()
	for _, h := range []string{"Authorization", "Signature", "Signature-Input", "Content-Digest", wire.HeaderLeaseToken} {
		if r.Header.Get(h) != "" {
			s.leaks = append(s.leaks, r.Method+" "+h)
		}
	}
	cut := r.Method == http.MethodGet && s.cutGet
	if cut {
		s.cutGet = false
	}
	s.mu.Unlock()
	if !hmac.Equal([]byte(q.Get("sig")), []byte(s.sign(r.Method, key, q.Get("exp")))) {
		http.Error(w, "<Error><Code>SignatureDoesNotMatch</Code><SignatureProvided>secret</SignatureProvided></Error>", http.StatusForbidden)
		return
	}
	switch r.Method {
	case http.MethodPut:
		if r.Header.Get("X-Bucket-Check") != "part" {
			http.Error(w, "missing header", http.StatusBadRequest)
			return
		}
		if err := s.Put(r.Context(), key, r.Body, nil); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.mu.Lock()
		s.puts++
		s.mu.Unlock()
	case http.MethodGet:
		rc, err := s.Open(r.Context(), key, 0, -1)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		s.mu.Lock()
		s.gets++
		s.mu.Unlock()
		if cut {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	default:
		http.Error(w, "method", http.StatusMethodNotAllowed)
	}
}

// checkpointed leases a job, stores a checkpoint of data under it, fails
// the attempt as retryable and leases the job's next attempt, whose grant
// names the checkpoint.
func checkpointed(t *testing.T, p *upProxy, node string, data []byte, mod func(*client.Config)) (*client.Client, wire.Grant, *wire.ArtifactResponse) {
	t.Helper()
	ctx := context.Background()
	c, g := leased(t, p, node, mod)
	out, err := c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(len(data)),
		client.ArtifactFile{Name: "ckpt.bin", Type: wire.CheckpointType})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fail(ctx, g.Job.ID, wire.FailRequest{LeaseToken: g.LeaseToken, ErrorCode: "preempted", Message: "preempted", Retryable: true}); err != nil {
		t.Fatal(err)
	}
	var g2 wire.Grant
	waitForLease(t, c, &g2)
	if g2.Job.ID != g.Job.ID || g2.Job.Attempt != 2 || g2.Job.ResumeFrom == nil || g2.Job.ResumeFrom.ArtifactID != out.ArtifactID ||
		g2.Job.ResumeFrom.ChecksumSHA256 != hexSum(data) || g2.Job.ResumeFrom.SizeBytes != int64(len(data)) {
		t.Fatalf("the second grant: %+v (resume_from %+v), want resume_from %s", g2.Job, g2.Job.ResumeFrom, out.ArtifactID)
	}
	return c, g2, out
}

func waitForLease(t *testing.T, c *client.Client, g *wire.Grant) {
	t.Helper()
	for range 50 {
		lr, err := c.Lease(context.Background(), wire.LeaseRequest{MaxJobs: 1, Accept: true, WaitSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(lr.Leases) == 1 {
			*g = lr.Leases[0]
			return
		}
	}
	t.Fatal("no second lease")
}

// TestDownloadCheckpoint reads a checkpoint by the signed worker route:
// a transfer cut midway goes on with a Range request and gives the
// bytes; bytes that are not the declared ones are refused, and the file
// is removed.
func TestDownloadCheckpoint(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, artifacttest.NewMemory())
	data := randomBytes("ckpt", partSize+partSize/2)
	c, g, _ := checkpointed(t, p, "node-dl", data, nil)
	ctx := context.Background()
	p.mu.Lock()
	p.cut, p.cutAfter = "/content", partSize/2
	p.mu.Unlock()
	dst := filepath.Join(t.TempDir(), "ckpt.bin")
	if err := c.DownloadArtifact(ctx, g.Job.ID, g.LeaseToken, g.Job.ResumeFrom, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("downloaded %d bytes (%v), want the %d stored", len(b), err, len(data))
	}
	if n := p.count(http.MethodGet, wire.ArtifactContentPath(g.Job.ID, g.Job.ResumeFrom.ArtifactID)); n != 2 {
		t.Errorf("%d GETs, want 2 (one cut, one for the rest)", n)
	}
	// Declared bytes that are not the stored ones.
	wrong := *g.Job.ResumeFrom
	wrong.ChecksumSHA256 = hexSum(data[1:])
	if err := c.DownloadArtifact(ctx, g.Job.ID, g.LeaseToken, &wrong, dst); !errors.Is(err, client.ErrChecksumMismatch) {
		t.Errorf("a wrong checksum: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused file is left: %v", err)
	}
	// Another job's lease token reads nothing.
	if err := c.DownloadArtifact(ctx, g.Job.ID, "nlt_wrong", g.Job.ResumeFrom, dst); err == nil {
		t.Error("a download under a wrong lease token")
	}
}

// TestUploadArtifactDirect uploads through presigned URLs: the parts go
// to the bucket with the headers it asked for and no credential of the
// node, and a checkpoint comes back by its presigned GET, a cut transfer
// resumed, or from the control plane when the bucket refuses the URL
// (whose error, echoing its signature, stays out of the log).
func TestUploadArtifactDirect(t *testing.T) {
	t.Parallel()
	store := newPresignStore(t)
	p := newUpProxy(t, store)
	// A checkpoint of one part comes back by a presigned GET (one part
	// is one object).
	ckpt := randomBytes("direct", partSize/2)
	var logs syncbuf.Buffer
	c, g, out := checkpointed(t, p, "node-direct", ckpt, func(cfg *client.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if _, got := storedBytes(t, p.env, out.ArtifactID); !bytes.Equal(got, ckpt) {
		t.Fatalf("stored %d bytes, not the %d sent", len(got), len(ckpt))
	}
	if g.Job.ResumeFrom.URL == "" {
		t.Fatalf("resume_from has no presigned URL: %+v", g.Job.ResumeFrom)
	}
	store.mu.Lock()
	store.cutGet = true
	store.mu.Unlock()
	dst := filepath.Join(t.TempDir(), "ckpt")
	if err := c.DownloadArtifact(context.Background(), g.Job.ID, g.LeaseToken, g.Job.ResumeFrom, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, ckpt) {
		t.Errorf("downloaded %d bytes, not the %d stored", len(b), len(ckpt))
	}
	// An artifact of three parts: three PUTs to the bucket.
	data := randomBytes("direct", 2*partSize+3)
	out, err := c.UploadArtifact(context.Background(), g.Job.ID, g.LeaseToken, bytes.NewReader(data), int64(len(data)),
		client.ArtifactFile{Name: "big", Type: "file"})
	if err != nil {
		t.Fatal(err)
	}
	if _, got := storedBytes(t, p.env, out.ArtifactID); !bytes.Equal(got, data) {
		t.Fatalf("stored %d bytes, not the %d sent", len(got), len(data))
	}
	store.mu.Lock()
	puts, gets, leaks := store.puts, store.gets, store.leaks
	store.mu.Unlock()
	if puts != 4 || gets < 2 || len(leaks) > 0 {
		t.Errorf("%d PUTs to the bucket (want 4), %d GETs (want 2 at least); credentials sent to it: %q", puts, gets, leaks)
	}
	if n := p.countPart(t, g.Job.ID, 1); n != 0 {
		t.Errorf("%d parts sent to the control plane", n)
	}
	// A URL the bucket refuses (expired, say): the bytes come from the
	// control plane instead.
	bad := *g.Job.ResumeFrom
	bad.URL = strings.Replace(bad.URL, "sig=", "sig=0", 1)
	route := wire.ArtifactContentPath(g.Job.ID, bad.ArtifactID)
	before := p.count(http.MethodGet, route)
	if err := c.DownloadArtifact(context.Background(), g.Job.ID, g.LeaseToken, &bad, dst); err != nil {
		t.Fatalf("a refused presigned GET: %v", err)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, ckpt) || p.count(http.MethodGet, route) != before+1 {
		t.Errorf("after a refused presigned GET: %d bytes, %d GETs of the control plane", len(b), p.count(http.MethodGet, route)-before)
	}
	// The bucket's refusal, logged, names its code, never the URL's
	// signature nor what the bucket echoes.
	logged := logs.String()
	if !strings.Contains(logged, "SignatureDoesNotMatch") || strings.Contains(logged, "secret") || strings.Contains(logged, "sig=") {
		t.Errorf("the client's log:\n%s", logged)
	}
}

// TestRunnerUploadsAndResumes runs a handler through the Runner: its
// first attempt stores a checkpoint and fails; its second finds the
// checkpoint's bytes (Reporter.DownloadCheckpoint), uploads its output
// and completes, the upload finished before the completion was sent.
func TestRunnerUploadsAndResumes(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, artifacttest.NewMemory())
	dir := t.TempDir()
	ckpt := randomBytes("runner", partSize+11)
	output := randomBytes("output", 5000)
	if err := os.WriteFile(filepath.Join(dir, "ckpt"), ckpt, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter.bin"), output, 0o600); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan []byte, 1)
	cw := startClWorker(t, &clProxy{env: p.env, URL: p.URL}, "node-runner", nil, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			if r.ResumeFrom() == nil {
				if _, err := r.UploadArtifact(ctx, filepath.Join(dir, "ckpt"), client.ArtifactFile{Type: wire.CheckpointType}); err != nil {
					return err
				}
				return errors.New("preempted")
			}
			path, err := r.DownloadCheckpoint(ctx, t.TempDir())
			if err != nil {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			clSignal(resumed, b)
			_, err = r.UploadArtifact(ctx, filepath.Join(dir, "adapter.bin"), client.ArtifactFile{Type: "adapter"})
			return err
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check", MaxAttempts: 3})
	if b := clWait(t, resumed, "the second attempt"); !bytes.Equal(b, ckpt) {
		t.Errorf("the checkpoint read back has %d bytes, not the %d stored", len(b), len(ckpt))
	}
	var end client.JobEnd
	waitfor.Until(t, "the job's second attempt to end", func() bool {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		for _, e := range cw.ends {
			if e.Job.ID == j.ID && e.Outcome == client.JobFailed {
				t.Logf("attempt %d failed: %v", e.Job.Attempt, e.Err)
			}
			if e.Job.ID == j.ID && e.Outcome != client.JobFailed {
				end = e
				return true
			}
		}
		return false
	})
	if end.Outcome != client.JobSucceeded || end.Job.Attempt != 2 {
		t.Fatalf("the job ended %s at attempt %d: %v", end.Outcome, end.Job.Attempt, end.Err)
	}
	arts, err := p.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: j.ID})
	if err != nil {
		t.Fatal(err)
	}
	var adapter *lease.Artifact
	for _, a := range arts {
		if a.Type == "adapter" {
			adapter = a
		}
	}
	if adapter == nil || adapter.Name != "adapter.bin" || adapter.Object == "" {
		t.Fatalf("artifacts %+v", arts)
	}
	if _, got := storedBytes(t, p.env, adapter.ID); !bytes.Equal(got, output) {
		t.Errorf("the output stored is %d bytes, not the %d uploaded", len(got), len(output))
	}
	// The upload's finish came before the completion.
	p.mu.Lock()
	order := strings.Join(p.order, "\n")
	p.mu.Unlock()
	finish := strings.LastIndex(order, "POST "+wire.JobPath(j.ID, wire.ActionArtifacts))
	complete := strings.Index(order, "POST "+wire.JobPath(j.ID, "complete"))
	if finish < 0 || complete < 0 || finish > complete {
		t.Errorf("the artifact was finished at %d, the job completed at %d:\n%s", finish, complete, order)
	}
}

// TestUploadArtifactRefusesBadAnswers checks what the client does with
// upload answers it cannot use, from a fake control plane: it sends no
// part; and with parts refused: a final refusal is not sent again, a
// 503 is, at most MaxAttempts times.
func TestUploadArtifactRefusesBadAnswers(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		answer wire.UploadResponse
		status = http.StatusOK
		code   = ""
		puts   int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/uploads"):
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(answer)
		case r.Method == http.MethodPut:
			io.Copy(io.Discard, r.Body)
			puts++
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: "refused"}})
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	c := newClClient(t, srv.URL, func(cfg *client.Config) { cfg.MaxAttempts = 3 })
	data := randomBytes("bad", 100)
	part := func(n int, off, size int64, u string) wire.UploadPart {
		return wire.UploadPart{PartNumber: n, Offset: off, SizeBytes: size, Method: http.MethodPut, URL: u}
	}
	rel := func(n int) string { return wire.UploadPartPath("j", "upl_x", n) }
	for _, tc := range []struct {
		name string
		up   wire.UploadResponse
	}{
		{"no upload_id", wire.UploadResponse{Parts: []wire.UploadPart{part(1, 0, 100, rel(1))}}},
		{"no part", wire.UploadResponse{UploadID: "upl_x"}},
		{"too few bytes", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 99, rel(1))}}},
		{"too many bytes", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 60, rel(1)), part(2, 60, 60, rel(2))}}},
		{"a gap", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 50, rel(1)), part(2, 51, 49, rel(2))}}},
		{"out of order", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(2, 0, 100, rel(2))}}},
		{"not a PUT", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{{PartNumber: 1, SizeBytes: 100, Method: "POST", URL: rel(1)}}}},
		{"an absolute URL to the control plane", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 100, "https://elsewhere.example/x")}}},
		{"a route not a worker's", wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 100, "/operator/jobs")}}},
		{"a relative presigned URL", wire.UploadResponse{UploadID: "upl_x", Direct: true, Parts: []wire.UploadPart{part(1, 0, 100, rel(1))}}},
	} {
		mu.Lock()
		answer, puts = tc.up, 0
		mu.Unlock()
		_, err := c.UploadArtifact(context.Background(), "j", "nlt_x", bytes.NewReader(data), 100, client.ArtifactFile{Name: "a", Type: "file"})
		mu.Lock()
		n := puts
		mu.Unlock()
		if err == nil || !strings.Contains(err.Error(), "not usable") || n != 0 {
			t.Errorf("%s: %v, %d PUTs", tc.name, err, n)
		}
	}

	mu.Lock()
	answer = wire.UploadResponse{UploadID: "upl_x", Parts: []wire.UploadPart{part(1, 0, 100, rel(1))}}
	status, code, puts = http.StatusConflict, wire.CodeLeaseLost, 0
	mu.Unlock()
	_, err := c.UploadArtifact(context.Background(), "j", "nlt_x", bytes.NewReader(data), 100, client.ArtifactFile{Name: "a", Type: "file"})
	mu.Lock()
	n := puts
	status, code, puts = http.StatusServiceUnavailable, wire.CodeUnavailable, 0
	mu.Unlock()
	if !client.IsLeaseLost(err) || n != 1 {
		t.Errorf("a part refused lease_lost: %v, %d PUTs, want 1", err, n)
	}
	_, err = c.UploadArtifact(context.Background(), "j", "nlt_x", bytes.NewReader(data), 100, client.ArtifactFile{Name: "a", Type: "file"})
	mu.Lock()
	n = puts
	mu.Unlock()
	if client.ErrorCode(err) != wire.CodeUnavailable || n != 3 {
		t.Errorf("a part refused unavailable: %v, %d PUTs, want 3", err, n)
	}
}

// TestRunnerCancelAbortsUpload cancels a job whose handler is uploading:
// the part in flight is abandoned at once, the upload returns the job's
// cause, and the job ends canceled with no artifact recorded.
func TestRunnerCancelAbortsUpload(t *testing.T) {
	t.Parallel()
	p := newUpProxy(t, artifacttest.NewMemory())
	p.hold, p.held = "/parts/1", make(chan string, 1)
	path := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(path, randomBytes("cancel", 2*partSize), 0o600); err != nil {
		t.Fatal(err)
	}
	uploadErr := make(chan error, 1)
	cw := startClWorker(t, &clProxy{env: p.env, URL: p.URL}, "node-abort", nil, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			_, err := r.UploadArtifact(ctx, path, client.ArtifactFile{})
			uploadErr <- err
			return err
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, p.held, "the first part's PUT")
	if _, err := p.env.Server.Leases().Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	if err := clWait(t, uploadErr, "the upload to end"); !errors.Is(err, client.ErrJobCanceled) {
		t.Errorf("the upload ended with %v, want the job's cause", err)
	}
	if e := cw.end(t, j.ID); e.Outcome != client.JobCanceled {
		t.Errorf("the job ended %s: %v", e.Outcome, e.Err)
	}
	if arts, err := p.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: j.ID}); err != nil || len(arts) != 0 {
		t.Errorf("artifacts recorded: %+v %v", arts, err)
	}
}
