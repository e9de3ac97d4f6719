//go:build linux

package cmd

// End-to-end tests of artifact bytes (issue 27) with real processes: a
// cmd/worker -config runs commands that print nodelane:artifact lines,
// the worker uploads the files to a cmd/server that stores them, on
// SQLite and on PostgreSQL, and the test reads them back from the
// operator content route with plain net/http; a checkpoint stored by a
// worker killed with SIGKILL reaches the next attempt's command at
// NODELANE_RESUME_FROM.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// artifactCluster starts a control plane on a fresh database of dialect d
// that stores artifact bytes in store (a directory when it is "").
func artifactCluster(t *testing.T, d testdb.Dialect, store string, args ...string) *cluster {
	t.Helper()
	db := d.New(t) // before the server, so that its cleanup runs after the server is gone
	if store == "" {
		store = "file://" + filepath.Join(t.TempDir(), "artifacts")
	}
	// Leases of 15 s, not the cluster's 3 s, and a worker offline after
	// 15 s of silence, not 3 heartbeat intervals: a job here hashes and
	// uploads 64 MiB, and a machine loaded by the other tests can hold
	// its heartbeats for longer than 3 s (then the worker stops the job
	// and the next attempt runs: CI saw a 2.5 s stall end the first
	// attempt of both resume tests at once).
	c := newCluster(t, append([]string{"-db", db.DSN, "-heartbeat-interval", "1s", "-lease-ttl", "15s", "-offline-after", "15s", "-artifact-store", store}, args...)...)
	c.activate()
	t.Cleanup(c.checkNoTokensLogged)
	return c
}

// content GETs path with the operator token and the request headers h.
func (c *cluster) content(path string, h http.Header) (*http.Response, []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base()+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.tokens.OperatorToken)
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("GET %s: reading: %v", path, err)
	}
	return resp, b
}

// runFile returns the bytes of the file rel in the output directory of
// the job's attempt on node's worker.
func (c *cluster) runFile(node, jobID string, attempt int, rel string) []byte {
	c.t.Helper()
	m, _ := filepath.Glob(filepath.Join(c.dir, "work-"+node, "runs", fmt.Sprintf("%s-a%d-*", jobID, attempt), "output", rel))
	if len(m) != 1 {
		c.t.Fatalf("the output file %s of job %s attempt %d: %q", rel, jobID, attempt, m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// storedArtifact waits for the job's artifact named name to be stored,
// and returns it.
func (c *cluster) storedArtifact(jobID, name string) wire.ArtifactView {
	c.t.Helper()
	var out wire.ArtifactView
	waitfor.Within(c.t, jobTimeout, "artifact "+name+" of job "+jobID+" stored", func() bool {
		var l wire.ArtifactListResponse
		if c.try("GET", "/operator/artifacts?job_id="+jobID, nil, &l) != nil {
			return false
		}
		for _, a := range l.Artifacts {
			if a.Name == name && a.Stored {
				out = a
				return true
			}
		}
		return false
	})
	return out
}

// bigScript writes 64 MiB of random bytes and reports them as an artifact.
const bigScript = `
head -c 67108864 /dev/urandom > "$NODELANE_OUTPUT_DIR/weights.bin"
echo 'nodelane:artifact {"name": "weights.bin", "path": "weights.bin", "kind": "adapter", "metadata": {"rank": 8}}'
echo done
`

// TestE2EArtifactUpload runs a command that writes a 64 MiB file and
// prints nodelane:artifact: the worker uploads it, the job succeeds once
// it is stored, and the operator content route gives the same bytes,
// whose sha256 the artifact_reported receipt carries; a Range request
// gives 206 and the slice.
func TestE2EArtifactUpload(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			c := artifactCluster(t, d, "")
			checkUpload(t, c, false)
		})
	}
}

// checkUpload runs bigScript on a worker of c and checks what the
// control plane serves.
//
// With direct, the parts must go to the store's presigned URLs: none
// passes through the control plane.
func checkUpload(t *testing.T, c *cluster, direct bool) {
	t.Helper()
	dir := t.TempDir()
	big := script(t, dir, "big.sh", bigScript)
	p := newCutProxy(t, c.base(), -1)
	c.startCommandWorker("art-node", fmt.Sprintf("[[job]]\ntype = \"art_big\"\ncommand = [%q]\ngpus = 0\n", big),
		"-gpu", "rtx-4090:24576", "-server", p.URL)
	d := c.dispatch("art_big", nil)
	jd := c.waitDone(d.Job.ID, "succeeded")
	want := c.runFile("art-node", d.Job.ID, jd.Job.Attempt, "weights.bin") // a stalled machine may lose the first attempt
	if len(want) != 64<<20 {
		t.Fatalf("the command wrote %d bytes", len(want))
	}
	if len(jd.Artifacts) != 1 || !jd.Artifacts[0].Stored || jd.Artifacts[0].ContentURL == nil {
		t.Fatalf("the job's artifacts: %+v", jd.Artifacts)
	}
	a := jd.Artifacts[0]
	if a.SizeBytes != int64(len(want)) || a.ChecksumSHA256 == nil || *a.ChecksumSHA256 != sha(want) || a.ArtifactType != "adapter" {
		t.Errorf("artifact %+v, want %d bytes of sha256 %s", a, len(want), sha(want))
	}
	if *a.ContentURL != wire.OperatorArtifactContentPath(a.ArtifactID) {
		t.Errorf("content_url %q", *a.ContentURL)
	}
	resp, got := c.content(*a.ContentURL, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		t.Fatalf("GET %s: %d, %d bytes (sha256 %s), want the %d written (sha256 %s)", *a.ContentURL, resp.StatusCode, len(got), sha(got), len(want), sha(want))
	}
	if et := resp.Header.Get("ETag"); et != `"`+sha(want)+`"` {
		t.Errorf("ETag %q", et)
	}
	// The receipt, verified offline, carries the stored bytes' sum.
	if a.ReceiptID == nil {
		t.Fatal("the artifact has no receipt")
	}
	r := c.verifyReceipt(*a.ReceiptID)
	if r.Kind != receipts.KindArtifactReported || r.ChecksumSHA256 != sha(got) || r.SizeBytes != int64(len(got)) {
		t.Errorf("receipt %s: %s, sha256 %s, %d bytes; want the stored %s, %d bytes", r.ID, r.Kind, r.ChecksumSHA256, r.SizeBytes, sha(got), len(got))
	}
	// A range.
	resp, part := c.content(*a.ContentURL, http.Header{"Range": {"bytes=40000000-40099999"}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(part, want[40000000:40100000]) ||
		resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 40000000-40099999/%d", len(want)) {
		t.Errorf("Range: %d, %d bytes, Content-Range %q", resp.StatusCode, len(part), resp.Header.Get("Content-Range"))
	}
	if puts, _ := p.requests(); direct != (len(puts) == 0) {
		t.Errorf("part PUTs through the control plane: %q (direct %v)", puts, direct)
	}
	// Its uri says where it was written on the box.
	if !strings.HasPrefix(a.URI, "file://") || !strings.HasSuffix(a.URI, "/output/weights.bin") {
		t.Errorf("the stored artifact's uri %q", a.URI)
	}
}

// cutProxy passes requests to the control plane unchanged, Host
// included (the worker's signatures cover @authority), and counts the
// part PUTs and the content GETs; with cutAfter 0 or more it cuts the
// first PUT of an upload part: the control plane gets its first cutAfter
// bytes and then a broken body, and the worker's connection is closed
// with no answer, as a connection dropped mid-upload.
type cutProxy struct {
	URL string

	mu   sync.Mutex
	puts []string
	gets []string // GETs of the worker content route
}

// requests returns the part PUTs and content GETs the proxy passed.
func (p *cutProxy) requests() (puts, gets []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.puts), slices.Clone(p.gets)
}

func newCutProxy(t *testing.T, target string, cutAfter int64) *cutProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{}
	rp := httputil.NewSingleHostReverseProxy(u) // keeps the incoming Host
	rp.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/content") {
			p.mu.Lock()
			p.gets = append(p.gets, r.URL.Path)
			p.mu.Unlock()
		}
		if r.Method != http.MethodPut || !strings.Contains(r.URL.Path, "/parts/") {
			rp.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		p.puts = append(p.puts, r.URL.Path)
		first := len(p.puts) == 1
		p.mu.Unlock()
		if !first || cutAfter < 0 {
			rp.ServeHTTP(w, r)
			return
		}
		r.Body = io.NopCloser(io.MultiReader(io.LimitReader(r.Body, cutAfter), brokenBody{}))
		rp.ServeHTTP(httptest.NewRecorder(), r)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// TestE2EArtifactUploadCut cuts the worker's connection midway through
// the upload of a 64 MiB artifact: the worker sends the part again and
// the job succeeds with the bytes stored whole.
func TestE2EArtifactUploadCut(t *testing.T) {
	t.Parallel()
	c := artifactCluster(t, testdb.Dialects()[0], "")
	p := newCutProxy(t, c.base(), 20<<20)
	dir := t.TempDir()
	big := script(t, dir, "big.sh", bigScript)
	c.startCommandWorker("cut-node", fmt.Sprintf("[[job]]\ntype = \"art_big\"\ncommand = [%q]\ngpus = 0\n", big),
		"-gpu", "rtx-4090:24576", "-server", p.URL)
	d := c.dispatch("art_big", nil)
	jd := c.waitDone(d.Job.ID, "succeeded")
	want := c.runFile("cut-node", d.Job.ID, jd.Job.Attempt, "weights.bin")
	p.mu.Lock()
	puts := slices.Clone(p.puts)
	p.mu.Unlock()
	if len(puts) != 2 || puts[0] != puts[1] {
		t.Errorf("part PUTs %q, want the one part twice", puts)
	}
	if len(jd.Artifacts) != 1 || !jd.Artifacts[0].Stored {
		t.Fatalf("artifacts %+v", jd.Artifacts)
	}
	resp, got := c.content(*jd.Artifacts[0].ContentURL, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		t.Errorf("GET content: %d, %d bytes, want the %d written", resp.StatusCode, len(got), len(want))
	}
}

// ckptSize is the size of the checkpoint resumeScript stores.
const ckptSize = 3_000_000

// resumeScript stores a checkpoint and waits to be killed on its first
// attempt; on a later one, it checks the checkpoint's bytes at
// NODELANE_RESUME_FROM (their sha256, given as its argument) and succeeds.
const resumeScript = `
if [ -n "$NODELANE_RESUME_FROM" ]; then
    got=$(sha256sum "$NODELANE_RESUME_FROM" | cut -d' ' -f1)
    if [ "$got" != "$1" ]; then echo "resume: wrong bytes $got" >&2; exit 9; fi
    echo "resumed from $(basename "$NODELANE_RESUME_FROM") at attempt $NODELANE_ATTEMPT"
    exit 0
fi
if [ "$NODELANE_ATTEMPT" != 1 ]; then echo "attempt $NODELANE_ATTEMPT without a checkpoint" >&2; exit 8; fi
mkdir -p "$NODELANE_OUTPUT_DIR/ckpt"
head -c 3000000 /dev/zero | tr '\0' 'c' > "$NODELANE_OUTPUT_DIR/ckpt/step-100.ckpt"
echo 'nodelane:artifact {"name": "step-100.ckpt", "path": "ckpt/step-100.ckpt", "kind": "checkpoint"}'
echo 'checkpoint printed'
sleep 1000
`

// TestE2ECheckpointResume stores a checkpoint from a job's first
// attempt, kills its worker with SIGKILL and starts it again: the next
// attempt's command finds the checkpoint's bytes at NODELANE_RESUME_FROM.
func TestE2ECheckpointResume(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			c := artifactCluster(t, d, "")
			checkResume(t, c, false)
		})
	}
}

// checkResume runs resumeScript on a worker of c that is killed after
// the checkpoint is stored and started again. With direct, the
// checkpoint must go and come back by presigned URLs.
func checkResume(t *testing.T, c *cluster, direct bool) {
	t.Helper()
	dir := t.TempDir()
	s := script(t, dir, "resume.sh", resumeScript)
	want := sha(bytes.Repeat([]byte("c"), ckptSize))
	cfg := fmt.Sprintf("[[job]]\ntype = \"art_resume\"\ncommand = [%q, %q]\ngpus = 0\nretry_on_exit = [75]\n", s, want)
	p := newCutProxy(t, c.base(), -1)
	w := c.startCommandWorker("resume-node", cfg, "-gpu", "rtx-4090:24576", "-server", p.URL)
	d := c.dispatch("art_resume", nil)
	a := c.storedArtifact(d.Job.ID, "step-100.ckpt")
	if a.ArtifactType != wire.CheckpointType || a.ChecksumSHA256 == nil || *a.ChecksumSHA256 != want {
		t.Fatalf("the checkpoint: %+v", a)
	}
	if jd := c.job(d.Job.ID); jd.Job.State != "running" || jd.Job.Attempt != 1 {
		t.Fatalf("job %s at attempt %d", jd.Job.State, jd.Job.Attempt)
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w.done
	c.startCommandWorker("resume-node", cfg, "-gpu", "rtx-4090:24576", "-server", p.URL)
	jd := c.waitDone(d.Job.ID, "succeeded")
	if puts, gets := p.requests(); direct != (len(puts) == 0) || direct != (len(gets) == 0) {
		t.Errorf("through the control plane: part PUTs %q, content GETs %q (direct %v)", puts, gets, direct)
	}
	if jd.Job.Attempt != 2 {
		t.Errorf("the job succeeded at attempt %d, want 2", jd.Job.Attempt)
	}
	lines := strings.Join(logLines(jd), "\n")
	if !strings.Contains(lines, "resumed from step-100.ckpt at attempt 2") || !strings.Contains(lines, "resuming from checkpoint "+a.ArtifactID) {
		t.Errorf("log lines:\n%s", lines)
	}
}

// TestE2EArtifactsS3 runs the upload and the resume through a real
// S3-compatible server (NODELANE_TEST_S3, started by .ci/run): the
// parts go to presigned URLs.
func TestE2EArtifactsS3(t *testing.T) {
	t.Parallel()
	s3 := os.Getenv("NODELANE_TEST_S3")
	if s3 == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("NODELANE_TEST_S3 is not set: under CI=true the S3 tests run (.ci/run starts versitygw)")
		}
		t.Skip("NODELANE_TEST_S3 is not set (.ci/run starts versitygw and sets it)")
	}
	d := testdb.Dialects()[0]
	t.Run("upload", func(t *testing.T) {
		t.Parallel()
		c := artifactCluster(t, d, s3Store(t, s3))
		checkUpload(t, c, true)
	})
	t.Run("resume", func(t *testing.T) {
		t.Parallel()
		c := artifactCluster(t, d, s3Store(t, s3))
		checkResume(t, c, true)
	})
}

// s3Store is the bucket URL s3 with a key prefix of the test's own, so
// that clusters sharing the bucket never see (nor sweep) each other's
// objects.
func s3Store(t *testing.T, s3 string) string {
	t.Helper()
	u, err := url.Parse(s3)
	if err != nil {
		t.Fatalf("NODELANE_TEST_S3: %v", err)
	}
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", "e2e-"+hex.EncodeToString(r[:])+"/")
	u.RawQuery = q.Encode()
	return u.String()
}
