package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// stallTimeout is how long a download waits for its next byte before it
// gives up (app.stallTimeout); the download as a whole has no deadline,
// since an artifact may take hours to arrive.
const stallTimeout = 60 * time.Second

// errStalled ends a download that received nothing for its stall
// timeout.
var errStalled = errors.New("the download stalled")

// errMismatch is a download whose bytes are not the artifact's.
var errMismatch = errors.New("the bytes received are not the artifact's")

func artifactsList(a *app, args []string) error {
	fs := a.flags("artifacts list", "")
	jobID := fs.String("job", "", "only the artifacts of this job `id`")
	kind := fs.String("type", "", "only artifacts of this artifact type (adapter, checkpoint, ...)")
	after := fs.String("after", "", "list artifacts after this id (the answer's next)")
	limit := fs.Int("limit", 100, "artifacts a page, 1 to 1000")
	order := orderFlag(fs)
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("artifacts list", *limit); err != nil {
		return err
	}
	if err := checkOrder("artifacts list", *order); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.ArtifactListResponse, error) {
		return api.ListArtifacts(ctx, operator.ArtifactQuery{JobID: *jobID, ArtifactType: *kind, After: *after, Limit: *limit, Order: *order})
	})
	if out == nil || err != nil {
		return err
	}
	printList(a, artifactCols, out.Artifacts, func(x wire.ArtifactView) string { return x.ArtifactID }, derefStr(out.Next))
	return nil
}

// artifactCols are the columns of artifacts list.
var artifactCols = []col[wire.ArtifactView]{
	{name: "ID", cell: func(x wire.ArtifactView) string { return x.ArtifactID }},
	{name: "JOB", cell: func(x wire.ArtifactView) string { return x.JobID }},
	{name: "TYPE", cell: func(x wire.ArtifactView) string { return x.ArtifactType }},
	{name: "BYTES", cell: func(x wire.ArtifactView) string {
		if x.Stored {
			return "stored"
		}
		return "metadata"
	}},
	{name: "SIZE", cell: func(x wire.ArtifactView) string { return humanBytes(x.SizeBytes) }},
	{name: "SHA256", cell: func(x wire.ArtifactView) string { return shortSum(x.ChecksumSHA256) }},
	{name: "NAME", cell: func(x wire.ArtifactView) string { return orDash(x.Name) }},
	{name: "STATUS", wide: true, cell: func(x wire.ArtifactView) string { return orDash(x.Status) }},
	{name: "WORKER", wide: true, cell: func(x wire.ArtifactView) string { return orDash(x.WorkerID) }},
	{name: "CREATED", wide: true, cell: func(x wire.ArtifactView) string { return tstr(x.CreatedAt) }},
	{name: "URI", wide: true, cell: func(x wire.ArtifactView) string { return orDash(x.URI) }},
}

// shortSum is the first 12 hex digits of a checksum, enough to tell
// artifacts apart and to compare with a file's.
func shortSum(p *string) string {
	if p == nil || len(*p) < 12 {
		return orDash(derefStr(p))
	}
	return (*p)[:12]
}

// downloadHelp follows the flags of artifacts download -h.
const downloadHelp = `
The bytes stream from GET /operator/artifacts/{id}/content into a temporary file beside FILE,
through sha256. FILE is replaced only when they are the artifact's: as many as it has, and
their sha256 the artifact's checksum, which the server sends as the ETag (and, with -job, the
one the job's artifact listing shows); it is then readable by its owner only (0600), since an
artifact may be private. Otherwise FILE is left as it was and the exit status is 1, as it is
for an artifact whose bytes are not stored (404: it is metadata only).

With -o - the bytes go to standard output as they arrive, so they are checked only after
they are written: on a mismatch the exit status is 1 and the reader must discard them (in a
pipeline, check it: set -o pipefail).

Examples:
  nodelanectl artifacts list -job job_…
  nodelanectl artifacts download -o adapter.safetensors art_…
  nodelanectl artifacts download -o - art_… | tar -x    # with set -o pipefail
`

func artifactsDownload(a *app, args []string) error {
	// -o is the file to write, not the output format.
	fs := a.flagsBut("artifacts download", "ARTIFACT_ID", "o")
	out := fs.String("o", "", "write the artifact's bytes to this `file` (required; - for standard output, verified only after it is written)")
	fs.StringVar(out, "out", "", "the `file` to write, as -o")
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprint(a.stderr, downloadHelp)
	}
	jobID := fs.String("job", "", "the artifact's job `id`: check its checksum and size in the job's artifact listing too")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	if *out == "" {
		return usagef("artifacts download: -o FILE is required (- for standard output)")
	}
	if st, err := os.Stat(*out); err == nil && st.IsDir() {
		return usagef("artifacts download: -o %s is a directory: name the file to write", *out)
	}
	id := a.arg(0)
	var listed *wire.ArtifactView
	if *jobID != "" {
		var err error
		if listed, err = a.listedArtifact(*jobID, id); err != nil {
			return err
		}
		if !listed.Stored {
			return fmt.Errorf("artifact %s of job %s is metadata only: the control plane holds no bytes of it (the worker reported %s)", id, *jobID, orDash(listed.URI))
		}
	}
	d, err := a.openContent(id)
	if err != nil {
		return err
	}
	defer d.Close()
	if listed != nil {
		if err := d.agrees(listed); err != nil {
			return err
		}
	}
	if *out == "-" {
		n, got, err := d.copyTo(a.stdout)
		if err != nil {
			return fmt.Errorf("artifact %s: after %d bytes to standard output: %w: discard them", id, n, err)
		}
		if err := d.check(n, got); err != nil {
			return fmt.Errorf("artifact %s: the %d bytes written to standard output: %w: discard them", id, n, err)
		}
		fmt.Fprintf(a.stderr, "artifact %s: %s written to standard output, sha256 %s verified\n", id, humanBytes(n), got)
		return nil
	}
	return d.toFile(a, id, *out)
}

// content is the answer of GET /operator/artifacts/{id}/content, its body
// not yet read.
type content struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	stall  *time.Timer
	// wait is how long the next byte may take.
	wait time.Duration
	// sha256 is the artifact's checksum, from the ETag, and size its
	// length.
	sha256 string
	size   int64
}

// openContent asks for the artifact's bytes through the operator
// client's ArtifactContent, on an HTTP client without a deadline for the
// whole answer (streamClient). An error answer is a *wire.Error (404 for
// an unknown or metadata-only artifact); an answer whose ETag is not a
// sha256 is refused, since its bytes could not be verified.
func (a *app) openContent(id string) (*content, error) {
	s, err := a.settings()
	if err != nil {
		return nil, err
	}
	if _, err := a.client(); err != nil { // checks the token and the server
		return nil, err
	}
	hc, err := streamClient(s)
	if err != nil {
		return nil, err
	}
	api, err := operator.New(s.server, s.token, &operator.Config{HTTPClient: hc, AllowInsecureHTTP: s.insecureHTTP})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(a.ctx)
	body, ct, err := api.ArtifactContent(ctx, id, 0)
	if errors.Is(err, operator.ErrMalformedAnswer) {
		cancel(nil)
		return nil, fmt.Errorf("%w: the artifact's bytes could not be verified, so none are written", err)
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	c := &content{body: body, ctx: ctx, cancel: cancel, sha256: ct.SHA256, size: ct.Size}
	if !isSHA256(ct.SHA256) || ct.Size < 0 {
		c.Close()
		return nil, fmt.Errorf("operator: GET %s: the answer's ETag %q or length %d is not the artifact's sha256 and size: its bytes could not be verified, so none are written",
			wire.OperatorArtifactContentPath(id), ct.SHA256, ct.Size)
	}
	c.wait = a.stallTimeout
	if c.wait == 0 {
		c.wait = stallTimeout
	}
	c.stall = time.AfterFunc(c.wait, func() { cancel(fmt.Errorf("%w: no byte arrived for %v", errStalled, c.wait)) })
	return c, nil
}

// isSHA256 reports whether s is a sha256 in lowercase hex.
func isSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// Close ends the request.
func (c *content) Close() {
	if c.stall != nil {
		c.stall.Stop()
	}
	c.body.Close()
	c.cancel(nil)
}

// agrees checks the answer against the artifact as its job's listing
// shows it.
func (c *content) agrees(x *wire.ArtifactView) error {
	if x.ChecksumSHA256 == nil || *x.ChecksumSHA256 != c.sha256 {
		return fmt.Errorf("artifact %s: %w: the content's sha256 (ETag) %s is not the listing's checksum_sha256 %s", x.ArtifactID, errMismatch, c.sha256, orDash(derefStr(x.ChecksumSHA256)))
	}
	if c.size != x.SizeBytes {
		return fmt.Errorf("artifact %s: %w: the content is %d bytes, the listing's size_bytes %d", x.ArtifactID, errMismatch, c.size, x.SizeBytes)
	}
	return nil
}

func derefStr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// copyTo copies the bytes to w and returns how many and their sha256.
func (c *content) copyTo(w io.Writer) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), stallReader{c})
	if err != nil {
		if cause := context.Cause(c.ctx); errors.Is(cause, errStalled) {
			err = cause
		}
		return n, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// stallReader reads the answer's body, pushing the stall timer back at
// each byte that arrives.
type stallReader struct{ c *content }

func (r stallReader) Read(p []byte) (int, error) {
	n, err := r.c.body.Read(p)
	if n > 0 {
		r.c.stall.Reset(r.c.wait)
	}
	return n, err
}

// check compares the bytes received, n of sha256 got, with the artifact.
func (c *content) check(n int64, got string) error {
	if n != c.size {
		return fmt.Errorf("%w: %d bytes arrived, the artifact has %d", errMismatch, n, c.size)
	}
	if got != c.sha256 {
		return fmt.Errorf("%w: they hash to sha256 %s, the artifact's checksum is %s", errMismatch, got, c.sha256)
	}
	return nil
}

// toFile writes the bytes to a temporary file beside path and renames it
// to path only once they verify; otherwise it removes it and path is left
// as it was.
func (c *content) toFile(a *app, id, path string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".download-*")
	if err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	n, got, err := c.copyTo(f)
	if err != nil {
		return fmt.Errorf("artifact %s: after %d bytes: %w; nothing written to %s", id, n, err, path)
	}
	if err := c.check(n, got); err != nil {
		return fmt.Errorf("artifact %s: %w; nothing written to %s", id, err, path)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	fmt.Fprintf(a.stderr, "artifact %s: %s to %s, sha256 %s verified\n", id, humanBytes(n), path, got)
	return nil
}

// listedArtifact finds artifact id in the listing of job jobID.
func (a *app) listedArtifact(jobID, id string) (*wire.ArtifactView, error) {
	api, err := a.client()
	if err != nil {
		return nil, err
	}
	for x, err := range api.Artifacts(a.ctx, operator.ArtifactQuery{JobID: jobID, Limit: 1000}) {
		if err != nil {
			return nil, err
		}
		if x.ArtifactID == id {
			return &x, nil
		}
	}
	return nil, fmt.Errorf("artifact %s is not an artifact of job %s", id, jobID)
}

// humanBytes writes a size in bytes as people read it: 512 B, 1.5 KiB,
// 64.0 MiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, unit := float64(n)/1024, 0
	// 1023.96 KiB would read 1024.0 KiB: it is 1.0 MiB.
	for v >= 1023.95 && unit < len(byteUnits)-1 {
		v /= 1024
		unit++
	}
	return fmt.Sprintf("%.1f %s", v, byteUnits[unit])
}

var byteUnits = []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
