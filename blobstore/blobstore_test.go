package blobstore_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/nodelane/nodelane/blobstore"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
)

// s3Env names the S3 URL of a bucket the tests may write to, for example
// s3://nodelane-test?endpoint=http://127.0.0.1:7070&use_path_style=true&region=us-east-1
// with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set. .ci/run starts
// versitygw and sets it.
const s3Env = "NODELANE_TEST_S3"

// open opens url, closing the bucket when the test ends.
func open(t testing.TB, url string) workerapi.ArtifactStore {
	t.Helper()
	s, b, err := blobstore.Open(t.Context(), url, blobstore.Options{})
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	t.Cleanup(func() { b.Close() })
	return s
}

func fileURL(dir string) string { return "file://" + filepath.ToSlash(dir) }

func TestFile(t *testing.T) {
	t.Parallel()
	artifacttest.Run(t, func(t *testing.T) workerapi.ArtifactStore {
		s := open(t, fileURL(filepath.Join(t.TempDir(), "artifacts")))
		if _, ok := s.(workerapi.ArtifactPresigner); ok {
			t.Fatal("a file:// store claims to presign")
		}
		return s
	})
}

func TestMem(t *testing.T) {
	t.Parallel()
	artifacttest.Run(t, func(t *testing.T) workerapi.ArtifactStore {
		s := open(t, "mem://")
		if _, ok := s.(workerapi.ArtifactPresigner); ok {
			t.Fatal("a mem:// store claims to presign")
		}
		return s
	})
}

// s3URL returns the URL of the test bucket: a test without one fails
// under CI=true, and is skipped elsewhere.
func s3URL(t *testing.T) string {
	t.Helper()
	u := os.Getenv(s3Env)
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: under CI=true the S3 tests run (.ci/run starts versitygw)", s3Env)
		}
		t.Skipf("%s is not set (.ci/run starts versitygw and sets it)", s3Env)
	}
	return u
}

// s3Store returns a store on a prefix of the test bucket of its own.
func s3Store(t *testing.T, url string) workerapi.ArtifactStore {
	t.Helper()
	_, b, err := blobstore.Open(t.Context(), url, blobstore.Options{})
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	pb := blob.PrefixedBucket(b, "test-"+hex.EncodeToString(r[:])+"/")
	t.Cleanup(func() { pb.Close() })
	if _, ok := blobstore.New(pb, blobstore.Options{NoPresign: true}).(workerapi.ArtifactPresigner); ok {
		t.Fatal("a store with NoPresign presigns")
	}
	s := blobstore.New(pb, blobstore.Options{})
	if _, ok := s.(workerapi.ArtifactPresigner); !ok {
		t.Fatalf("the store on %s does not presign", url)
	}
	return s
}

func TestS3(t *testing.T) {
	t.Parallel()
	url := s3URL(t)
	artifacttest.Run(t, func(t *testing.T) workerapi.ArtifactStore { return s3Store(t, url) })
}

// TestS3Presigned writes and reads an object through presigned URLs with
// a plain HTTP client (no credentials), as a worker does, and shows that
// the signature binds the method and the key.
func TestS3Presigned(t *testing.T) {
	t.Parallel()
	s := s3Store(t, s3URL(t)).(workerapi.ArtifactPresigner)
	ctx := t.Context()
	data := bytes.Repeat([]byte("checkpoint bytes "), 1<<16)
	put, header, err := s.PresignPut(ctx, "jobs/job_1/up/000001", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if header.Get("Content-Type") != blobstore.ContentType {
		t.Fatalf("PresignPut headers = %v, want Content-Type %s", header, blobstore.ContentType)
	}
	send := func(method, url string, h http.Header, body []byte) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, vs := range h {
			req.Header[k] = vs
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	// A URL whose signature was altered is refused.
	forged := strings.Replace(put, "X-Amz-Signature=", "X-Amz-Signature=0", 1)
	// (Refused requests carry a short body: a server that answers 403
	// before reading a long one resets the connection.)
	if resp, body := send(http.MethodPut, forged, header, []byte("x")); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("PUT with an altered signature: %s %s, want 403", resp.Status, body)
	}
	if _, err := s.Stat(ctx, "jobs/job_1/up/000001"); err == nil {
		t.Fatal("a refused PUT left an object")
	}
	if resp, body := send(http.MethodPut, put, header, data); resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT to the presigned URL: %s %s", resp.Status, body)
	}
	info, err := s.Stat(ctx, "jobs/job_1/up/000001")
	if err != nil || info.Size != int64(len(data)) {
		t.Fatalf("Stat after the presigned PUT = %+v, %v; want %d bytes", info, err, len(data))
	}
	// The PUT URL is no GET URL, nor a URL of another key.
	if resp, _ := send(http.MethodGet, put, nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("GET of the PUT URL: %s, want 403", resp.Status)
	}
	other := strings.Replace(put, "000001", "000002", 1)
	if resp, _ := send(http.MethodPut, other, header, []byte("x")); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("PUT of the URL with another key: %s, want 403", resp.Status)
	}
	get, err := s.PresignGet(ctx, "jobs/job_1/up/000001", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	resp, got := send(http.MethodGet, get, nil, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("GET of the presigned URL: %s, %d bytes, want 200 and the %d bytes put", resp.Status, len(got), len(data))
	}
	resp, got = send(http.MethodGet, get, http.Header{"Range": {"bytes=17-33"}}, nil)
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[17:34]) {
		t.Fatalf("ranged GET of the presigned URL: %s %q", resp.Status, got)
	}
}

// A file:// store creates its directories 0700, keeps metadata in
// sidecar files that List never shows, and a failed Put leaves no file
// behind, not even a temporary one.
func TestFileOnDisk(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a", "artifacts")
	s := open(t, fileURL(dir))
	ctx := t.Context()
	if err := s.Put(ctx, "jobs/job_1/up/000001", strings.NewReader("bytes"), map[string]string{"sha256-out": "x"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir), filepath.Join(dir, "jobs"), filepath.Join(dir, "jobs", "job_1", "up")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s has mode %v, want 0700", d, perm)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "jobs", "job_1", "up", "000001.attrs")); err != nil {
		t.Errorf("no metadata sidecar: %v", err)
	}
	var keys []string
	for info, err := range s.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, info.Key)
	}
	if !slices.Equal(keys, []string{"jobs/job_1/up/000001"}) {
		t.Errorf("List = %q, want only the object", keys)
	}
	// Deleting the last object of a directory removes the directories it
	// leaves empty, up to the store's own.
	if err := s.Put(ctx, "jobs/job_2/up/000001", strings.NewReader("x"), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "jobs/job_2/up/000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jobs", "job_2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the directory of a deleted job's last object is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jobs", "job_1", "up", "000001")); err != nil {
		t.Errorf("deleting another job's object removed this one: %v", err)
	}
	before := files(t, dir)
	err := s.Put(ctx, "jobs/job_1/up/000002", io.MultiReader(strings.NewReader("some bytes"), failing{}), nil)
	if err == nil {
		t.Fatal("Put of a failing reader succeeded")
	}
	if after := files(t, dir); !slices.Equal(after, before) {
		t.Errorf("a failed Put left files: before %q, after %q", before, after)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// files lists the regular files under dir.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"",
		"/var/lib/nodelane/artifacts",
		"file://",
		"file://otherhost/dir",
		"file:///tmp/x?metadata=skip",
		"nosuch://bucket",
		"%zz",
	} {
		if s, b, err := blobstore.Open(t.Context(), url, blobstore.Options{}); err == nil {
			b.Close()
			t.Errorf("Open(%q) = %T, want an error", url, s)
		}
	}
}

// A relative file URL (file://./dir) is a directory under the working
// directory.
func TestFileRelative(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp(".", "reltest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := open(t, "file://./"+filepath.ToSlash(dir)+"/store")
	if err := s.Put(t.Context(), "k", strings.NewReader("v"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "store", "k")); err != nil {
		t.Fatalf("the object is not under the relative directory: %v", err)
	}
}
