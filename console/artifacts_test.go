package console_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/workerapi/operator"
)

// contentAPI serves GET /operator/artifacts/art_stored/content with
// content, as the operator content route does (bearer token checked,
// Range, ETag the sha256, an attachment, here with a Content-Type a page
// would render), and passes every other request to api. It counts the
// requests of the content route it served.
func contentAPI(api http.Handler, token string, content []byte, served *int) http.Handler {
	sum := sha256.Sum256(content)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/operator/artifacts/art_stored/content" {
			api.ServeHTTP(w, r)
			return
		}
		*served++
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"no valid bearer credential"}}`))
			return
		}
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set("Content-Disposition", `inline; filename="page.html"`)
		w.Header().Set("X-Internal", "not for the browser")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
	})
}

// TestArtifactDownload checks the console's download of an artifact's
// bytes: streamed whole to a signed-in browser (more than the operator
// client's in-process buffer holds) as an attachment of type
// application/octet-stream, a Range answered 206, the API's refusal of a
// metadata-only or unknown artifact shown as a page, and nothing served
// without a session.
func TestArtifactDownload(t *testing.T) {
	t.Parallel()
	content := bytes.Repeat([]byte("<script>alert(1)</script> 0123456789abcdef"), (operator.MaxAnswerBytes+1<<20)/40)
	served := 0
	var f *fixture
	f = newFixture(t, func(c *console.Config) {
		api := c.API
		c.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			contentAPI(api, f.env.OperatorToken, content, &served).ServeHTTP(w, r)
		})
	})

	// Not signed in: sent to sign in, and the API is not asked.
	anon := f.browser(t)
	p := anon.get(t, "/artifacts/art_stored/download")
	if !strings.HasSuffix(p.url, "/console/signin") || strings.Contains(p.body, "0123456789abcdef") || served != 0 {
		t.Fatalf("download without a session: %d at %s (content route served %d times)", p.code, p.url, served)
	}

	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	p = b.get(t, "/artifacts/art_stored/download")
	if p.code != http.StatusOK || p.body != string(content) {
		t.Fatalf("download: %d, %d bytes, want 200 and the %d bytes", p.code, len(p.body), len(content))
	}
	sum := sha256.Sum256(content)
	for k, want := range map[string]string{
		"Content-Type":        "application/octet-stream",
		"Content-Disposition": "attachment",
		"ETag":                `"` + hex.EncodeToString(sum[:]) + `"`,
		"Accept-Ranges":       "bytes",
		"Cache-Control":       "no-store",
		"X-Internal":          "",
	} {
		if got := p.header.Get(k); got != want {
			t.Errorf("download: %s %q, want %q", k, got, want)
		}
	}

	req, err := http.NewRequest(http.MethodGet, f.url+"/artifacts/art_stored/download", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Range", "bytes=10-19")
	p = b.do(t, req)
	if p.code != http.StatusPartialContent || p.body != string(content[10:20]) || p.header.Get("Content-Range") != "bytes 10-19/"+strconv.Itoa(len(content)) {
		t.Errorf("Range: %d %q (Content-Range %q), want 206 %q", p.code, p.body, p.header.Get("Content-Range"), content[10:20])
	}
	req.Header.Del("Range")
	req.Header.Set("If-None-Match", p.header.Get("ETag"))
	if p = b.do(t, req); p.code != http.StatusNotModified || p.body != "" {
		t.Errorf("If-None-Match: %d with %d bytes, want 304", p.code, len(p.body))
	}

	// An artifact the content route does not serve: the API's 404, shown.
	p = b.get(t, "/artifacts/art_missing/download")
	if p.code != http.StatusNotFound || !strings.Contains(p.header.Get("Content-Type"), "text/html") || !strings.Contains(p.body, "404") {
		t.Errorf("unknown artifact: %d %q\n%s", p.code, p.header.Get("Content-Type"), p.body)
	}

	// Signed out: the session no longer downloads.
	b.post(t, "/signout", nil)
	before := served
	if p = b.get(t, "/artifacts/art_stored/download"); !strings.HasSuffix(p.url, "/console/signin") || served != before {
		t.Errorf("download after sign-out: %d at %s", p.code, p.url)
	}
}
