package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// ErrArtifactStorageOff is wrapped (beside the *APIError) by the error
// of an upload the control plane refuses with 404 artifact_storage_off:
// it stores no artifact bytes; and by that of a control plane older than
// the upload route, which answers 404 not_found. Report the artifact as
// metadata only (Client.Artifact, Reporter.Artifact) instead.
var ErrArtifactStorageOff = errors.New("client: the control plane stores no artifact bytes")

// ErrChecksumMismatch is wrapped by the error of a download whose bytes
// are not the artifact's declared size and sha256; the file written is
// removed.
var ErrChecksumMismatch = errors.New("client: the downloaded bytes are not the artifact's")

// ArtifactFile describes an artifact to upload.
type ArtifactFile struct {
	// Name and Type are the artifact's name and artifact_type.
	// Reporter.UploadArtifact defaults Name to the file's base name and
	// Type to "file"; wire.CheckpointType marks a checkpoint, which a later
	// attempt of the job may resume from.
	Name, Type string
	// Metadata must marshal to a JSON object, or be nil.
	Metadata any
	// URI, optional, is recorded beside the stored bytes.
	URI string
	// SHA256 (64 lowercase hex digits), when set, is the bytes' sum,
	// computed already; else the upload reads the bytes once to compute
	// it. A wrong one is refused by the control plane (artifact_mismatch).
	SHA256 string
}

// UploadArtifact uploads size bytes of src as an artifact of the job
// leased with leaseToken, and records it as stored (PROTOCOL.md §5.19 to
// §5.21): it computes their sha256 (unless a.SHA256 is set), asks for an
// upload (POST /workers/jobs/{id}/uploads), sends each part, and finishes
// on POST /workers/jobs/{id}/artifacts with the upload's id, where the
// control plane checks the stored bytes against the declared sha256 and
// size. A part goes to the control plane as a signed PUT whose body
// streams from src (read twice: once for its Content-Digest, once to
// send it), or, when the control plane hands out presigned URLs, straight
// to the artifact store as a plain PUT that carries no credential of the
// node. A part whose request fails (a dropped connection, a 5xx, a 429)
// is sent again, alone, after a backoff, up to Config.MaxAttempts times;
// the parts sent before it stay stored. No part is held in memory whole.
//
// When the control plane stores no bytes, the error wraps
// ErrArtifactStorageOff. ctx ending aborts the upload; the control plane
// sweeps the parts of an upload never finished.
func (c *Client) UploadArtifact(ctx context.Context, jobID, leaseToken string, src io.ReaderAt, size int64, a ArtifactFile) (*wire.ArtifactResponse, error) {
	return c.upload(ctx, jobID, leaseToken, src, size, a, nil)
}

// upload is UploadArtifact, calling extend with each new lease expiry a
// part's answer gives.
func (c *Client) upload(ctx context.Context, jobID, leaseToken string, src io.ReaderAt, size int64, a ArtifactFile, extend func(time.Time)) (*wire.ArtifactResponse, error) {
	if size < 0 {
		return nil, fmt.Errorf("client: upload: negative size %d", size)
	}
	sum := a.SHA256
	if sum == "" {
		h := sha256.New()
		if _, err := io.Copy(h, ctxReader{ctx, io.NewSectionReader(src, 0, size)}); err != nil {
			return nil, fmt.Errorf("client: upload: reading the artifact: %w", err)
		}
		sum = hex.EncodeToString(h.Sum(nil))
	}
	req := wire.UploadRequest{LeaseToken: leaseToken, ArtifactType: a.Type, Name: a.Name, SizeBytes: &size, ChecksumSHA256: sum}
	if err := c.key(&req.IdempotencyKey); err != nil {
		return nil, err
	}
	var up wire.UploadResponse
	if _, err := c.do(ctx, wire.JobPath(jobID, wire.ActionUploads), req, &up, callOpts{}); err != nil {
		// A control plane older than the route answers 404 not_found: it
		// stores no bytes either.
		if IsCode(err, wire.CodeArtifactStorageOff) || IsCode(err, wire.CodeNotFound) {
			return nil, fmt.Errorf("%w: %w", ErrArtifactStorageOff, err)
		}
		return nil, err
	}
	if err := checkUpload(&up, size); err != nil {
		return nil, err
	}
	for _, p := range up.Parts {
		if err := c.sendPart(ctx, leaseToken, &up, p, src, extend); err != nil {
			return nil, err
		}
	}
	fin := wire.ArtifactRequest{LeaseToken: leaseToken, ArtifactType: a.Type, Name: a.Name, URI: a.URI,
		ChecksumSHA256: &sum, SizeBytes: &size, Metadata: objectPayload(a.Metadata), UploadID: up.UploadID}
	return c.Artifact(ctx, jobID, fin)
}

// checkUpload checks that an upload's parts cover size bytes in order,
// each a PUT to a URL of the kind Direct says.
func checkUpload(up *wire.UploadResponse, size int64) error {
	bad := func(format string, args ...any) error {
		return &APIError{Status: http.StatusCreated, Route: "upload", Message: "the upload's answer is not usable: " + fmt.Sprintf(format, args...)}
	}
	if up.UploadID == "" || len(up.Parts) == 0 {
		return bad("no upload_id or no part")
	}
	var off int64
	for i, p := range up.Parts {
		if p.PartNumber != i+1 || p.Offset != off || p.SizeBytes < 0 || p.SizeBytes > size-off || p.Method != http.MethodPut {
			return bad("part %d is not part %d, a PUT of bytes from %d", p.PartNumber, i+1, off)
		}
		if up.Direct {
			u, err := url.Parse(p.URL)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return bad("part %d's URL is not an absolute http(s) URL", p.PartNumber)
			}
		} else if !strings.HasPrefix(p.URL, "/workers/") || strings.Contains(p.URL, "//") || strings.ContainsAny(p.URL, "?#") {
			return bad("part %d's URL is not a worker route", p.PartNumber)
		}
		off += p.SizeBytes
	}
	if off != size {
		return bad("the parts hold %d bytes, not %d", off, size)
	}
	return nil
}

// sendPart sends part p of up, again after a failure that may pass.
func (c *Client) sendPart(ctx context.Context, leaseToken string, up *wire.UploadResponse, p wire.UploadPart, src io.ReaderAt, extend func(time.Time)) error {
	sec := io.NewSectionReader(src, p.Offset, p.SizeBytes)
	var sum [sha256.Size]byte
	if !up.Direct {
		h := sha256.New()
		if _, err := io.Copy(h, ctxReader{ctx, io.NewSectionReader(sec, 0, sec.Size())}); err != nil {
			return fmt.Errorf("client: upload: reading part %d: %w", p.PartNumber, err)
		}
		h.Sum(sum[:0])
	}
	what := fmt.Sprintf("part %d of %d", p.PartNumber, len(up.Parts))
	for attempt, waits := 1, 0; ; attempt++ {
		var err error
		if up.Direct {
			err = c.putDirect(ctx, what, p, sec)
		} else {
			var out wire.UploadPartResponse
			_, err = c.send(ctx, &call{method: http.MethodPut, route: p.URL, stream: sec, sum: sum,
				contentType: "application/octet-stream", leaseToken: leaseToken, out: &out, attempts: 1})
			if err == nil && extend != nil {
				extend(out.ExpiresAt)
			}
		}
		if err == nil {
			return nil
		}
		var ae *APIError
		busy := errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests && ae.RetryAfter > 0
		if busy && waits < 100 {
			// Too many parts stream at once through the control plane:
			// waiting for a slot is no failure of this part.
			waits++
			attempt--
		}
		if !IsRetryable(err) || ctx.Err() != nil || attempt >= c.cfg.MaxAttempts {
			return fmt.Errorf("client: upload: %s: %w", what, err)
		}
		d := c.backoff(attempt)
		if errors.As(err, &ae) && ae.RetryAfter > 0 {
			d = ae.RetryAfter + jitter(c.cfg.RetryBase)
		}
		c.log.Info("sending an artifact part again", "part", what, "attempt", attempt+1, "in", d, "err", err)
		if !sleep(ctx, d) {
			return fmt.Errorf("client: upload: %s: %w (after: %w)", what, context.Cause(ctx), err)
		}
	}
}

// putDirect sends one attempt of a part to its presigned URL: the
// headers the control plane named and the bytes, no credential.
func (c *Client) putDirect(ctx context.Context, what string, p wire.UploadPart, sec *io.SectionReader) error {
	actx, idle := newIdleWatch(ctx, c.cfg.RequestTimeout)
	defer idle.stop()
	route := "presigned PUT of " + what
	req, err := http.NewRequestWithContext(actx, http.MethodPut, p.URL, idle.reader(io.NewSectionReader(sec, 0, sec.Size())))
	if err != nil {
		return fmt.Errorf("client: %s: %w", route, redactURLError(err))
	}
	req.ContentLength = sec.Size()
	if req.ContentLength == 0 {
		req.Body = http.NoBody
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	resp, err := c.store.Do(req)
	if err != nil {
		return c.directError(ctx, actx, route, err)
	}
	defer resp.Body.Close()
	idle.touch()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	return storeError(resp, route, c.cfg.Now())
}

// directError is the error of a request to the store that got no answer.
func (c *Client) directError(ctx, actx context.Context, route string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if cause := context.Cause(actx); errors.Is(cause, errIdle) {
		err = cause
	}
	return &transportError{route: route, err: redactURLError(err)}
}

// storeError is the error of a store's answer that is not a success. Its
// message is the code and message of an S3 error document, never the
// whole body: S3 echoes the request's signature in some.
func storeError(resp *http.Response, route string, now time.Time) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var doc struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	msg := "the artifact store refused the request"
	if xml.Unmarshal(b, &doc) == nil && doc.Code != "" {
		msg = snippet([]byte(doc.Code + ": " + doc.Message))
	}
	return &APIError{Status: resp.StatusCode, Route: route, Message: msg,
		RetryAfter: retryAfter(resp.Header.Get("Retry-After"), now)}
}

// redactURLError drops the query (a presigned URL's signature) and user
// information from the URL a *url.Error names.
func redactURLError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	return &url.Error{Op: ue.Op, URL: redactURL(ue.URL), Err: ue.Err}
}

// redactURL is s without its query, fragment and user information.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL)"
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// ctxReader is a reader that fails once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, context.Cause(r.ctx)
	}
	return r.r.Read(p)
}

// DownloadArtifact writes the bytes of a stored artifact of the job
// leased with leaseToken to the file dst (created 0600, or truncated),
// such as the checkpoint of a grant's Job.ResumeFrom: from its presigned
// URL when it has one (a plain GET, no credential), else, or when the
// store refuses the URL (it expired), by a signed GET of
// /workers/jobs/{id}/artifacts/{artifact_id}/content. A transfer cut
// short goes on where it stopped (a Range request), up to
// Config.MaxAttempts times. The bytes are checked against from's size and
// sha256 as they are written; on a mismatch dst is removed and the error
// wraps ErrChecksumMismatch.
func (c *Client) DownloadArtifact(ctx context.Context, jobID, leaseToken string, from *wire.ResumeFrom, dst string) (err error) {
	if from == nil || from.ArtifactID == "" || from.SizeBytes < 0 || len(from.ChecksumSHA256) != 64 {
		return errors.New("client: download: the artifact has no id, size or sha256")
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("client: download: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("client: download: %w", cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	d := &download{f: f, h: sha256.New(), size: from.SizeBytes}
	route := wire.ArtifactContentPath(jobID, from.ArtifactID)
	direct := from.URL != ""
	for attempt := 1; ; attempt++ {
		if direct {
			err = c.getDirect(ctx, from.URL, d)
			var ae *APIError
			if errors.As(err, &ae) && !ae.Temporary() {
				// The store refuses the URL (it expired, say): the
				// control plane serves the same bytes.
				c.log.Info("the presigned URL of an artifact was refused: reading it from the control plane", "artifact", from.ArtifactID, "err", err)
				direct = false
				attempt--
				continue
			}
		} else {
			h := http.Header{}
			if d.off > 0 {
				h.Set("Range", "bytes="+strconv.FormatInt(d.off, 10)+"-")
			}
			_, err = c.send(ctx, &call{method: http.MethodGet, route: route, contentType: "application/octet-stream",
				leaseToken: leaseToken, header: h, recv: d.recv(route), attempts: 1})
		}
		if err == nil {
			break
		}
		if !IsRetryable(err) || ctx.Err() != nil || attempt >= c.cfg.MaxAttempts {
			return fmt.Errorf("client: download of %s: %w", from.ArtifactID, err)
		}
		wait := c.backoff(attempt)
		var ae *APIError
		if errors.As(err, &ae) && ae.RetryAfter > 0 {
			wait = ae.RetryAfter + jitter(c.cfg.RetryBase)
		}
		c.log.Info("downloading an artifact again", "artifact", from.ArtifactID, "from_byte", d.off, "in", wait, "err", err)
		if !sleep(ctx, wait) {
			return fmt.Errorf("client: download of %s: %w (after: %w)", from.ArtifactID, context.Cause(ctx), err)
		}
	}
	if got := hex.EncodeToString(d.h.Sum(nil)); d.off != from.SizeBytes || got != from.ChecksumSHA256 {
		return fmt.Errorf("%w: %s: got %d bytes of sha256 %s, want %d bytes of sha256 %s", ErrChecksumMismatch,
			from.ArtifactID, d.off, got, from.SizeBytes, from.ChecksumSHA256)
	}
	return nil
}

// download is a transfer in progress: off bytes written to f and h.
type download struct {
	f    *os.File
	h    hash.Hash
	off  int64
	size int64
}

// recv reads an answer into the download: a 206 goes on from off, a 200
// starts over.
func (d *download) recv(route string) func(*http.Response) error {
	return func(resp *http.Response) error {
		if resp.StatusCode != http.StatusPartialContent && d.off > 0 {
			if err := d.f.Truncate(0); err != nil {
				return err
			}
			if _, err := d.f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			d.h.Reset()
			d.off = 0
		}
		// One byte more than expected shows a body too long.
		r := io.LimitReader(resp.Body, d.size-d.off+1)
		buf := make([]byte, 256<<10)
		for {
			n, rerr := r.Read(buf)
			if n > 0 {
				if _, err := d.f.Write(buf[:n]); err != nil {
					return err
				}
				d.h.Write(buf[:n])
				d.off += int64(n)
			}
			switch {
			case rerr == io.EOF:
				return nil
			case rerr != nil:
				return &transportError{route: route, err: fmt.Errorf("reading the answer: %w", rerr)}
			}
		}
	}
}

// getDirect reads an artifact from its presigned URL, from d.off on.
func (c *Client) getDirect(ctx context.Context, u string, d *download) error {
	actx, idle := newIdleWatch(ctx, c.cfg.RequestTimeout)
	defer idle.stop()
	const route = "presigned GET"
	req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("client: %s: %w", route, redactURLError(err))
	}
	if d.off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(d.off, 10)+"-")
	}
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	resp, err := c.store.Do(req)
	if err != nil {
		return c.directError(ctx, actx, route, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return storeError(resp, route, c.cfg.Now())
	}
	resp.Body = idle.readCloser(resp.Body)
	if err := d.recv(route)(resp); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var te *transportError
		if errors.As(err, &te) {
			return &transportError{route: route, err: redactURLError(te.err)}
		}
		return err
	}
	return nil
}

// UploadArtifact uploads the regular file at path as an artifact of the
// job and records it as stored (Client.UploadArtifact): the job's result
// should be reported only once it returns. a.Name defaults to the file's
// base name, a.Type to "file". When the control plane stores no artifact
// bytes the error wraps ErrArtifactStorageOff: report the artifact with
// Artifact instead. The job's context ending (a cancel, a drain, a lost
// lease) aborts the upload, if ctx derives from it.
func (r *Reporter) UploadArtifact(ctx context.Context, path string, a ArtifactFile) (*wire.ArtifactResponse, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("client: artifact: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("client: artifact: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("client: artifact: %s is not a regular file", path)
	}
	if a.Name == "" {
		a.Name = filepath.Base(path)
	}
	return r.UploadArtifactFrom(ctx, f, fi.Size(), a)
}

// UploadArtifactFrom is UploadArtifact for size bytes of src, such as a
// file already open; a.Name is required, a.Type defaults to "file".
func (r *Reporter) UploadArtifactFrom(ctx context.Context, src io.ReaderAt, size int64, a ArtifactFile) (*wire.ArtifactResponse, error) {
	if a.Type == "" {
		a.Type = "file"
	}
	out, err := r.t.w.c.upload(ctx, r.t.id, r.t.token, src, size, a, r.t.extend)
	if IsLeaseLost(err) {
		r.t.lose()
	}
	return out, err
}

// ResumeFrom returns the checkpoint this attempt of the job may resume
// from: the latest stored artifact of type wire.CheckpointType of an
// earlier attempt, as the grant named it; nil when there is none (always
// on the first attempt).
func (r *Reporter) ResumeFrom() *wire.ResumeFrom {
	j := r.t.jobCopy()
	return j.ResumeFrom
}

// DownloadCheckpoint downloads the checkpoint ResumeFrom names into the
// directory dir, under its name (its base name; "checkpoint" when it has
// none that is safe), verifying its size and sha256
// (Client.DownloadArtifact), and returns the file's path; "" and nil when
// the attempt has no checkpoint to resume from.
func (r *Reporter) DownloadCheckpoint(ctx context.Context, dir string) (string, error) {
	rf := r.ResumeFrom()
	if rf == nil {
		return "", nil
	}
	dst := filepath.Join(dir, CheckpointFileName(rf.Name))
	err := r.t.w.c.DownloadArtifact(ctx, r.t.id, r.t.token, rf, dst)
	if IsLeaseLost(err) {
		r.t.lose()
	}
	if err != nil {
		return "", err
	}
	return dst, nil
}

// CheckpointFileName is the file name a checkpoint named name is
// downloaded to: its base name when that is a plain file name, else
// "checkpoint".
func CheckpointFileName(name string) string {
	b := filepath.Base(strings.ReplaceAll(name, `\`, "/"))
	if b == "." || b == ".." || b == "/" || b == "" || strings.ContainsAny(b, "\x00/") || strings.HasPrefix(b, ".") {
		return "checkpoint"
	}
	return b
}
