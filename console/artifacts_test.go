package console_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// storedFixture is a fixture whose control plane stores artifact bytes
// (in memory, in parts of 1 MiB).
func storedFixture(t *testing.T) *fixture {
	t.Helper()
	env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}}
		c.Artifacts.Store = artifacttest.NewMemory()
		c.Artifacts.PartSize = workerapi.MinPartSize
		c.Artifacts.MaxBytes = 1 << 30
	}))
	c, err := console.New(console.Config{API: env.Server.OperatorHandler(), VerifierKey: env.Server.ReceiptVerifierKey(), Origin: env.Config.Origin})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", c))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &fixture{env: env, console: c, srv: srv, url: srv.URL + "/console"}
}

// upload stores content as an artifact of job id through the worker
// routes, as a worker does: the upload, each part as a signed PUT, the
// finish. It returns the artifact's id.
func upload(t *testing.T, n *apitest.Node, id, tok, name string, content []byte) string {
	t.Helper()
	if len(content) <= workerapi.MinPartSize {
		t.Fatalf("upload: %d bytes make one part; the tests want several", len(content))
	}
	return n.Upload(t, id, tok, "adapter", name, content).ArtifactID
}

func sumHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestStoredArtifactDownload runs a job that stores an artifact's bytes
// (more than the operator client's in-process buffer holds) and reports
// another as metadata only, and checks the job page links Download for
// the stored one only, that the link serves its bytes to a signed-in
// browser and nothing without a session, and that the metadata-only one
// answers the API's 404 as a page.
func TestStoredArtifactDownload(t *testing.T) {
	t.Parallel()
	f := storedFixture(t)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	id := dispatch(t, b, url.Values{"job_type": {"status_check"}, "gpu_sku": {"rtx-4090"}})
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != id {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	tok := *l.LeaseToken
	apitest.Post[wire.AcceptResponse](t, n, wire.JobPath(id, "accept"), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
	content := bytes.Repeat([]byte("<html>weights 0123456789</html>\n"), (operator.MaxAnswerBytes+(1<<20))/32)
	stored := upload(t, n, id, tok, "adapter.safetensors", content)
	sum, size := strings.Repeat("cd", 32), int64(4)
	meta := apitest.Post[wire.ArtifactResponse](t, n, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "log", Name: "train.log", URI: "file:///var/log/a-very-long-path/" + strings.Repeat("segment/", 40) + "train.log",
		ChecksumSHA256: &sum, SizeBytes: &size,
	}, http.StatusCreated).ArtifactID

	p := b.get(t, "/jobs/"+id)
	link := `<a href="/console/artifacts/` + stored + `/download" download>Download</a>`
	mustContain(t, "job page", p, link, `title="`+strconv.Itoa(len(content))+` bytes">9.0 MiB</td>`, `<td class="long"><code>file:///var/log/a-very-long-path/`)
	if strings.Count(p.body, "/download") != 1 || strings.Contains(p.body, meta+"/download") {
		t.Errorf("job page: the metadata-only artifact %s has a Download link, or more than one shows:\n%s", meta, p.body)
	}

	p = b.get(t, "/artifacts/"+stored+"/download")
	if p.code != http.StatusOK || p.body != string(content) {
		t.Fatalf("download: %d, %d bytes, want 200 and the %d bytes", p.code, len(p.body), len(content))
	}
	for k, want := range map[string]string{
		"Content-Type":        "application/octet-stream",
		"Content-Disposition": `attachment; filename="adapter.safetensors"`,
		"ETag":                `"` + sumHex(content) + `"`,
		"Content-Length":      strconv.Itoa(len(content)),
		"Cache-Control":       "no-store",
	} {
		if got := p.header.Get(k); got != want {
			t.Errorf("download: %s %q, want %q", k, got, want)
		}
	}
	req, err := http.NewRequest(http.MethodGet, f.url+"/artifacts/"+stored+"/download", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A range across a part boundary.
	req.Header.Set("Range", "bytes=1048570-1048585")
	if p = b.do(t, req); p.code != http.StatusPartialContent || p.body != string(content[1048570:1048586]) {
		t.Errorf("Range: %d %q, want 206 %q", p.code, p.body, content[1048570:1048586])
	}

	req.Header.Set("Range", "bytes=0-1,10-11")
	if p = b.do(t, req); p.code != http.StatusPartialContent || !strings.HasPrefix(p.header.Get("Content-Type"), "multipart/byteranges; boundary=") ||
		!strings.Contains(p.body, "Content-Range: bytes 10-11/") {
		t.Errorf("two ranges: %d %q\n%s", p.code, p.header.Get("Content-Type"), p.body)
	}

	p = b.get(t, "/artifacts/"+meta+"/download")
	if p.code != http.StatusNotFound || !strings.Contains(p.body, "has no stored bytes") {
		t.Errorf("metadata-only download: %d\n%s", p.code, p.body)
	}

	anon := f.browser(t)
	if p = anon.get(t, "/artifacts/"+stored+"/download"); !strings.HasSuffix(p.url, "/console/signin") || strings.Contains(p.body, "weights") {
		t.Errorf("download without a session: %d at %s", p.code, p.url)
	}
}

// contentAPI serves GET /operator/artifacts/art_stored/content with
// content, as the operator content route does (bearer token checked,
// Range, ETag the sha256, an attachment, here with a Content-Type a page
// would render), and passes every other request to api. It counts the
// requests of the content route it served.
func contentAPI(api http.Handler, token string, content []byte, served *atomic.Int64) http.Handler {
	sum := sha256.Sum256(content)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/operator/artifacts/art_stored/content" {
			api.ServeHTTP(w, r)
			return
		}
		served.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"no valid bearer credential"}}`))
			return
		}
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set("Content-Disposition", `inline; filename="page.html"`)
		w.Header().Set("X-Internal", "not for the browser")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
	})
}

// TestArtifactDownloadHeaders checks the console's download of an
// artifact's bytes from a content route that answers as no real server
// does (a type a browser would render, inline, a header of its own):
// the browser gets an attachment of type application/octet-stream and
// only the content headers; also a Range answered 206, a validator 304,
// an unknown artifact's 404 shown as a page, and nothing served without
// a session or after sign-out.
func TestArtifactDownloadHeaders(t *testing.T) {
	t.Parallel()
	content := bytes.Repeat([]byte("<script>alert(1)</script> 0123456789abcdef"), (operator.MaxAnswerBytes+1<<20)/40)
	var served atomic.Int64
	var f *fixture
	f = newFixture(t, func(c *console.Config) {
		api := c.API
		c.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			contentAPI(api, f.env.OperatorToken, content, &served).ServeHTTP(w, r)
		})
	})

	// Not signed in: sent to sign in, and the API is not asked.
	anon := f.browser(t)
	p := anon.get(t, "/artifacts/art_stored/download")
	if !strings.HasSuffix(p.url, "/console/signin") || strings.Contains(p.body, "0123456789abcdef") || served.Load() != 0 {
		t.Fatalf("download without a session: %d at %s (content route served %d times)", p.code, p.url, served.Load())
	}

	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	p = b.get(t, "/artifacts/art_stored/download")
	if p.code != http.StatusOK || p.body != string(content) {
		t.Fatalf("download: %d, %d bytes, want 200 and the %d bytes", p.code, len(p.body), len(content))
	}
	sum := sha256.Sum256(content)
	for k, want := range map[string]string{
		"Content-Type":        "application/octet-stream",
		"Content-Disposition": "attachment",
		"ETag":                `"` + hex.EncodeToString(sum[:]) + `"`,
		"Accept-Ranges":       "bytes",
		"Cache-Control":       "no-store",
		"X-Internal":          "",
	} {
		if got := p.header.Get(k); got != want {
			t.Errorf("download: %s %q, want %q", k, got, want)
		}
	}

	req, err := http.NewRequest(http.MethodGet, f.url+"/artifacts/art_stored/download", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Range", "bytes=10-19")
	p = b.do(t, req)
	if p.code != http.StatusPartialContent || p.body != string(content[10:20]) || p.header.Get("Content-Range") != "bytes 10-19/"+strconv.Itoa(len(content)) {
		t.Errorf("Range: %d %q (Content-Range %q), want 206 %q", p.code, p.body, p.header.Get("Content-Range"), content[10:20])
	}
	req.Header.Del("Range")
	req.Header.Set("If-None-Match", p.header.Get("ETag"))
	if p = b.do(t, req); p.code != http.StatusNotModified || p.body != "" {
		t.Errorf("If-None-Match: %d with %d bytes, want 304", p.code, len(p.body))
	}

	// An artifact the content route does not serve: the API's 404, shown.
	p = b.get(t, "/artifacts/art_missing/download")
	if p.code != http.StatusNotFound || !strings.Contains(p.header.Get("Content-Type"), "text/html") || !strings.Contains(p.body, "404") {
		t.Errorf("unknown artifact: %d %q\n%s", p.code, p.header.Get("Content-Type"), p.body)
	}

	// Signed out: the session no longer downloads.
	b.post(t, "/signout", nil)
	before := served.Load()
	if p = b.get(t, "/artifacts/art_stored/download"); !strings.HasSuffix(p.url, "/console/signin") || served.Load() != before {
		t.Errorf("download after sign-out: %d at %s", p.code, p.url)
	}
}
