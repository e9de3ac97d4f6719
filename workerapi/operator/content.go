package operator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// ErrContentMismatch means downloaded bytes are not the artifact's: their
// length or sha256 differs from what the control plane announced.
var ErrContentMismatch = errors.New("operator: the downloaded bytes are not the artifact's")

// Content describes an artifact's stored bytes, from the headers of GET
// or HEAD /operator/artifacts/{id}/content.
type Content struct {
	// Size is the length of the whole artifact.
	Size int64
	// SHA256 is the artifact's sha256 (the ETag), 64 lowercase hex digits.
	SHA256 string
	// Filename is the name Content-Disposition suggests.
	Filename string
}

// StatArtifactContent reads what ArtifactContent would serve, without
// the bytes (HEAD /operator/artifacts/{id}/content). A metadata-only or
// unknown artifact is a *wire.Error with Status 404.
func (c *Client) StatArtifactContent(ctx context.Context, id string) (*Content, error) {
	resp, err := c.open(ctx, http.MethodHead, id, 0)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return contentOf(resp)
}

// ArtifactContent opens the stored bytes of the artifact id from offset
// (GET /operator/artifacts/{id}/content, with Range: bytes=offset- when
// offset > 0); the caller closes the reader. It does not check the bytes:
// DownloadArtifact does. A metadata-only or unknown artifact is a
// *wire.Error with Status 404.
func (c *Client) ArtifactContent(ctx context.Context, id string, offset int64) (io.ReadCloser, *Content, error) {
	resp, err := c.open(ctx, http.MethodGet, id, offset)
	if err != nil {
		return nil, nil, err
	}
	ct, err := contentOf(resp)
	if err != nil {
		resp.Body.Close()
		return nil, nil, err
	}
	return resp.Body, ct, nil
}

// DownloadArtifact writes the stored bytes of the artifact id to w,
// streaming them through sha256, and returns what it wrote. If their
// length or sha256 is not the artifact's, it returns an error wrapping
// ErrContentMismatch, after w received them: a caller writing a file
// removes it then.
func (c *Client) DownloadArtifact(ctx context.Context, id string, w io.Writer) (*Content, error) {
	r, ct, err := c.ArtifactContent(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), r)
	if err != nil {
		return nil, fmt.Errorf("operator: downloading artifact %s: %w", id, err)
	}
	if n != ct.Size {
		return nil, fmt.Errorf("%w: %d bytes, not %d", ErrContentMismatch, n, ct.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != ct.SHA256 {
		return nil, fmt.Errorf("%w: sha256 %s, not %s", ErrContentMismatch, got, ct.SHA256)
	}
	return ct, nil
}

// open sends method to the content route of artifact id and returns a
// 200 or 206 answer, or the answer's *wire.Error.
func (c *Client) open(ctx context.Context, method, id string, offset int64) (*http.Response, error) {
	path := wire.OperatorArtifactContentPath(id)
	route := method + " " + path
	if err := checkToken(c.token); err != nil {
		return nil, fmt.Errorf("operator: %s: %w", route, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("operator: %s: %w", route, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	req.Header.Set("User-Agent", c.ua)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("operator: %s: %w", route, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
		return nil, answerError(route, resp, resp.Header.Get("Content-Type"), b)
	}
	return resp, nil
}

// contentOf reads a content answer's headers.
func contentOf(resp *http.Response) (*Content, error) {
	route := resp.Request.Method + " " + resp.Request.URL.Path
	etag := strings.Trim(resp.Header.Get("ETag"), `"`)
	if len(etag) != 64 {
		return nil, fmt.Errorf("operator: %s: %w: ETag %q is not a sha256", route, ErrMalformedAnswer, resp.Header.Get("ETag"))
	}
	ct := &Content{SHA256: etag, Size: resp.ContentLength}
	if resp.StatusCode == http.StatusPartialContent {
		// Content-Range: bytes first-last/size
		_, total, ok := strings.Cut(resp.Header.Get("Content-Range"), "/")
		n, err := strconv.ParseInt(total, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("operator: %s: %w: Content-Range %q", route, ErrMalformedAnswer, resp.Header.Get("Content-Range"))
		}
		ct.Size = n
	}
	if _, name, ok := strings.Cut(resp.Header.Get("Content-Disposition"), `filename="`); ok {
		ct.Filename = strings.TrimSuffix(name, `"`)
	}
	return ct, nil
}
