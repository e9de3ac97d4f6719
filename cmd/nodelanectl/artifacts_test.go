package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

type envMap map[string]string

func (e envMap) get(k string) string { return e[k] }

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// artifactServer answers the artifact routes of the operator API for
// three artifacts of job_1: art_good (stored, served as it is), art_bad
// (stored, but served with one byte changed under the right ETag, as
// storage that rotted or a proxy that mangled it would) and art_meta
// (metadata only: 404). art_noetag is served without an ETag and
// art_other under another sha256 than the listing's. No real server
// serves wrong bytes: this one does, to check that download refuses
// them.
func artifactServer(t *testing.T, content []byte) *httptest.Server {
	t.Helper()
	sum := sumOf(content)
	other := sumOf([]byte("other"))
	size := int64(len(content))
	view := func(id string, stored bool, sum string) wire.ArtifactView {
		v := wire.ArtifactView{ArtifactID: id, JobID: "job_1", ArtifactType: "adapter", Name: id + ".safetensors", SizeBytes: size,
			ChecksumSHA256: &sum, Status: wire.ArtifactSucceeded, Stored: stored, CreatedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
		if stored {
			u := "/operator/artifacts/" + id + "/content"
			v.ContentURL = &u
		}
		return v
	}
	list := wire.ArtifactListResponse{Artifacts: []wire.ArtifactView{
		view("art_good", true, sum), view("art_bad", true, sum), view("art_meta", false, sum), view("art_other", true, sum),
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer nlc_test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		serve := func(b []byte, etag string) {
			if etag != "" {
				w.Header().Set("ETag", `"`+etag+`"`)
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
		}
		switch r.URL.Path {
		case "/operator/artifacts":
			if j := r.URL.Query().Get("job_id"); j != "" && j != "job_1" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				w.Write([]byte(`{"error":{"code":"not_found","message":"job ` + j + ` not found"}}`))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(list)
		case "/operator/artifacts/art_good/content":
			serve(content, sum)
		case "/operator/artifacts/art_bad/content":
			bad := bytes.Clone(content)
			bad[len(bad)/2] ^= 1
			serve(bad, sum)
		case "/operator/artifacts/art_noetag/content":
			serve(content, "")
		case "/operator/artifacts/art_other/content":
			serve([]byte("other"), other)
		case "/operator/artifacts/art_cut/content":
			// Half the bytes, then the connection ends.
			w.Header().Set("ETag", `"`+sum+`"`)
			w.Header().Set("Content-Length", strconv.Itoa(len(content)))
			w.Write(content[:len(content)/2])
		case "/operator/artifacts/art_stall/content":
			// Half the bytes, then nothing until the client gives up.
			w.Header().Set("ETag", `"`+sum+`"`)
			w.Header().Set("Content-Length", strconv.Itoa(len(content)))
			w.Write(content[:len(content)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/operator/artifacts/art_meta/content":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"artifact art_meta has no stored bytes"}}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// noTemp fails the test if dir holds any file but those named.
func noTemp(t *testing.T, dir string, want ...string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s holds %q, want %q (no temporary file left)", dir, got, want)
	}
}

func TestArtifactsList(t *testing.T) {
	t.Parallel()
	content := []byte("adapter weights")
	srv := artifactServer(t, content)
	out, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "list", "-job", "job_1")
	if code != exitOK {
		t.Fatalf("artifacts list: exit %d\n%s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("artifacts list:\n%s", out)
	}
	for i, want := range []string{
		"art_good   job_1  adapter  stored    15 B  " + sumOf(content)[:12] + "  art_good.safetensors",
		"art_meta   job_1  adapter  metadata  15 B",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("artifacts list: line %d: no %q in\n%s", i, want, out)
		}
	}
	out, _, code = runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "list", "-o", "json")
	var l wire.ArtifactListResponse
	if code != exitOK || json.Unmarshal([]byte(out), &l) != nil || len(l.Artifacts) != 4 || !l.Artifacts[0].Stored || l.Artifacts[2].Stored {
		t.Errorf("artifacts list -o json: exit %d\n%s", code, out)
	}
	if _, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "list", "-job", "job_2"); code != exitNotFound || !strings.Contains(errOut, "404 not_found: job job_2 not found") {
		t.Errorf("artifacts list of an unknown job: exit %d, stderr %q", code, errOut)
	}
	if _, _, code := runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "list", "-limit", "0"); code != exitUsage {
		t.Errorf("artifacts list -limit 0: exit %d, want %d", code, exitUsage)
	}
}

func TestArtifactsDownload(t *testing.T) {
	t.Parallel()
	// Larger than one read, so that a body is copied in many.
	content := bytes.Repeat([]byte("0123456789abcdef"), 100_000)
	srv := artifactServer(t, content)
	sum := sumOf(content)

	t.Run("verified", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		dst := filepath.Join(dir, "adapter.safetensors")
		// An older file of the name is replaced.
		if err := os.WriteFile(dst, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"artifacts", "download", "art_good", "-o", dst},
			{"artifacts", "download", "-job", "job_1", "-out", dst, "art_good"},
		} {
			_, errOut, code := runCtl(t, dir, append([]string{"-server", srv.URL}, args...)...)
			got, err := os.ReadFile(dst)
			if code != exitOK || err != nil || !bytes.Equal(got, content) {
				t.Fatalf("%v: exit %d, %d bytes (%v), want the %d bytes\n%s", args, code, len(got), err, len(content), errOut)
			}
			if !strings.Contains(errOut, "sha256 "+sum+" verified") || !strings.Contains(errOut, "1.5 MiB to "+dst) {
				t.Errorf("%v: stderr %q", args, errOut)
			}
			noTemp(t, dir, "adapter.safetensors")
		}
	})

	t.Run("standard output", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "download", "art_good", "-o", "-")
		if code != exitOK || out != string(content) || !strings.Contains(errOut, "written to standard output, sha256 "+sum+" verified") {
			t.Errorf("-o -: exit %d, %d bytes, stderr %q", code, len(out), errOut)
		}
		out, errOut, code = runCtl(t, t.TempDir(), "-server", srv.URL, "artifacts", "download", "art_bad", "-o", "-")
		if code != exitFail || len(out) != len(content) || !strings.Contains(errOut, "the bytes received are not the artifact's") || !strings.Contains(errOut, "discard them") {
			t.Errorf("-o - of wrong bytes: exit %d, %d bytes, stderr %q", code, len(out), errOut)
		}
	})

	refused := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"wrong bytes", []string{"art_bad"}, exitFail, "the bytes received are not the artifact's: they hash to sha256 "},
		{"metadata only", []string{"art_meta"}, exitNotFound, "the server answered 404 not_found: artifact art_meta has no stored bytes"},
		{"unknown", []string{"art_none"}, exitNotFound, "the server answered 404"},
		{"cut", []string{"art_cut"}, exitFail, "artifact art_cut: after 800000 bytes: unexpected EOF; nothing written to "},
		{"stalled", []string{"art_stall"}, exitFail, "artifact art_stall: after 800000 bytes: the download stalled: no byte arrived for 100ms; nothing written to "},
		{"metadata only, listed", []string{"-job", "job_1", "art_meta"}, exitFail, "artifact art_meta of job job_1 is metadata only: the control plane holds no bytes of it"},
		{"no ETag", []string{"art_noetag"}, exitFail, `ETag "" is not a sha256: the artifact's bytes could not be verified, so none are written`},
		{"not the listing's", []string{"-job", "job_1", "art_other"}, exitFail, "is not the listing's checksum_sha256 " + sum},
		{"not of the job", []string{"-job", "job_1", "art_noetag"}, exitFail, "artifact art_noetag is not an artifact of job job_1"},
		{"no -o", []string{"art_good"}, exitUsage, "-o FILE is required"},
		{"two ids", []string{"art_good", "art_bad"}, exitUsage, "takes 1 argument"},
		{"a directory", []string{"art_good", "-o", "."}, exitUsage, "-o . is a directory: name the file to write"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dst := filepath.Join(dir, "adapter.safetensors")
			if err := os.WriteFile(dst, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"-server", srv.URL, "artifacts", "download"}, tc.args...)
			if tc.code != exitUsage {
				args = append(args, "-o", dst)
			}
			var so, se bytes.Buffer
			a := newApp(t.Context(), &so, &se, envMap{"HOME": dir, "NODELANE_TOKEN": "nlc_test"}.get)
			a.stallTimeout = 100 * time.Millisecond
			code, errOut := a.run(args), se.String()
			if code != tc.code || !strings.Contains(errOut, tc.msg) {
				t.Errorf("exit %d, want %d; stderr %q, want %q in it", code, tc.code, errOut, tc.msg)
			}
			if got, _ := os.ReadFile(dst); string(got) != "old" {
				t.Errorf("the file was changed: %d bytes", len(got))
			}
			noTemp(t, dir, "adapter.safetensors")
		})
	}
}
