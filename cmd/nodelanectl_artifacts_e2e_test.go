//go:build linux

package cmd

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/receipts"
)

// flipBody is an answer's body with the byte at offset at changed.
type flipBody struct {
	io.ReadCloser
	off, at int64
}

func (f *flipBody) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if f.at >= f.off && f.at < f.off+int64(n) {
		p[f.at-f.off] ^= 0x01
	}
	f.off += int64(n)
	return n, err
}

// newFlipProxy passes requests to target, and the answers back, except
// that one byte in the middle of every artifact's content is changed on
// the way, its headers (the ETag, the length) left as they were: what a
// rotted disk or a mangling proxy would serve. No real server serves
// wrong bytes: this proxy makes one that does, streaming.
func newFlipProxy(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if strings.HasSuffix(resp.Request.URL.Path, "/content") && resp.StatusCode == http.StatusOK {
			resp.Body = &flipBody{ReadCloser: resp.Body, at: resp.ContentLength / 2}
		}
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestE2ENodelanectlArtifacts runs, with real processes on SQLite and on
// PostgreSQL, a command that writes 64 MiB and prints nodelane:artifact;
// the worker uploads it; nodelanectl artifacts list shows it stored, and
// artifacts download writes the identical bytes, whose sha256 the
// artifact_reported receipt (verified offline) carries, to a file and to
// standard output. Through a proxy that changes one byte, download exits
// 1 and leaves the file as it was.
func TestE2ENodelanectlArtifacts(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			c := artifactCluster(t, d, "")
			x := newCtl(t, c)
			dir := t.TempDir()
			big := script(t, dir, "big.sh", bigScript)
			c.startCommandWorker("ctl-node", fmt.Sprintf("[[job]]\ntype = \"art_big\"\ncommand = [%q]\ngpus = 0\n", big), "-gpu", "rtx-4090:24576")
			id := c.dispatch("art_big", nil).Job.ID
			jd := c.waitDone(id, "succeeded")
			want := c.runFile("ctl-node", id, jd.Job.Attempt, "weights.bin")
			if len(jd.Artifacts) != 1 || !jd.Artifacts[0].Stored || jd.Artifacts[0].ReceiptID == nil {
				t.Fatalf("the job's artifacts: %+v", jd.Artifacts)
			}
			art := jd.Artifacts[0].ArtifactID

			out := x.run("artifacts", "list", "-job", id)
			mustContain(t, "artifacts list", out, art+"  "+id+"  adapter  stored  64.0 MiB  "+sha(want)[:12]+"  weights.bin")

			dst := filepath.Join(dir, "weights.bin")
			r := x.runEnv(nil, "-server", c.base(), "-token-file", x.tokFile, "artifacts", "download", "-job", id, "-o", dst, art)
			got, err := os.ReadFile(dst)
			if r.code != 0 || err != nil || !bytes.Equal(got, want) {
				t.Fatalf("artifacts download: exit %d, %d bytes (%v), want the %d written\n%s", r.code, len(got), err, len(want), r.stderr)
			}
			mustContain(t, "artifacts download's report", r.stderr, "64.0 MiB to "+dst+", sha256 "+sha(want)+" verified")
			if rc := c.verifyReceipt(*jd.Artifacts[0].ReceiptID); rc.Kind != receipts.KindArtifactReported || rc.ChecksumSHA256 != sha(got) || rc.SizeBytes != int64(len(got)) {
				t.Errorf("receipt %s: %s, sha256 %s, %d bytes; want the file's %s, %d bytes", rc.ID, rc.Kind, rc.ChecksumSHA256, rc.SizeBytes, sha(got), len(got))
			}
			if out := x.run("artifacts", "download", art, "-o", "-"); out != string(want) {
				t.Errorf("artifacts download -o -: %d bytes (sha256 %s), want the %d written", len(out), sha([]byte(out)), len(want))
			}

			if err := os.WriteFile(dst, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			r = x.fail(1, nil, "-server", newFlipProxy(t, c.base()), "-token-file", x.tokFile, "artifacts", "download", art, "-o", dst)
			mustContain(t, "download through a proxy that changes a byte", r.stderr, "the bytes received are not the artifact's: they hash to sha256 ", "nothing written to "+dst)
			if got, _ := os.ReadFile(dst); string(got) != "old" {
				t.Errorf("a download that did not verify changed the file (%d bytes)", len(got))
			}
			if es, _ := os.ReadDir(dir); len(es) != 2 { // big.sh, weights.bin
				t.Errorf("%s holds %d files: a temporary file was left", dir, len(es))
			}
		})
	}
}
