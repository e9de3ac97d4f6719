package workerapi_test

import (
	"bytes"
	"context"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// workerGet GETs the worker content route of an artifact with tok.
func (f *upFx) workerGet(t *testing.T, jobID, tok, artifactID string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req := f.node.Request(t, http.MethodGet, wire.ArtifactContentPath(jobID, artifactID), nil)
	req.Header.Set(wire.HeaderLeaseToken, tok)
	for k, v := range header {
		req.Header[k] = v
	}
	return f.node.Raw(t, req)
}

// A job leased again after its first lease ended gets the latest
// checkpoint of the earlier lease, and reads it on the worker route.
func TestResumeFrom(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			f := setupUploads(t, dialect)
			j := f.env.Enqueue(t, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}, MaxAttempts: 3})
			lr := apitest.Post[wire.LeaseResponse](t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}}, http.StatusOK)
			if lr.Job == nil || lr.Job.ID != j.ID || lr.Job.ResumeFrom != nil {
				t.Fatalf("first lease: %+v", lr.Job)
			}
			tok := *lr.LeaseToken
			apitest.Post[wire.AcceptResponse](t, f.node, wire.JobPath(j.ID, wire.ActionAccept), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
			old := randomBytes(1500)
			ckpt := randomBytes(2*testPartSize + 7)
			upload := func(name string, data []byte) wire.ArtifactResponse {
				u := f.ask(t, j.ID, tok, data)
				for _, p := range u.Parts {
					f.send(t, tok, p, data)
				}
				size, sum := int64(len(data)), sha(data)
				return apitest.Post[wire.ArtifactResponse](t, f.node, wire.JobPath(j.ID, wire.ActionArtifacts), wire.ArtifactRequest{
					LeaseToken: tok, ArtifactType: wire.CheckpointType, Name: name, ChecksumSHA256: &sum, SizeBytes: &size, UploadID: u.UploadID,
				}, http.StatusCreated)
			}
			upload("step-100.ckpt", old)
			latest := upload("step-200.ckpt", ckpt)
			// A metadata-only checkpoint after it is not one to resume from.
			apitest.Post[wire.ArtifactResponse](t, f.node, wire.JobPath(j.ID, wire.ActionArtifacts), wire.ArtifactRequest{
				LeaseToken: tok, ArtifactType: wire.CheckpointType, Name: "elsewhere", URI: "s3://b/k",
			}, http.StatusCreated)
			apitest.Post[wire.JobResponse](t, f.node, wire.JobPath(j.ID, wire.ActionRelease), wire.ReleaseRequest{LeaseToken: tok, Reason: "preempted"}, http.StatusOK)

			lr = apitest.Post[wire.LeaseResponse](t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}}, http.StatusOK)
			if lr.Job == nil || lr.Job.ResumeFrom == nil {
				t.Fatalf("second lease: %+v", lr.Job)
			}
			rf := lr.Job.ResumeFrom
			if rf.ArtifactID != latest.ArtifactID || rf.Name != "step-200.ckpt" || rf.SizeBytes != int64(len(ckpt)) || rf.ChecksumSHA256 != sha(ckpt) || rf.URL != "" {
				t.Errorf("resume_from %+v", rf)
			}
			tok2 := *lr.LeaseToken
			acc := apitest.Post[wire.AcceptResponse](t, f.node, wire.JobPath(j.ID, wire.ActionAccept), wire.TokenRequest{LeaseToken: tok2}, http.StatusOK)
			if acc.Job.ResumeFrom == nil || acc.Job.ResumeFrom.ArtifactID != latest.ArtifactID {
				t.Errorf("accept's job: %+v", acc.Job.ResumeFrom)
			}
			resp, got := f.workerGet(t, j.ID, tok2, rf.ArtifactID, nil)
			if resp.StatusCode != http.StatusOK || !bytes.Equal(got, ckpt) {
				t.Fatalf("worker content: %d, %d bytes", resp.StatusCode, len(got))
			}
			resp, got = f.workerGet(t, j.ID, tok2, rf.ArtifactID, http.Header{"Range": {"bytes=990-1010"}})
			if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, ckpt[990:1011]) {
				t.Errorf("worker range: %d, %d bytes", resp.StatusCode, len(got))
			}
			// The old lease's token reads nothing; nor does another job's lease.
			if resp, b := f.workerGet(t, j.ID, tok, rf.ArtifactID, nil); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeLeaseLost {
				t.Errorf("stale token: %d %s", resp.StatusCode, b)
			}
			other, otherTok := f.running(t, "status_check")
			if resp, b := f.workerGet(t, other, otherTok, rf.ArtifactID, nil); resp.StatusCode != http.StatusNotFound {
				t.Errorf("another job's artifact: %d %s", resp.StatusCode, b)
			}
			req := f.node.Request(t, http.MethodGet, wire.ArtifactContentPath(j.ID, rf.ArtifactID), nil)
			if resp, b := f.node.Raw(t, req); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("no lease token header: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// gateStore is a Memory whose Put of a part waits until released, and
// tells when it started.
type gateStore struct {
	*artifacttest.Memory
	started chan struct{}
	release chan struct{}
}

func (g *gateStore) Put(ctx context.Context, key string, r io.Reader, md map[string]string) error {
	if !strings.HasSuffix(key, ".sum") {
		g.started <- struct{}{}
		<-g.release
	}
	return g.Memory.Put(ctx, key, r, md)
}

// A worker streams at most MaxUploadsPerWorker parts at once.
func TestUploadTooMany(t *testing.T) {
	t.Parallel()
	store := &gateStore{Memory: artifacttest.NewMemory(), started: make(chan struct{}, 1), release: make(chan struct{})}
	f := setup(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts = workerapi.ArtifactConfig{Store: store, PartSize: testPartSize, MaxBytes: 20 * testPartSize, MaxUploadsPerWorker: 1}
		workerapi.SmallParts(&c.Artifacts)
	}))
	uf := &upFx{fx: f, store: store.Memory}
	id, tok := f.running(t, "status_check")
	data := randomBytes(10)
	u1, u2 := uf.ask(t, id, tok, data), uf.ask(t, id, tok, data)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if resp, b := uf.send(t, tok, u1.Parts[0], data); resp.StatusCode != http.StatusOK {
			t.Errorf("first part: %d %s", resp.StatusCode, b)
		}
	}()
	waitfor.Receive(t, "the first part streaming", store.started)
	resp, b := uf.send(t, tok, u2.Parts[0], data)
	if resp.StatusCode != http.StatusTooManyRequests || errCode(t, b) != wire.CodeTooManyUploads || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second part: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	close(store.release)
	wg.Wait()
	// The slot is free again.
	if resp, b := uf.send(t, tok, u2.Parts[0], data); resp.StatusCode != http.StatusOK {
		t.Errorf("second part, later: %d %s", resp.StatusCode, b)
	}
}

// discardStore keeps no bytes: only each object's size and metadata.
type discardStore struct {
	mu   sync.Mutex
	objs map[string]workerapi.ObjectInfo
}

func (d *discardStore) Put(ctx context.Context, key string, r io.Reader, md map[string]string) error {
	n, err := io.CopyBuffer(io.Discard, r, make([]byte, 32<<10))
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.objs[key] = workerapi.ObjectInfo{Key: key, Size: n, Metadata: md, ModTime: time.Now()}
	return nil
}

func (d *discardStore) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	return nil, workerapi.ErrObjectNotFound
}

func (d *discardStore) Stat(ctx context.Context, key string) (workerapi.ObjectInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.objs[key]
	if !ok {
		return o, workerapi.ErrObjectNotFound
	}
	return o, nil
}

func (d *discardStore) Delete(ctx context.Context, key string) error { return nil }

func (d *discardStore) List(ctx context.Context, prefix string) iter.Seq2[workerapi.ObjectInfo, error] {
	return func(func(workerapi.ObjectInfo, error) bool) {}
}

// The part route streams: a 16 MiB part costs the process far less than
// 16 MiB of allocations (it is not buffered whole, nor copied). Not
// parallel: it measures the process's allocations.
func TestUploadPartStreams(t *testing.T) {
	const size = 16 << 20
	store := &discardStore{objs: map[string]workerapi.ObjectInfo{}}
	f := setup(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts = workerapi.ArtifactConfig{Store: store, PartSize: size}
	}))
	uf := &upFx{fx: f}
	id, tok := f.running(t, "status_check")
	data := randomBytes(size)
	u := uf.ask(t, id, tok, data)
	req := uf.partRequest(t, tok, u.Parts[0], data, data)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, b := f.node.Raw(t, req)
	runtime.ReadMemStats(&after)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("part: %d %s", resp.StatusCode, b)
	}
	if o, err := store.Stat(context.Background(), "jobs/"+id+"/"); err == nil {
		t.Fatalf("unexpected object %+v", o)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d-byte part allocated %d bytes", size, alloc)
	if alloc > size/8 {
		t.Errorf("a %d-byte part allocated %d bytes: the part route buffers", size, alloc)
	}
}

// presignStore is a Memory that presigns: its URLs point at an
// httptest server that checks the signature and header, and never wants
// a credential.
type presignStore struct {
	*artifacttest.Memory
	srv *httptest.Server
}

func newPresignStore(t *testing.T) *presignStore {
	p := &presignStore{Memory: artifacttest.NewMemory()}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.URL.Path, "/b/")
		switch {
		case !ok || r.URL.Query().Get("sig") != "ok:"+key:
			http.Error(w, "bad signature", http.StatusForbidden)
		case r.Header.Get("Authorization") != "" || r.Header.Get("Signature") != "":
			http.Error(w, "credentials sent to the bucket", http.StatusBadRequest)
		case r.Method == http.MethodPut && r.Header.Get("X-Store-Class") != "standard":
			http.Error(w, "missing header", http.StatusBadRequest)
		case r.Method == http.MethodPut:
			if err := p.Put(r.Context(), key, r.Body, nil); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		case r.Method == http.MethodGet:
			rc, err := p.Open(r.Context(), key, 0, -1)
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			defer rc.Close()
			io.Copy(w, rc)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *presignStore) PresignPut(ctx context.Context, key string, expiry time.Duration) (string, http.Header, error) {
	return p.srv.URL + "/b/" + key + "?sig=ok:" + key, http.Header{"X-Store-Class": {"standard"}}, nil
}

func (p *presignStore) PresignGet(ctx context.Context, key string, expiry time.Duration) (string, error) {
	return p.srv.URL + "/b/" + key + "?sig=ok:" + key, nil
}

// putDirect PUTs part p of data to its presigned URL, as a worker does:
// with the headers given, and no credential.
func putDirect(t *testing.T, p wire.UploadPart, data []byte) {
	t.Helper()
	req, err := http.NewRequest(p.Method, p.URL, bytes.NewReader(data[p.Offset:p.Offset+p.SizeBytes]))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct PUT of part %d: %d %s", p.PartNumber, resp.StatusCode, b)
	}
}

// With a store that presigns, parts go straight to it, and the finish
// reads them back.
func TestUploadDirect(t *testing.T) {
	t.Parallel()
	store := newPresignStore(t)
	f := setup(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts = workerapi.ArtifactConfig{Store: store, PartSize: testPartSize, MaxBytes: 20 * testPartSize}
		workerapi.SmallParts(&c.Artifacts)
	}))
	uf := &upFx{fx: f, store: store.Memory}
	id, tok := f.running(t, "status_check")
	data := randomBytes(2*testPartSize + 300)
	u := uf.ask(t, id, tok, data)
	if !u.Direct || len(u.Parts) != 3 || !strings.HasPrefix(u.Parts[0].URL, store.srv.URL) || u.Parts[0].Headers["X-Store-Class"] != "standard" {
		t.Fatalf("upload %+v", u)
	}
	// Finishing before the parts are there.
	if st, b := uf.finish(t, id, tok, u.UploadID, data); st != http.StatusConflict || errCode(t, b) != wire.CodeUploadIncomplete {
		t.Errorf("early finish: %d %s", st, b)
	}
	// The control plane's part route is not this upload's.
	if resp, b := uf.send(t, tok, wire.UploadPart{PartNumber: 1, SizeBytes: testPartSize, URL: wire.UploadPartPath(id, u.UploadID, 1)}, data); resp.StatusCode != http.StatusConflict || errCode(t, b) != wire.CodeUploadInvalid {
		t.Errorf("signed part of a direct upload: %d %s", resp.StatusCode, b)
	}
	for _, p := range u.Parts {
		putDirect(t, p, data)
	}
	st, b := uf.finish(t, id, tok, u.UploadID, data)
	if st != http.StatusCreated {
		t.Fatalf("finish: %d %s", st, b)
	}
	out := decode[wire.ArtifactResponse](t, b)
	if resp, got := uf.content(t, http.MethodGet, out.ArtifactID, nil); resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Errorf("download: %d %d bytes", resp.StatusCode, len(got))
	}

	// Bytes that are not the declared ones: read back, refused, deleted.
	bad := bytes.Clone(data)
	bad[testPartSize+1] ^= 1
	u = uf.ask(t, id, tok, data)
	for _, p := range u.Parts {
		putDirect(t, p, bad)
	}
	if st, b := uf.finish(t, id, tok, u.UploadID, data); st != http.StatusUnprocessableEntity || errCode(t, b) != wire.CodeArtifactMismatch {
		t.Errorf("mismatch: %d %s", st, b)
	}
	n := 0
	for o, err := range store.List(context.Background(), "jobs/") {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(o.Key, strings.SplitN(u.UploadID, ".", 2)[0]) {
			t.Errorf("left %s", o.Key)
		}
		n++
	}
	if n != 3 {
		t.Errorf("%d objects, want the first upload's 3", n)
	}
}

// The sweep deletes the objects of deleted jobs and of unfinished
// uploads past UploadTTL, and nothing else.
func TestSweepArtifacts(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			f := setupUploads(t, dialect, func(c *workerapi.ArtifactConfig) { c.UploadTTL = time.Hour; c.SweepInterval = 3 * time.Hour })
			f.env.Clock.Set(time.Now())
			f.store.Now = f.env.Clock.Now
			f.node.Now = f.env.Clock.Now
			ctx := context.Background()
			id, tok := f.running(t, "status_check")
			data := randomBytes(2*testPartSize + 1)
			stored := f.upload(t, id, tok, data)
			// An unfinished upload: two of its three parts.
			old := f.ask(t, id, tok, data)
			f.send(t, tok, old.Parts[0], data)
			f.send(t, tok, old.Parts[1], data)
			// A deleted job's object.
			if err := f.store.Put(ctx, "jobs/job_gone/abc/000001", strings.NewReader("x"), nil); err != nil {
				t.Fatal(err)
			}
			before := len(f.objects(t, "jobs/"))
			// Within UploadTTL only the deleted job's object goes.
			if n, err := f.env.Server.SweepArtifacts(ctx); err != nil || n != 1 {
				t.Fatalf("first sweep: %d %v", n, err)
			}
			if got := len(f.objects(t, "jobs/")); got != before-1 {
				t.Errorf("%d objects, want %d", got, before-1)
			}
			// A fresh unfinished upload stays; the old one goes after UploadTTL.
			f.env.Clock.Advance(time.Hour + time.Second)
			id2, tok2 := f.running(t, "status_check")
			fresh := f.ask(t, id2, tok2, data)
			f.send(t, tok2, fresh.Parts[0], data)
			if err := f.env.Server.MaintainOnce(ctx); err != nil {
				t.Fatal(err)
			}
			a, _ := f.env.Server.Leases().Artifact(ctx, stored.ArtifactID)
			for _, k := range f.objects(t, "jobs/") {
				if !strings.HasPrefix(k, a.Object) && !strings.HasPrefix(k, "jobs/"+id2+"/") {
					t.Errorf("left %s", k)
				}
			}
			if resp, got := f.content(t, http.MethodGet, stored.ArtifactID, nil); resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
				t.Errorf("the stored artifact: %d %d bytes", resp.StatusCode, len(got))
			}
			if n := len(f.objects(t, "jobs/")); n != 2*3+2 {
				t.Errorf("%d objects, want the stored artifact's 6 and the fresh part's 2", n)
			}
			// Again within SweepInterval: MaintainOnce does not sweep.
			f.env.Clock.Advance(2 * time.Hour)
			if err := f.env.Server.MaintainOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if n := len(f.objects(t, "jobs/")); n != 8 {
				t.Errorf("swept within SweepInterval: %d objects", n)
			}
		})
	}
}

// A lease that expired (its worker vanished) leaves its checkpoint to the
// next lease of the job, whichever worker takes it.
func TestResumeFromAfterExpiry(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	f.env.Clock.Set(time.Now())
	f.node.Now = f.env.Clock.Now
	id, tok := f.running(t, "status_check")
	ckpt := randomBytes(1234)
	u := f.ask(t, id, tok, ckpt)
	for _, p := range u.Parts {
		f.send(t, tok, p, ckpt)
	}
	size, sum := int64(len(ckpt)), sha(ckpt)
	stored := apitest.Post[wire.ArtifactResponse](t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: wire.CheckpointType, Name: "ckpt", ChecksumSHA256: &sum, SizeBytes: &size, UploadID: u.UploadID,
	}, http.StatusCreated)
	f.env.Clock.Advance(lease.DefaultLeaseTTL + time.Minute)
	if _, err := f.env.Server.Leases().Expire(context.Background()); err != nil {
		t.Fatal(err)
	}
	other := f.env.NewNode(t, "studio-gpu-2")
	other.Now = f.env.Clock.Now
	other.Register(t, registerRequest())
	f.env.Clock.Advance(time.Hour) // past the retry backoff
	lr := apitest.Post[wire.LeaseResponse](t, other, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}}, http.StatusOK)
	if lr.Job == nil || lr.Job.ID != id || lr.Job.ResumeFrom == nil || lr.Job.ResumeFrom.ArtifactID != stored.ArtifactID {
		t.Fatalf("lease after expiry: %+v", lr.Job)
	}
	req := other.Request(t, http.MethodGet, wire.ArtifactContentPath(id, stored.ArtifactID), nil)
	req.Header.Set(wire.HeaderLeaseToken, *lr.LeaseToken)
	if resp, got := other.Raw(t, req); resp.StatusCode != http.StatusOK || !bytes.Equal(got, ckpt) {
		t.Errorf("the checkpoint on the other worker: %d, %d bytes", resp.StatusCode, len(got))
	}
}

// An upload asked again under its idempotency_key is the same upload;
// a finish must declare the upload's size and checksum.
func TestUploadIdempotentAndDeclared(t *testing.T) {
	t.Parallel()
	f := setupUploads(t, "sqlite")
	id, tok := f.running(t, "status_check")
	data := randomBytes(1500)
	size := int64(len(data))
	req := wire.UploadRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a", SizeBytes: &size, ChecksumSHA256: sha(data), IdempotencyKey: "upload-key-0001-abcdef"}
	first := apitest.Post[wire.UploadResponse](t, f.node, wire.JobPath(id, wire.ActionUploads), req, http.StatusCreated)
	again := apitest.Post[wire.UploadResponse](t, f.node, wire.JobPath(id, wire.ActionUploads), req, http.StatusCreated)
	if first.UploadID != again.UploadID {
		t.Errorf("a repeat under the key got another upload")
	}
	req.Name = "b"
	if st, b := post(t, f.node, wire.JobPath(id, wire.ActionUploads), req); st != http.StatusUnprocessableEntity || errCode(t, b) != wire.CodeIdempotencyMismatch {
		t.Errorf("another body under the key: %d %s", st, b)
	}
	for _, p := range first.Parts {
		f.send(t, tok, p, data)
	}
	other := append(bytes.Clone(data), 'x')
	if st, b := f.finish(t, id, tok, first.UploadID, other); st != http.StatusBadRequest || !strings.Contains(string(b), "upload") {
		t.Errorf("a finish declaring other bytes: %d %s", st, b)
	}
	sum := sha(data)
	if st, b := post(t, f.node, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "a", ChecksumSHA256: &sum, UploadID: first.UploadID,
	}); st != http.StatusBadRequest || !strings.Contains(string(b), "size_bytes") {
		t.Errorf("a finish without size_bytes: %d %s", st, b)
	}
	if st, b := f.finish(t, id, tok, first.UploadID, data); st != http.StatusCreated {
		t.Errorf("finish: %d %s", st, b)
	}
}
