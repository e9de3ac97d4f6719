package workerapi

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Artifact bytes (PROTOCOL.md §5.19 to §5.21; DESIGN.md "Artifact
// bytes"). A worker asks for an upload (uploads), sends its parts to the
// control plane (uploadPart) or to the store by presigned URLs, then
// finishes it on the artifacts route with the upload's id (verifyUpload,
// then artifacts records it).
//
// The integrity chain. Part n of a control-plane upload streams through
// SHA-256 starting from the state the parts before it left, and its
// chain record, the object "<part key>.sum" written once the part is
// stored, holds that state before ("sha256-in") and after ("sha256-out")
// the part, and the part's own sha256 ("sha256"), which the part's
// metadata holds too. Finishing then needs no read-back: each part's
// sha256-in must be the previous part's sha256-out, each record's sha256
// its part's, and the last sha256-out must sum to the declared checksum.
// (The state after a part is known only once the part is stored, so it
// cannot be the part's own metadata, which a store takes before the
// bytes.)

// Metadata names of parts and their chain records.
const (
	metaSHA256 = "sha256"
	metaIn     = "sha256-in"
	metaOut    = "sha256-out"
)

// uploadSlots counts the part streams of each worker on this Server.
type uploadSlots struct {
	mu sync.Mutex
	n  map[string]int
}

// acquire takes one of max slots of worker, or reports false.
func (u *uploadSlots) acquire(worker string, max int) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == nil {
		u.n = map[string]int{}
	}
	if u.n[worker] >= max {
		return false
	}
	u.n[worker]++
	return true
}

func (u *uploadSlots) release(worker string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[worker]--; u.n[worker] <= 0 {
		delete(u.n, worker)
	}
}

// store returns the artifact store, or ErrArtifactStorageOff.
func (s *Server) store() (ArtifactStore, error) {
	if s.cfg.Artifacts.Store == nil {
		return nil, ErrArtifactStorageOff
	}
	return s.cfg.Artifacts.Store, nil
}

// presigner returns the store as an ArtifactPresigner when workers are
// to reach it directly.
func (s *Server) presigner() (ArtifactPresigner, bool) {
	if s.cfg.Artifacts.NoPresign {
		return nil, false
	}
	p, ok := s.cfg.Artifacts.Store.(ArtifactPresigner)
	return p, ok
}

// uploads: POST /workers/jobs/{id}/uploads.
func (s *Server) uploads(ctx context.Context, c *call) (int, any, error) {
	var req wire.UploadRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.store(); err != nil {
		return 0, nil, err
	}
	ac := s.cfg.Artifacts
	switch {
	case req.ArtifactType == "":
		return 0, nil, invalid("artifact_type is required")
	case req.Name == "":
		return 0, nil, invalid("name is required")
	case req.SizeBytes == nil:
		return 0, nil, invalid("size_bytes is required")
	case *req.SizeBytes < 0:
		return 0, nil, invalid("size_bytes must not be negative")
	case !isSHA256Hex(req.ChecksumSHA256):
		return 0, nil, invalid("checksum_sha256 is required: 64 lowercase hex digits")
	case *req.SizeBytes > ac.MaxBytes:
		return 0, nil, fmt.Errorf("%w: size_bytes %d is over the limit of %d bytes per artifact", ErrArtifactTooLarge, *req.SizeBytes, ac.MaxBytes)
	}
	k, err := keyFor(c, "uploads", ref.JobID, req.IdempotencyKey, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	j, err := s.leases.Extend(ctx, ref)
	if err != nil {
		return 0, nil, err
	}
	if err := s.checkNewArtifact(ctx, j.ID, nil); err != nil {
		return 0, nil, err
	}
	pre, direct := s.presigner()
	u, id, err := s.newUpload(j.ID, j.Lease.Epoch, *req.SizeBytes, req.ChecksumSHA256, direct)
	if err != nil {
		return 0, nil, err
	}
	out := wire.UploadResponse{
		UploadID: id, PartSize: u.PartSize, ExpiresAt: u.expiresAt(), Direct: direct,
		Parts: make([]wire.UploadPart, u.parts()),
	}
	for i := range out.Parts {
		n := i + 1
		p := wire.UploadPart{
			PartNumber: n, Offset: int64(i) * u.PartSize, SizeBytes: u.partLen(n), Method: http.MethodPut,
			URL: wire.UploadPartPath(j.ID, id, n), Headers: map[string]string{},
		}
		if direct {
			url, h, err := pre.PresignPut(ctx, partKey(u.prefix(), n), u.expiresAt().Sub(s.now()))
			if err != nil {
				return 0, nil, fmt.Errorf("workerapi: presigning part %d: %w", n, err)
			}
			p.URL = url
			for name := range h {
				p.Headers[name] = h.Get(name)
			}
		}
		out.Parts[i] = p
	}
	remembered := s.answerExpiry()
	if u.expiresAt().Before(remembered) {
		remembered = u.expiresAt()
	}
	if err := s.remember(ctx, c, k, http.StatusCreated, out, remembered); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

// uploadPart: PUT /workers/jobs/{id}/uploads/{upload}/parts/{n}, a
// stream route: the signature was verified over the headers, and the
// handler checks, in the request's transaction, everything that needs
// no byte of the body; then (outside the transaction, the nonce
// consumed) the body streams into the store.
func (s *Server) uploadPart(ctx context.Context, c *call) (int, any, error) {
	st, err := s.store()
	if err != nil {
		return 0, nil, err
	}
	ref, err := leaseRef(c, c.r.Header.Get(wire.HeaderLeaseToken))
	if err != nil {
		return 0, nil, err
	}
	u, err := s.openUpload(c.r.PathValue("upload"), ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	if u.Direct {
		return 0, nil, fmt.Errorf("%w: the parts of this upload go to the store directly", ErrUploadInvalid)
	}
	n, err := strconv.Atoi(c.r.PathValue("n"))
	if err != nil || n < 1 || n > u.parts() || strconv.Itoa(n) != c.r.PathValue("n") {
		return 0, nil, invalid("the part number must be 1 to %d", u.parts())
	}
	want := u.partLen(n)
	switch cl := c.r.ContentLength; {
	case cl < 0:
		return 0, nil, invalid("Content-Length is required")
	case cl > want:
		return 0, nil, fmt.Errorf("%w: part %d is %d bytes, not %d", ErrPayloadTooLarge, n, cl, want)
	case cl < want:
		return 0, nil, invalid("part %d is %d bytes, not %d", n, cl, want)
	}
	sum := c.digest.Declared(replay.DigestSHA256)
	if sum == nil {
		return 0, nil, invalid("Content-Digest must carry the part's sha-256")
	}
	if !c.slot {
		if !s.slots.acquire(c.principal.ID, s.cfg.Artifacts.MaxUploadsPerWorker) {
			return 0, nil, fmt.Errorf("%w: %d part streams at once per worker", ErrTooManyUploads, s.cfg.Artifacts.MaxUploadsPerWorker)
		}
		c.slot = true
		worker := c.principal.ID
		c.cleanup(func() { s.slots.release(worker) })
	}
	j, err := s.leases.Extend(ctx, ref)
	if err != nil {
		return 0, nil, err
	}
	if j.Lease.Epoch != u.Epoch {
		return 0, nil, fmt.Errorf("%w: the upload_id is another lease's", ErrUploadInvalid)
	}
	expires := j.Lease.ExpiresAt
	c.then = func(ctx context.Context) (int, any, error) {
		if err := s.streamPart(ctx, st, c.r.Body, c.digest, u, n, sum); err != nil {
			return 0, nil, err
		}
		return http.StatusOK, wire.UploadPartResponse{PartNumber: n, SizeBytes: want, ExpiresAt: expires}, nil
	}
	return 0, nil, nil
}

// streamPart stores part n of u from body, whose Content-Digest d
// declares, and then its chain record.
func (s *Server) streamPart(ctx context.Context, st ArtifactStore, body io.Reader, d *replay.BodyDigest, u *upload, n int, sum []byte) error {
	prefix := u.prefix()
	in, err := emptyState()
	if err != nil {
		return err
	}
	if n > 1 {
		prev, err := st.Stat(ctx, sumKey(prefix, n-1))
		if errors.Is(err, ErrObjectNotFound) {
			return fmt.Errorf("%w: part %d is not stored yet", ErrUploadOutOfOrder, n-1)
		}
		if err != nil {
			return err
		}
		if in, err = base64.StdEncoding.DecodeString(prev.Metadata[metaOut]); err != nil {
			return fmt.Errorf("%w: part %d's chain record is damaged: send it again", ErrUploadOutOfOrder, n-1)
		}
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(in); err != nil {
		return fmt.Errorf("%w: part %d's chain record is damaged: send it again", ErrUploadOutOfOrder, n-1)
	}
	in64, sumHex := base64.StdEncoding.EncodeToString(in), hex.EncodeToString(sum)
	pr := &partReader{r: body, left: u.partLen(n), d: d, h: h}
	if err := st.Put(ctx, partKey(prefix, n), pr, map[string]string{metaSHA256: sumHex, metaIn: in64}); err != nil {
		if pr.err != nil {
			return pr.err
		}
		return fmt.Errorf("workerapi: storing part %d: %w", n, err)
	}
	out, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return err
	}
	return st.Put(ctx, sumKey(prefix, n), eofReader{}, map[string]string{
		metaSHA256: sumHex, metaIn: in64, metaOut: base64.StdEncoding.EncodeToString(out),
	})
}

// emptyState is SHA-256's state before any byte.
func emptyState() ([]byte, error) {
	return sha256.New().(encoding.BinaryMarshaler).MarshalBinary()
}

// eofReader is an empty body.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// partReader passes a part's body through, into h and the Content-Digest
// check d, and fails rather than end when the body is cut, too long, or
// not the one signed: the store then keeps nothing of it.
type partReader struct {
	r    io.Reader
	left int64
	d    *replay.BodyDigest
	h    hash.Hash
	err  error
}

func (p *partReader) Read(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if int64(len(b)) > p.left+1 {
		b = b[:p.left+1] // one byte more tells a body that is too long
	}
	n, err := p.r.Read(b)
	if int64(n) > p.left {
		p.err = fmt.Errorf("%w: the part is longer than its Content-Length", ErrInvalidRequest)
		return 0, p.err
	}
	p.left -= int64(n)
	p.d.Write(b[:n])
	p.h.Write(b[:n])
	switch {
	case err == io.EOF && p.left > 0:
		p.err = fmt.Errorf("%w: the part was cut %d bytes short", ErrInvalidRequest, p.left)
		return n, p.err
	case err == io.EOF:
		if p.err = p.d.Check(); p.err != nil {
			return n, p.err
		}
		return n, io.EOF
	case err != nil:
		p.err = fmt.Errorf("%w: reading the part: %v", ErrInvalidRequest, err)
		return n, p.err
	}
	return n, nil
}

// verifyUpload checks, outside any transaction, that the upload uploadID
// of the job jobID holds the bytes declared (size and sha256). A part
// missing is ErrUploadIncomplete, and nothing is deleted; bytes that are
// not the ones declared are ErrArtifactMismatch, and every object of the
// upload is deleted.
func (s *Server) verifyUpload(ctx context.Context, jobID, uploadID string, size int64, sum string) (*upload, error) {
	st, err := s.store()
	if err != nil {
		return nil, err
	}
	u, err := s.openUpload(uploadID, jobID)
	if err != nil {
		return nil, err
	}
	switch {
	case size != u.Size:
		return nil, invalid("size_bytes %d is not the upload's %d", size, u.Size)
	case sum != u.SHA256:
		return nil, invalid("checksum_sha256 is not the upload's")
	}
	var mismatch error
	if u.Direct {
		mismatch, err = s.readBack(ctx, st, u)
	} else {
		mismatch, err = s.checkChain(ctx, st, u)
	}
	if err != nil {
		return nil, err
	}
	if mismatch != nil {
		if derr := s.deleteUnder(context.WithoutCancel(ctx), st, u.prefix()); derr != nil {
			s.log.Warn("deleting the parts of a refused upload", "job_id", jobID, "err", derr)
		}
		return nil, fmt.Errorf("%w: %w; the upload's parts were deleted and nothing was recorded", ErrArtifactMismatch, mismatch)
	}
	return u, nil
}

// checkChain checks a control-plane upload's chain records. It returns
// the mismatch it found, or an error (ErrUploadIncomplete, a store's).
func (s *Server) checkChain(ctx context.Context, st ArtifactStore, u *upload) (mismatch, err error) {
	prefix := u.prefix()
	prev, err := emptyState()
	if err != nil {
		return nil, err
	}
	for n := 1; n <= u.parts(); n++ {
		part, err := statPart(ctx, st, partKey(prefix, n), n)
		if err != nil {
			return nil, err
		}
		rec, err := statPart(ctx, st, sumKey(prefix, n), n)
		if err != nil {
			return nil, err
		}
		switch {
		case part.Size != u.partLen(n):
			return fmt.Errorf("part %d is %d bytes, not %d", n, part.Size, u.partLen(n)), nil
		case part.Metadata[metaSHA256] == "" || part.Metadata[metaSHA256] != rec.Metadata[metaSHA256]:
			return fmt.Errorf("part %d is not the bytes its chain record names", n), nil
		case rec.Metadata[metaIn] != base64.StdEncoding.EncodeToString(prev):
			return fmt.Errorf("part %d does not follow part %d", n, n-1), nil
		}
		if prev, err = base64.StdEncoding.DecodeString(rec.Metadata[metaOut]); err != nil {
			return fmt.Errorf("part %d's chain record is damaged", n), nil
		}
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(prev); err != nil {
		return fmt.Errorf("part %d's chain record is damaged", u.parts()), nil
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != u.SHA256 {
		return fmt.Errorf("the stored bytes' sha256 is %s, not the declared %s", got, u.SHA256), nil
	}
	return nil, nil
}

// readBack checks a direct upload by reading its parts back in order.
func (s *Server) readBack(ctx context.Context, st ArtifactStore, u *upload) (mismatch, err error) {
	prefix := u.prefix()
	for n := 1; n <= u.parts(); n++ {
		part, err := statPart(ctx, st, partKey(prefix, n), n)
		if err != nil {
			return nil, err
		}
		if part.Size != u.partLen(n) {
			return fmt.Errorf("part %d is %d bytes, not %d", n, part.Size, u.partLen(n)), nil
		}
	}
	h := sha256.New()
	r := &partsReader{ctx: ctx, st: st, prefix: prefix, size: u.Size, partSize: u.PartSize}
	defer r.Close()
	if _, err := io.Copy(h, r); err != nil {
		return nil, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != u.SHA256 {
		return fmt.Errorf("the stored bytes' sha256 is %s, not the declared %s", got, u.SHA256), nil
	}
	return nil, nil
}

// statPart stats key, the part n or its record: ErrUploadIncomplete when
// it is not stored.
func statPart(ctx context.Context, st ArtifactStore, key string, n int) (ObjectInfo, error) {
	info, err := st.Stat(ctx, key)
	if errors.Is(err, ErrObjectNotFound) {
		return info, fmt.Errorf("%w: part %d is not stored", ErrUploadIncomplete, n)
	}
	return info, err
}

// deleteUnder deletes every object whose key starts with prefix.
func (s *Server) deleteUnder(ctx context.Context, st ArtifactStore, prefix string) error {
	var keys []string
	for o, err := range st.List(ctx, prefix) {
		if err != nil {
			return err
		}
		keys = append(keys, o.Key)
	}
	var errs []error
	for _, k := range keys {
		errs = append(errs, st.Delete(ctx, k))
	}
	return errors.Join(errs...)
}

// partsReader reads a stored artifact across its parts, and seeks: what
// http.ServeContent needs for Range requests.
type partsReader struct {
	ctx            context.Context
	st             ArtifactStore
	prefix         string
	size, partSize int64
	pos            int64
	cur            io.ReadCloser
	curEnd         int64
}

func (p *partsReader) Read(b []byte) (int, error) {
	if p.pos >= p.size {
		return 0, io.EOF
	}
	if p.cur == nil {
		n := int(p.pos/p.partSize) + 1
		start := int64(n-1) * p.partSize
		rc, err := p.st.Open(p.ctx, partKey(p.prefix, n), p.pos-start, -1)
		if err != nil {
			return 0, fmt.Errorf("workerapi: opening part %d: %w", n, err)
		}
		p.cur, p.curEnd = rc, min(start+p.partSize, p.size)
	}
	if left := p.curEnd - p.pos; int64(len(b)) > left {
		b = b[:left]
	}
	n, err := p.cur.Read(b)
	p.pos += int64(n)
	if p.pos == p.curEnd {
		p.cur.Close()
		p.cur = nil
		return n, nil
	}
	if err == io.EOF {
		return n, fmt.Errorf("workerapi: a part ended %d bytes early: %w", p.curEnd-p.pos, io.ErrUnexpectedEOF)
	}
	return n, err
}

func (p *partsReader) Seek(offset int64, whence int) (int64, error) {
	var pos int64
	switch whence {
	case io.SeekStart:
		pos = offset
	case io.SeekCurrent:
		pos = p.pos + offset
	case io.SeekEnd:
		pos = p.size + offset
	default:
		return 0, fmt.Errorf("workerapi: seek whence %d", whence)
	}
	if pos < 0 {
		return 0, fmt.Errorf("workerapi: seek to %d, before the start", pos)
	}
	if pos != p.pos && p.cur != nil {
		p.cur.Close()
		p.cur = nil
	}
	p.pos = pos
	return pos, nil
}

func (p *partsReader) Close() error {
	if p.cur != nil {
		err := p.cur.Close()
		p.cur = nil
		return err
	}
	return nil
}

// OpenArtifact returns the artifact id and a reader of its stored bytes,
// which the caller closes. An unknown artifact is an error matching
// lease.ErrNotFound; a metadata-only one (or any, without a
// Config.Artifacts.Store) an error matching ErrNotFound.
func (s *Server) OpenArtifact(ctx context.Context, id string) (*lease.Artifact, io.ReadSeekCloser, error) {
	a, err := s.leases.Artifact(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if a.Object == "" || s.cfg.Artifacts.Store == nil || a.PartSize <= 0 {
		return nil, nil, fmt.Errorf("%w: artifact %s has no stored bytes", ErrNotFound, id)
	}
	return a, &partsReader{ctx: ctx, st: s.cfg.Artifacts.Store, prefix: a.Object, size: a.SizeBytes, partSize: a.PartSize}, nil
}

// written is the answer of a handler that wrote its response itself.
type written struct{}

// serveArtifact writes a's bytes from r as http.ServeContent does: Range
// (one or several), If-None-Match and If-Range against the ETag, the
// sha256; HEAD.
func serveArtifact(w http.ResponseWriter, req *http.Request, a *lease.Artifact, r io.ReadSeeker) {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"`+a.SHA256+`"`)
	h.Set("Content-Disposition", contentDisposition(a.Name))
	h.Set("Cache-Control", "private, no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, req, "", a.CreatedAt, r)
}

// contentDisposition is an attachment named after name, made safe: its
// last path element, with only letters, digits, '.', '-' and '_' kept.
func contentDisposition(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' || name[i] == '\\' {
			name = name[i+1:]
			break
		}
	}
	b := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_' {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	if len(b) == 0 || b[0] == '.' {
		b = append([]byte("artifact"), b...)
	}
	return `attachment; filename="` + string(b) + `"`
}

// workerContent: GET /workers/jobs/{id}/artifacts/{artifact}/content,
// the bytes of a stored artifact of the caller's leased job (a
// checkpoint to resume from).
func (s *Server) workerContent(ctx context.Context, c *call) (int, any, error) {
	ref, err := leaseRef(c, c.r.Header.Get(wire.HeaderLeaseToken))
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.leases.Extend(ctx, ref); err != nil {
		return 0, nil, err
	}
	id := c.r.PathValue("artifact")
	a, err := s.leases.Artifact(ctx, id)
	if errors.Is(err, lease.ErrNotFound) || err == nil && a.JobID != ref.JobID {
		return 0, nil, fmt.Errorf("%w: no artifact %s of this job", ErrNotFound, id)
	}
	if err != nil {
		return 0, nil, err
	}
	if a.Object == "" || s.cfg.Artifacts.Store == nil {
		return 0, nil, fmt.Errorf("%w: artifact %s has no stored bytes", ErrNotFound, id)
	}
	c.then = func(ctx context.Context) (int, any, error) {
		a, r, err := s.OpenArtifact(ctx, id)
		if err != nil {
			return 0, nil, err
		}
		defer r.Close()
		serveArtifact(c.w, c.r, a, r)
		return http.StatusOK, written{}, nil
	}
	return 0, nil, nil
}

// opArtifactContent: GET and HEAD /operator/artifacts/{id}/content.
func (s *Server) opArtifactContent(ctx context.Context, c *call) (int, any, error) {
	a, r, err := s.OpenArtifact(ctx, c.pathID())
	if errors.Is(err, lease.ErrNotFound) {
		return 0, nil, fmt.Errorf("%w: no artifact %s", ErrNotFound, c.pathID())
	}
	if err != nil {
		return 0, nil, err
	}
	defer r.Close()
	serveArtifact(c.w, c.r, a, r)
	return http.StatusOK, written{}, nil
}

// resumeFrom names the checkpoint a lease of j resumes from: the latest
// stored artifact of type wire.CheckpointType of an earlier lease of the
// job, or nil. A job's first lease (epoch 1) costs no query, nor does any
// lease without a store. Epochs, not attempts, tell a later lease: a
// released lease uses no attempt, and its checkpoint counts all the same.
func (s *Server) resumeFrom(ctx context.Context, j *lease.Job) (*wire.ResumeFrom, error) {
	if j.Lease == nil || j.Lease.Epoch <= 1 || s.cfg.Artifacts.Store == nil {
		return nil, nil
	}
	as, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: j.ID, Type: wire.CheckpointType, Limit: s.cfg.Artifacts.MaxPerJob})
	if err != nil {
		return nil, err
	}
	for i := len(as) - 1; i >= 0; i-- {
		a := as[i]
		if a.Object == "" || a.Epoch >= j.Lease.Epoch {
			continue
		}
		rf := &wire.ResumeFrom{ArtifactID: a.ID, Name: a.Name, SizeBytes: a.SizeBytes, ChecksumSHA256: a.SHA256}
		if pre, ok := s.presigner(); ok && partCount(a.SizeBytes, a.PartSize) == 1 {
			// One part is one object: a presigned GET reads it whole.
			if rf.URL, err = pre.PresignGet(ctx, partKey(a.Object, 1), s.cfg.Artifacts.UploadTTL); err != nil {
				return nil, fmt.Errorf("workerapi: presigning checkpoint %s: %w", a.ID, err)
			}
		}
		return rf, nil
	}
	return nil, nil
}

// grantJob is wireJob with the checkpoint the lease resumes from.
func (s *Server) grantJob(ctx context.Context, j *lease.Job) (wire.Job, error) {
	w := wireJob(j)
	rf, err := s.resumeFrom(ctx, j)
	w.ResumeFrom = rf
	return w, err
}
