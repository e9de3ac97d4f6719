package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// storedJob runs a job on a control plane of dialect that stores
// artifact bytes (in memory, parts of 1 MiB): it stores content as
// adapter.safetensors through the worker routes, as a worker does (the
// upload, each part a signed PUT, the finish), and reports train.log as
// metadata only. It returns the Env, the job's id, and the artifacts'
// ids and the stored one's receipt.
func storedJob(t *testing.T, dialect string, content []byte) (env *apitest.Env, jobID, stored, meta, receiptID string) {
	t.Helper()
	env = apitest.New(t, dialect, apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts.Store = artifacttest.NewMemory()
		c.Artifacts.PartSize = workerapi.MinPartSize
		c.Artifacts.MaxBytes = 1 << 30
	}))
	n := env.NewNode(t, "gpu-1")
	n.Register(t, wire.RegisterRequest{
		Name: "gpu-1", Hostname: "gpu-1.local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 1, MaxVRAMMB: 24576}, Version: "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	})
	jobID = env.Enqueue(t, lease.NewJob{Type: "status_check"}).ID
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != jobID {
		t.Fatalf("lease = %+v, want job %s", l, jobID)
	}
	tok := *l.LeaseToken
	apitest.Post[wire.AcceptResponse](t, n, wire.JobPath(jobID, "accept"), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)

	if len(content) <= workerapi.MinPartSize {
		t.Fatalf("storedJob: %d bytes make one part; the tests want several", len(content))
	}
	art := n.Upload(t, jobID, tok, "adapter", "adapter.safetensors", content)
	logSum, logSize := sumOf([]byte("log!")), int64(4)
	m := apitest.Post[wire.ArtifactResponse](t, n, wire.JobPath(jobID, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "log", Name: "train.log", URI: "file:///var/log/train.log", ChecksumSHA256: &logSum, SizeBytes: &logSize,
	}, http.StatusCreated)
	return env, jobID, art.ArtifactID, m.ArtifactID, art.ReceiptID
}

// flipper is a proxy in front of target that changes one byte in the
// middle of every artifact content it passes on, leaving its headers
// (the ETag) as they were: storage that rotted, or a proxy that mangles.
// No real server serves wrong bytes: this one makes one that does.
func flipper(t *testing.T, target string) *httptest.Server {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/content") || resp.StatusCode != http.StatusOK {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		b[len(b)/2] ^= 0x20
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv
}

// TestArtifactsAgainstServer runs artifacts list and download against a
// real control plane on SQLite and PostgreSQL, over loopback: the
// listing marks the stored artifact and the metadata-only one, a
// download writes the stored bytes (their sha256 the artifact_reported
// receipt's), a metadata-only artifact is refused with the server's 404,
// and bytes changed on the way (a proxy in front) are refused with the
// file left as it was.
func TestArtifactsAgainstServer(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			content := bytes.Repeat([]byte("adapter weights 0123456789abcdef"), 80_000) // 2.4 MiB: three parts
			env, jobID, stored, meta, receiptID := storedJob(t, dialect, content)
			ctl := func(server string, args ...string) (string, string, int) {
				t.Helper()
				var so, se bytes.Buffer
				code := run(t.Context(), append([]string{"-server", server}, args...), &so, &se, envMap{"HOME": t.TempDir(), "NODELANE_TOKEN": env.OperatorToken}.get)
				if strings.Contains(so.String()+se.String(), env.OperatorToken) {
					t.Errorf("%v printed the token", args)
				}
				return so.String(), se.String(), code
			}

			out, errOut, code := ctl(env.URL, "artifacts", "list", "-job", jobID)
			if code != exitOK || !strings.Contains(out, stored+"  "+jobID+"  adapter  stored    2.4 MiB  "+sumOf(content)[:12]+"  adapter.safetensors") ||
				!strings.Contains(out, meta+"  "+jobID+"  log      metadata  4 B") {
				t.Errorf("artifacts list: exit %d\n%s%s", code, out, errOut)
			}
			out, _, _ = ctl(env.URL, "jobs", "show", jobID)
			if !strings.Contains(out, "adapter  ") || !strings.Contains(out, "stored") || !strings.Contains(out, "metadata") {
				t.Errorf("jobs show:\n%s", out)
			}

			dir := t.TempDir()
			dst := filepath.Join(dir, "adapter.safetensors")
			_, errOut, code = ctl(env.URL, "artifacts", "download", "-job", jobID, stored, "-o", dst)
			got, err := os.ReadFile(dst)
			if code != exitOK || err != nil || !bytes.Equal(got, content) {
				t.Fatalf("download: exit %d, %d bytes (%v), want the %d bytes\n%s", code, len(got), err, len(content), errOut)
			}
			var rr wire.ReceiptResponse
			if c, b := env.Operator(t, http.MethodGet, "/operator/receipts/"+receiptID, nil); c != http.StatusOK || json.Unmarshal(b, &rr) != nil {
				t.Fatalf("the artifact's receipt: %d %s", c, b)
			}
			rc, err := receipts.Decode(rr.Receipt.Body)
			if err != nil || rc.Kind != receipts.KindArtifactReported || rc.ChecksumSHA256 != sumOf(got) || rc.SizeBytes != int64(len(got)) {
				t.Errorf("the file's sha256 %s and size %d are not the receipt's: %+v (%v)", sumOf(got), len(got), rc, err)
			}

			_, errOut, code = ctl(env.URL, "artifacts", "download", meta, "-o", filepath.Join(dir, "train.log"))
			if code != exitNotFound || !strings.Contains(errOut, "404 not_found") || !strings.Contains(errOut, "has no stored bytes") {
				t.Errorf("download of a metadata-only artifact: exit %d, stderr %q", code, errOut)
			}

			if err := os.WriteFile(dst, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			bad := flipper(t, env.URL)
			_, errOut, code = ctl(bad.URL, "artifacts", "download", stored, "-o", dst)
			if code != exitFail || !strings.Contains(errOut, "the bytes received are not the artifact's: they hash to sha256 ") || !strings.Contains(errOut, "nothing written to "+dst) {
				t.Errorf("download of changed bytes: exit %d, stderr %q", code, errOut)
			}
			if got, _ := os.ReadFile(dst); string(got) != "old" {
				t.Errorf("a download that did not verify changed the file (%d bytes)", len(got))
			}
			noTemp(t, dir, "adapter.safetensors")
		})
	}
}
