package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// maxErrorAnswer bounds what the console keeps of an error answer of the
// content route, to explain it.
const maxErrorAnswer = 64 << 10

// contentHeaders are the headers of the API's content answer that reach
// the browser; the console sets Content-Type and Content-Disposition
// itself.
var contentHeaders = []string{"Content-Length", "Content-Range", "Accept-Ranges", "ETag", "Last-Modified"}

// conditionalHeaders are the browser's headers the content request
// carries: a resumed download's Range, and the validators.
var conditionalHeaders = []string{"Range", "If-Range", "If-None-Match", "If-Match", "If-Modified-Since", "If-Unmodified-Since"}

// artifactDownload streams a stored artifact's bytes to the signed-in
// operator: GET (or HEAD) /operator/artifacts/{id}/content of Config.API,
// in process, with the session's token and the browser's Range and
// conditional headers, so the API authenticates and scope-checks it as
// any page's read. It calls the handler itself rather than through the
// operator client, whose HandlerTransport holds a whole answer in memory
// (at most operator.MaxAnswerBytes): an artifact of gigabytes passes
// through as it is read. A GET changes nothing, so it needs no
// cross-origin check beyond the session cookie, which is SameSite=Strict.
//
// The answer is always an attachment of type application/octet-stream
// (or multipart/byteranges of it, for several ranges), whatever the API
// says, so that no artifact's bytes render as a page of the console's
// origin. An error answer of the API (404 for a
// metadata-only artifact) is shown as a console page.
func (c *Console) artifactDownload(w http.ResponseWriter, r *http.Request, s *session) {
	path := "/operator/artifacts/" + url.PathEscape(r.PathValue("id")) + "/content"
	req, err := http.NewRequestWithContext(r.Context(), r.Method, "http://console"+path, http.NoBody)
	if err != nil {
		c.renderError(w, r, http.StatusBadRequest, "Bad request: "+err.Error()+".")
		return
	}
	// As a server hands a request over (see operator.HandlerTransport).
	req.RequestURI, req.Host, req.RemoteAddr = path, "console", r.RemoteAddr
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		req.Header["X-Forwarded-For"] = xff
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("User-Agent", "nodelane-console")
	for _, h := range conditionalHeaders {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	dw := &downloadWriter{w: w, header: http.Header{}}
	c.cfg.API.ServeHTTP(dw, req)
	if dw.status == 0 {
		dw.WriteHeader(http.StatusOK)
	}
	if dw.status == http.StatusUnauthorized {
		c.sessions.endCredential(s)
	}
	if dw.errBody != nil {
		err := answerError(path, dw.status, dw.errBody.Bytes())
		c.render(w, r, err.Status, "error", s, &pageData{Title: http.StatusText(err.Status), Nav: "jobs", Data: explain(err), Flashes: []flash{{Error: true, Text: explain(err)}}})
	}
}

// answerError is the *wire.Error of an error answer of the API.
func answerError(path string, code int, body []byte) *wire.Error {
	e := &wire.Error{Status: code, Route: "GET " + path}
	var eb wire.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
	} else {
		e.Code, e.Message = strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_"), fmt.Sprintf("the artifact's content answered %d", code)
	}
	return e
}

// downloadWriter is the ResponseWriter the API's content route writes
// to: a success (2xx, 304) goes to the browser as it comes, with only
// contentHeaders of the API's headers; an error is kept (bounded) for the
// console to explain.
type downloadWriter struct {
	w      http.ResponseWriter
	header http.Header
	status int
	// errBody holds an error answer's body; nil for a success.
	errBody *bytes.Buffer
}

func (d *downloadWriter) Header() http.Header { return d.header }

func (d *downloadWriter) WriteHeader(code int) {
	if d.status != 0 || code < 200 {
		return // informational answers are not passed on
	}
	d.status = code
	if code >= 400 {
		d.errBody = new(bytes.Buffer)
		return
	}
	h := d.w.Header()
	for _, k := range contentHeaders {
		if v := d.header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	ct := "application/octet-stream"
	if api := d.header.Get("Content-Type"); code == http.StatusPartialContent && strings.HasPrefix(api, "multipart/byteranges;") {
		ct = api // several ranges, each part of the body typed octet-stream
	}
	h.Set("Content-Type", ct)
	cd := d.header.Get("Content-Disposition")
	if !strings.HasPrefix(strings.ToLower(cd), "attachment") {
		cd = "attachment"
	}
	h.Set("Content-Disposition", cd)
	d.w.WriteHeader(code)
}

func (d *downloadWriter) Write(b []byte) (int, error) {
	if d.status == 0 {
		d.WriteHeader(http.StatusOK)
	}
	if d.errBody != nil {
		if room := maxErrorAnswer - d.errBody.Len(); room > 0 {
			d.errBody.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	return d.w.Write(b)
}

// Flush passes a flush on, when the browser's writer can.
func (d *downloadWriter) Flush() {
	if f, ok := d.w.(http.Flusher); ok && d.errBody == nil && d.status != 0 {
		f.Flush()
	}
}

// humanBytes writes a size in bytes as people read it: 512 B, 1.5 KiB,
// 64.0 MiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
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
