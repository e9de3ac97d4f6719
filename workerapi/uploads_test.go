package workerapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Artifact bytes over real HTTP (PROTOCOL.md §5.19 to §5.21): parts of
// testPartSize bytes, so that a few kilobytes take several parts.

const testPartSize = 1000

// upFx is a control plane with an artifact store, and a node on it.
type upFx struct {
	*fx
	store *artifacttest.Memory
}

func setupUploads(t *testing.T, dialect string, change ...func(*workerapi.ArtifactConfig)) *upFx {
	t.Helper()
	store := artifacttest.NewMemory()
	f := setup(t, dialect, apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts = workerapi.ArtifactConfig{Store: store, PartSize: testPartSize, MaxBytes: 20 * testPartSize}
		workerapi.SmallParts(&c.Artifacts)
		for _, ch := range change {
			ch(&c.Artifacts)
		}
	}))
	return &upFx{fx: f, store: store}
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 27))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// ask asks for an upload of data and decodes the answer.
func (f *upFx) ask(t *testing.T, id, tok string, data []byte) wire.UploadResponse {
	t.Helper()
	size := int64(len(data))
	return apitest.Post[wire.UploadResponse](t, f.node, wire.JobPath(id, wire.ActionUploads), wire.UploadRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", SizeBytes: &size, ChecksumSHA256: sha(data),
	}, http.StatusCreated)
}

// partRequest is the signed PUT of body as part p, signed over signed.
func (f *upFx) partRequest(t *testing.T, tok string, p wire.UploadPart, signed, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, f.env.URL+p.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", "Bearer "+f.node.Token)
	req.Header.Set(wire.HeaderLeaseToken, tok)
	f.node.Sign(t, req, signed)
	return req
}

// send sends part p of data.
func (f *upFx) send(t *testing.T, tok string, p wire.UploadPart, data []byte) (*http.Response, []byte) {
	t.Helper()
	b := data[p.Offset : p.Offset+p.SizeBytes]
	return f.node.Raw(t, f.partRequest(t, tok, p, b, b))
}

// finish finishes upload u of data.
func (f *upFx) finish(t *testing.T, id, tok, uploadID string, data []byte) (int, []byte) {
	t.Helper()
	size, sum := int64(len(data)), sha(data)
	return post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", ChecksumSHA256: &sum, SizeBytes: &size,
		UploadID: uploadID,
	})
}

// upload stores data as an artifact of the job and returns its answer.
func (f *upFx) upload(t *testing.T, id, tok string, data []byte) wire.ArtifactResponse {
	t.Helper()
	u := f.ask(t, id, tok, data)
	for _, p := range u.Parts {
		if resp, b := f.send(t, tok, p, data); resp.StatusCode != http.StatusOK {
			t.Fatalf("part %d: %d %s", p.PartNumber, resp.StatusCode, b)
		}
	}
	st, b := f.finish(t, id, tok, u.UploadID, data)
	if st != http.StatusCreated {
		t.Fatalf("finish: %d %s", st, b)
	}
	return decode[wire.ArtifactResponse](t, b)
}

// keys lists the store's keys under prefix.
func (f *upFx) objects(t *testing.T, prefix string) []string {
	t.Helper()
	var out []string
	for o, err := range f.store.List(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o.Key)
	}
	return out
}

// content GETs (or HEADs) the operator content route with header.
func (f *upFx) content(t *testing.T, method, artifactID string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.env.URL+wire.OperatorArtifactContentPath(artifactID), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+f.env.OperatorToken)
	return f.env.Raw(t, req)
}

func errCode(t *testing.T, b []byte) string {
	t.Helper()
	return decode[wire.ErrorBody](t, b).Error.Code
}

func TestUploadDownload(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setupUploads(t, d.Name)
			id, tok := f.running(t, "status_check")
			data := randomBytes(3*testPartSize + 123)
			u := f.ask(t, id, tok, data)
			if len(u.Parts) != 4 || u.Direct || u.PartSize != testPartSize || !strings.HasPrefix(u.UploadID, "upl_") {
				t.Fatalf("upload %+v", u)
			}
			for i, p := range u.Parts {
				if p.PartNumber != i+1 || p.Offset != int64(i)*testPartSize || p.Method != http.MethodPut ||
					p.URL != wire.UploadPartPath(id, u.UploadID, i+1) {
					t.Errorf("part %d: %+v", i, p)
				}
			}
			if u.Parts[3].SizeBytes != 123 {
				t.Errorf("last part %+v", u.Parts[3])
			}
			n := f.env.Receipts(t)
			for _, p := range u.Parts {
				resp, b := f.send(t, tok, p, data)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("part %d: %d %s", p.PartNumber, resp.StatusCode, b)
				}
				pr := decode[wire.UploadPartResponse](t, b)
				if pr.PartNumber != p.PartNumber || pr.SizeBytes != p.SizeBytes || pr.ExpiresAt.IsZero() {
					t.Errorf("part answer %s", b)
				}
			}
			st, b := f.finish(t, id, tok, u.UploadID, data)
			if st != http.StatusCreated {
				t.Fatalf("finish: %d %s", st, b)
			}
			out := decode[wire.ArtifactResponse](t, b)
			if !out.Stored {
				t.Errorf("finish answer %s: not stored", b)
			}
			if f.env.Receipts(t) != n+1 {
				t.Errorf("receipts %d, want %d", f.env.Receipts(t), n+1)
			}
			r := receiptOf(t, f.env, out.ReceiptID)
			if r.Kind != receipts.KindArtifactReported || r.ChecksumSHA256 != sha(data) || r.SizeBytes != int64(len(data)) {
				t.Errorf("receipt %+v", r)
			}
			a, err := f.env.Server.Leases().Artifact(context.Background(), out.ArtifactID)
			if err != nil || a.Object == "" || a.PartSize != testPartSize || a.SHA256 != sha(data) {
				t.Fatalf("artifact %+v %v", a, err)
			}

			// Finishing the same upload again records nothing more.
			if st, b := f.finish(t, id, tok, u.UploadID, data); st != http.StatusConflict || errCode(t, b) != wire.CodeUploadInvalid {
				t.Errorf("second finish: %d %s", st, b)
			}

			// Download, whole and by ranges.
			resp, got := f.content(t, http.MethodGet, out.ArtifactID, nil)
			if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
				t.Fatalf("download: %d, %d bytes, equal %v", resp.StatusCode, len(got), bytes.Equal(got, data))
			}
			etag := `"` + sha(data) + `"`
			h := resp.Header
			if h.Get("ETag") != etag || h.Get("Accept-Ranges") != "bytes" || h.Get("Content-Type") != "application/octet-stream" ||
				h.Get("Content-Length") != fmt.Sprint(len(data)) || h.Get("Content-Disposition") != `attachment; filename="adapter.safetensors"` {
				t.Errorf("headers %v", h)
			}
			for _, rg := range [][2]int{{0, 0}, {999, 1000}, {500, 2600}, {3000, 3122}, {1, 3122}} {
				resp, got := f.content(t, http.MethodGet, out.ArtifactID, http.Header{"Range": {fmt.Sprintf("bytes=%d-%d", rg[0], rg[1])}})
				if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[rg[0]:rg[1]+1]) {
					t.Errorf("range %v: %d, %d bytes", rg, resp.StatusCode, len(got))
				}
				if want := fmt.Sprintf("bytes %d-%d/%d", rg[0], rg[1], len(data)); resp.Header.Get("Content-Range") != want {
					t.Errorf("range %v: Content-Range %q", rg, resp.Header.Get("Content-Range"))
				}
			}
			resp, got = f.content(t, http.MethodGet, out.ArtifactID, http.Header{"Range": {"bytes=-10"}})
			if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[len(data)-10:]) {
				t.Errorf("suffix range: %d %d bytes", resp.StatusCode, len(got))
			}
			resp, _ = f.content(t, http.MethodGet, out.ArtifactID, http.Header{"Range": {"bytes=99999-"}})
			if resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
				t.Errorf("unsatisfiable range: %d", resp.StatusCode)
			}
			resp, got = f.content(t, http.MethodGet, out.ArtifactID, http.Header{"If-None-Match": {etag}})
			if resp.StatusCode != http.StatusNotModified || len(got) != 0 {
				t.Errorf("If-None-Match: %d, %d bytes", resp.StatusCode, len(got))
			}
			resp, got = f.content(t, http.MethodGet, out.ArtifactID, http.Header{"Range": {"bytes=0-9"}, "If-Range": {`"other"`}})
			if resp.StatusCode != http.StatusOK || len(got) != len(data) {
				t.Errorf("If-Range with another ETag: %d, %d bytes", resp.StatusCode, len(got))
			}
			resp, got = f.content(t, http.MethodHead, out.ArtifactID, nil)
			if resp.StatusCode != http.StatusOK || len(got) != 0 || resp.Header.Get("Content-Length") != fmt.Sprint(len(data)) {
				t.Errorf("HEAD: %d, %d bytes, %v", resp.StatusCode, len(got), resp.Header)
			}

			// In Go, through the Server.
			a, rc, err := f.env.Server.OpenArtifact(context.Background(), out.ArtifactID)
			if err != nil {
				t.Fatal(err)
			}
			got, err = io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data) || a.ID != out.ArtifactID {
				t.Errorf("OpenArtifact: %d bytes, %v", len(got), err)
			}

			// The list shows it stored.
			st, b = f.env.Operator(t, http.MethodGet, "/operator/artifacts?job_id="+id, nil)
			list := decode[wire.ArtifactListResponse](t, b)
			if st != http.StatusOK || len(list.Artifacts) != 1 || !list.Artifacts[0].Stored || list.Artifacts[0].ContentURL == nil ||
				*list.Artifacts[0].ContentURL != wire.OperatorArtifactContentPath(out.ArtifactID) {
				t.Errorf("list: %d %s", st, b)
			}
		})
	}
}

// A 0-byte artifact is one 0-byte part.
func TestUploadEmpty(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	id, tok := f.running(t, "status_check")
	out := f.upload(t, id, tok, nil)
	resp, got := f.content(t, http.MethodGet, out.ArtifactID, nil)
	if resp.StatusCode != http.StatusOK || len(got) != 0 || resp.Header.Get("ETag") != `"`+sha(nil)+`"` {
		t.Errorf("download: %d %d bytes %v", resp.StatusCode, len(got), resp.Header)
	}
}

func TestUploadMismatch(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	id, tok := f.running(t, "status_check")
	data := randomBytes(2*testPartSize + 5)
	// The upload declares another checksum than the bytes sent have.
	other := bytes.Clone(data)
	other[7] ^= 1
	u := f.ask(t, id, tok, other)
	for _, p := range u.Parts {
		if resp, b := f.send(t, tok, p, data); resp.StatusCode != http.StatusOK {
			t.Fatalf("part: %d %s", resp.StatusCode, b)
		}
	}
	before := f.env.Receipts(t)
	st, b := f.finish(t, id, tok, u.UploadID, other)
	if st != http.StatusUnprocessableEntity || errCode(t, b) != wire.CodeArtifactMismatch {
		t.Fatalf("finish: %d %s", st, b)
	}
	if objs := f.objects(t, "jobs/"); len(objs) != 0 {
		t.Errorf("objects left: %v", objs)
	}
	as, _ := f.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: id})
	if len(as) != 0 || f.env.Receipts(t) != before {
		t.Errorf("recorded: %d artifacts, %d receipts (was %d)", len(as), f.env.Receipts(t), before)
	}
}

// A part re-sent with other bytes after the next part was stored breaks
// the chain: the finish refuses the upload.
func TestUploadChainBroken(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	id, tok := f.running(t, "status_check")
	data := randomBytes(3 * testPartSize)
	u := f.ask(t, id, tok, data)
	for _, p := range u.Parts {
		f.send(t, tok, p, data)
	}
	changed := bytes.Clone(data)
	changed[10] ^= 1
	if resp, b := f.send(t, tok, u.Parts[0], changed); resp.StatusCode != http.StatusOK {
		t.Fatalf("resend: %d %s", resp.StatusCode, b)
	}
	if st, b := f.finish(t, id, tok, u.UploadID, data); st != http.StatusUnprocessableEntity || errCode(t, b) != wire.CodeArtifactMismatch {
		t.Fatalf("finish: %d %s", st, b)
	}
	if objs := f.objects(t, "jobs/"); len(objs) != 0 {
		t.Errorf("objects left: %v", objs)
	}
}

func TestUploadRefusals(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite", func(c *workerapi.ArtifactConfig) { c.MaxPerJob = 2 })
	id, tok := f.running(t, "status_check")
	data := randomBytes(2*testPartSize + 1)
	ask := func(body any) (int, []byte) { return post(t, f.node, wire.JobPath(id, wire.ActionUploads), body) }
	size := int64(len(data))
	big := int64(20*testPartSize + 1)
	neg := int64(-1)
	for _, c := range []struct {
		name string
		body any
		st   int
		code string
	}{
		{"malformed JSON", `{"lease_token":`, 400, wire.CodeInvalidRequest},
		{"no lease token", wire.UploadRequest{ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha(data)}, 400, wire.CodeInvalidRequest},
		{"no size", wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", ChecksumSHA256: sha(data)}, 400, wire.CodeInvalidRequest},
		{"negative size", wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &neg, ChecksumSHA256: sha(data)}, 400, wire.CodeInvalidRequest},
		{"bad checksum", wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: "AB"}, 400, wire.CodeInvalidRequest},
		{"no name", wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", SizeBytes: &size, ChecksumSHA256: sha(data)}, 400, wire.CodeInvalidRequest},
		{"over MaxBytes", wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &big, ChecksumSHA256: sha(data)}, 413, wire.CodeArtifactTooLarge},
	} {
		st, b := ask(c.body)
		if st != c.st || errCode(t, b) != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, st, b, c.st, c.code)
		}
	}
	st, b := ask(wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &big, ChecksumSHA256: sha(data)})
	if !strings.Contains(string(b), "20000") {
		t.Errorf("the 413 does not name the limit: %d %s", st, b)
	}
	// Another job's id in the path: the same answer as any lease lost.
	other, otherTok := f.running(t, "status_check")
	st, b = post(t, f.node, wire.JobPath(other, wire.ActionUploads), wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha(data)})
	if st != http.StatusConflict || errCode(t, b) != wire.CodeLeaseLost {
		t.Errorf("wrong job: %d %s", st, b)
	}

	u := f.ask(t, id, tok, data)
	// Out of order: part 2 before part 1.
	resp, b := f.send(t, tok, u.Parts[1], data)
	if resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeUploadOutOfOrder {
		t.Errorf("out of order: %d %s", resp.StatusCode, b)
	}
	// A body that is not the one signed: refused, no object.
	p1 := u.Parts[0]
	good := data[:p1.SizeBytes]
	bad := bytes.Clone(good)
	bad[0] ^= 1
	resp, b = f.node.Raw(t, f.partRequest(t, tok, p1, good, bad))
	if resp.StatusCode != http.StatusUnauthorized || errCode(t, b) != wire.CodeBadDigest {
		t.Errorf("bad digest: %d %s", resp.StatusCode, b)
	}
	if objs := f.objects(t, "jobs/"); len(objs) != 0 {
		t.Errorf("objects after a bad digest: %v", objs)
	}
	// Finishing before every part is stored.
	if st, b := f.finish(t, id, tok, u.UploadID, data); st != http.StatusConflict || errCode(t, b) != wire.CodeUploadIncomplete ||
		!strings.Contains(string(b), "part 1") {
		t.Errorf("incomplete: %d %s", st, b)
	}
	// Wrong length, missing lease token, another job's upload, a forged
	// id, a wrong part number, a wrong media type.
	req := f.partRequest(t, tok, p1, good, good[:10])
	req.ContentLength = 10
	if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("short Content-Length: %d %s", resp.StatusCode, b)
	}
	req = f.partRequest(t, tok, p1, good, good)
	req.Header.Del(wire.HeaderLeaseToken)
	if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "lease_token") {
		t.Errorf("no lease token: %d %s", resp.StatusCode, b)
	}
	req = f.partRequest(t, tok, p1, good, good)
	req.Header.Set("Content-Type", "application/json")
	f.node.Sign(t, req, good)
	if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("JSON part: %d %s", resp.StatusCode, b)
	}
	wrongJob := p1
	wrongJob.URL = wire.UploadPartPath(other, u.UploadID, 1)
	if resp, b := f.node.Raw(t, f.partRequest(t, otherTok, wrongJob, good, good)); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeUploadInvalid {
		t.Errorf("another job's upload: %d %s", resp.StatusCode, b)
	}
	forged := p1
	forged.URL = wire.UploadPartPath(id, u.UploadID[:len(u.UploadID)-2]+"AA", 1)
	if resp, b := f.node.Raw(t, f.partRequest(t, tok, forged, good, good)); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeUploadInvalid {
		t.Errorf("forged upload id: %d %s", resp.StatusCode, b)
	}
	part9 := p1
	part9.URL = wire.UploadPartPath(id, u.UploadID, 9)
	if resp, b := f.node.Raw(t, f.partRequest(t, tok, part9, good, good)); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("part 9: %d %s", resp.StatusCode, b)
	}
	// A replayed part request.
	req = f.partRequest(t, tok, p1, good, good)
	if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("part 1: %d %s", resp.StatusCode, b)
	}
	req.Body, req.GetBody = io.NopCloser(bytes.NewReader(good)), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(good)), nil }
	if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusUnauthorized || errCode(t, b) != wire.CodeReplayedNonce {
		t.Errorf("replayed part: %d %s", resp.StatusCode, b)
	}
	// Another job's lease token on this job.
	if st, b := ask(wire.UploadRequest{LeaseToken: otherTok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha(data)}); st != http.StatusConflict || errCode(t, b) != wire.CodeLeaseLost {
		t.Errorf("another lease's token: %d %s", st, b)
	}
	// Too many artifacts: MaxPerJob is 2.
	for i := range 2 {
		uri := fmt.Sprintf("s3://b/%d", i)
		if st, b := post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", URI: uri}); st != http.StatusCreated {
			t.Fatalf("metadata artifact: %d %s", st, b)
		}
	}
	if st, b := ask(wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha(data)}); st != http.StatusConflict || errCode(t, b) != wire.CodeTooManyArtifacts {
		t.Errorf("too many artifacts: %d %s", st, b)
	}
	if st, b := post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", URI: "s3://b/3"}); st != http.StatusConflict || errCode(t, b) != wire.CodeTooManyArtifacts {
		t.Errorf("too many metadata artifacts: %d %s", st, b)
	}
	// A stale lease: released, its token holds nothing, on every route.
	if st, b := post(t, f.node, wire.JobPath(id, wire.ActionRelease), wire.ReleaseRequest{LeaseToken: tok, Reason: "test"}); st != http.StatusOK {
		t.Fatalf("release: %d %s", st, b)
	}
	if st, b := ask(wire.UploadRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha(data)}); st != http.StatusConflict || errCode(t, b) != wire.CodeLeaseLost {
		t.Errorf("stale lease, uploads: %d %s", st, b)
	}
	if resp, b := f.send(t, tok, u.Parts[1], data); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeLeaseLost {
		t.Errorf("stale lease, part: %d %s", resp.StatusCode, b)
	}
	if st, b := f.finish(t, id, tok, u.UploadID, data); st != http.StatusConflict {
		t.Errorf("stale lease, finish: %d %s", st, b)
	}
}

// An expired upload id is refused on its parts and its finish.
func TestUploadExpired(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite", func(c *workerapi.ArtifactConfig) { c.UploadTTL = time.Minute })
	id, tok := f.running(t, "status_check")
	data := randomBytes(10)
	u := f.ask(t, id, tok, data)
	f.env.Clock.Advance(2 * time.Minute)
	// The lease lives on (the signature is by real time).
	if resp, b := f.send(t, tok, u.Parts[0], data); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeUploadExpired {
		t.Errorf("part: %d %s", resp.StatusCode, b)
	}
}

// A part whose connection is cut mid-body stores nothing; sent again,
// it completes.
func TestUploadCutResumes(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	id, tok := f.running(t, "status_check")
	data := randomBytes(2 * testPartSize)
	u := f.ask(t, id, tok, data)
	p := u.Parts[0]
	good := data[:p.SizeBytes]
	req := f.partRequest(t, tok, p, good, nil)
	req.GetBody = nil
	req.ContentLength = p.SizeBytes
	pr, pw := io.Pipe()
	req.Body = pr
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	if _, err := pw.Write(good[:p.SizeBytes/2]); err != nil {
		t.Fatal(err)
	}
	pw.CloseWithError(errors.New("the connection drops"))
	<-done
	if objs := f.objects(t, "jobs/"); len(objs) != 0 {
		t.Errorf("objects after a cut part: %v", objs)
	}
	out := func() wire.ArtifactResponse {
		for _, p := range u.Parts {
			if resp, b := f.send(t, tok, p, data); resp.StatusCode != http.StatusOK {
				t.Fatalf("part %d: %d %s", p.PartNumber, resp.StatusCode, b)
			}
		}
		st, b := f.finish(t, id, tok, u.UploadID, data)
		if st != http.StatusCreated {
			t.Fatalf("finish: %d %s", st, b)
		}
		return decode[wire.ArtifactResponse](t, b)
	}()
	if _, got := f.content(t, http.MethodGet, out.ArtifactID, nil); !bytes.Equal(got, data) {
		t.Errorf("download differs")
	}
}

func TestUploadStorageOff(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, tok := f.running(t, "status_check")
	size := int64(3)
	st, b := post(t, f.node, wire.JobPath(id, wire.ActionUploads), wire.UploadRequest{
		LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: sha([]byte("abc")),
	})
	if st != http.StatusNotFound || errCode(t, b) != wire.CodeArtifactStorageOff {
		t.Errorf("uploads: %d %s", st, b)
	}
	sum := sha([]byte("abc"))
	st, b = post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "a", Name: "n", SizeBytes: &size, ChecksumSHA256: &sum, UploadID: "upl_x.y",
	})
	if st != http.StatusNotFound || errCode(t, b) != wire.CodeArtifactStorageOff {
		t.Errorf("finish: %d %s", st, b)
	}
	// A metadata-only artifact has no content.
	st, b = post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "a", Name: "n", URI: "s3://b/k"})
	if st != http.StatusCreated {
		t.Fatalf("artifact: %d %s", st, b)
	}
	out := decode[wire.ArtifactResponse](t, b)
	if out.Stored {
		t.Errorf("metadata-only artifact stored: %s", b)
	}
	st, b = f.env.Operator(t, http.MethodGet, wire.OperatorArtifactContentPath(out.ArtifactID), nil)
	if st != http.StatusNotFound || errCode(t, b) != wire.CodeNotFound || !strings.Contains(string(b), "has no stored bytes") {
		t.Errorf("content: %d %s", st, b)
	}
	if _, _, err := f.env.Server.OpenArtifact(context.Background(), out.ArtifactID); !errors.Is(err, workerapi.ErrNotFound) {
		t.Errorf("OpenArtifact: %v", err)
	}
	st, b = f.env.Operator(t, http.MethodGet, wire.OperatorArtifactContentPath("art_nope"), nil)
	if st != http.StatusNotFound {
		t.Errorf("unknown artifact: %d %s", st, b)
	}
}
