package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// fixture is a control plane on SQLite with the console mounted at
// /console/ beside the API, served over loopback.
type fixture struct {
	env     *apitest.Env
	console *console.Console
	srv     *httptest.Server
	url     string // the console's root, ending in /console
}

func newFixture(t *testing.T, cfg func(*console.Config)) *fixture {
	t.Helper()
	return newFixtureOn(t, "sqlite", nil, cfg)
}

// newFixtureOn is newFixture on dialect, with api changing the API's
// configuration (nil: none).
func newFixtureOn(t *testing.T, dialect string, api func(*workerapi.Config), cfg func(*console.Config)) *fixture {
	t.Helper()
	env := apitest.New(t, dialect, apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}}
		if api != nil {
			api(c)
		}
	}))
	cc := console.Config{API: env.Server.OperatorHandler(), VerifierKey: env.Server.ReceiptVerifierKey(), Origin: env.Config.Origin}
	if cfg != nil {
		cfg(&cc)
	}
	c, err := console.New(cc)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", c))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &fixture{env: env, console: c, srv: srv, url: srv.URL + "/console"}
}

// browser is a client with a cookie jar that sends what a browser sends
// on a same-origin form post.
type browser struct {
	f   *fixture
	hc  *http.Client
	jar *cookiejar.Jar
}

func (f *fixture) browser(t *testing.T) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{f: f, jar: jar, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

// page is an answer, its body read.
type page struct {
	code   int
	header http.Header
	body   string
	url    string
}

func (b *browser) do(t *testing.T, req *http.Request) page {
	t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := page{code: resp.StatusCode, header: resp.Header, body: string(body), url: resp.Request.URL.String()}
	checkHeaders(t, req.Method+" "+req.URL.Path, p)
	return p
}

// checkHeaders checks what every console response must carry.
func checkHeaders(t *testing.T, what string, p page) {
	t.Helper()
	if got := p.header.Get("Content-Security-Policy"); got != console.ContentSecurityPolicy {
		t.Errorf("%s: Content-Security-Policy %q, want %q", what, got, console.ContentSecurityPolicy)
	}
	if p.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s: no X-Content-Type-Options: nosniff", what)
	}
	if strings.HasPrefix(p.header.Get("Content-Type"), "text/html") {
		// No inline script or style: the CSP would block them, and the
		// page must read without them.
		if m := regexp.MustCompile(`<script(?:[^>]*)>[^<]+</script>|<script(?:[^s>]|s[^r])*>|\son[a-z]+=|style=`).FindString(p.body); m != "" {
			t.Errorf("%s: inline script or style %q", what, m)
		}
	}
}

func (b *browser) get(t *testing.T, path string) page {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.f.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b.do(t, req)
}

// post submits a form as a browser on the console's origin does.
func (b *browser) post(t *testing.T, path string, form url.Values) page {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.f.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.f.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return b.do(t, req)
}

func (b *browser) signIn(t *testing.T, token string) page {
	t.Helper()
	p := b.post(t, "/signin", url.Values{"token": {token}})
	if p.code != http.StatusOK || !strings.Contains(p.body, "<h1>Overview</h1>") {
		t.Fatalf("sign-in: %d at %s:\n%s", p.code, p.url, p.body)
	}
	return p
}

func mustContain(t *testing.T, what string, p page, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(p.body, w) {
			t.Errorf("%s: the page does not contain %q:\n%s", what, w, p.body)
		}
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	h := http.NotFoundHandler()
	for _, tc := range []struct {
		name string
		cfg  console.Config
	}{
		{"no API", console.Config{VerifierKey: "k"}},
		{"no key", console.Config{API: h}},
		{"negative TTL", console.Config{API: h, VerifierKey: "k", SessionTTL: -time.Second}},
		{"negative sessions", console.Config{API: h, VerifierKey: "k", MaxSessions: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := console.New(tc.cfg); !errors.Is(err, console.ErrConfig) {
				t.Fatalf("New: %v, want ErrConfig", err)
			}
		})
	}
}

func TestSignIn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)

	p := b.get(t, "/")
	if !strings.HasSuffix(p.url, "/console/signin") || p.code != http.StatusOK {
		t.Fatalf("GET / unsigned went to %s (%d), want the sign-in page", p.url, p.code)
	}
	mustContain(t, "sign-in page", p, `action="/console/signin"`, `href="/console/static/console.css"`)

	for _, bad := range []string{"", "nlc_notatoken", "nlc_not a token", "nlc_\u00e9t\u00e9", f.env.ProvisioningToken[:len(f.env.ProvisioningToken)-2] + "xx"} {
		p := b.post(t, "/signin", url.Values{"token": {bad}})
		if p.code != http.StatusUnauthorized || !strings.Contains(p.body, `class="flash error"`) {
			t.Errorf("sign-in with %q: %d\n%s", bad, p.code, p.body)
		}
		if cs := b.jar.Cookies(mustURL(t, f.url+"/")); len(cs) != 0 {
			t.Errorf("sign-in with %q set cookies %v", bad, cs)
		}
	}

	// The cookie's flags, from the raw Set-Cookie.
	req, _ := http.NewRequest(http.MethodPost, f.url+"/signin", strings.NewReader(url.Values{"token": {f.env.OperatorToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("sign-in: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cs := resp.Cookies()
	if len(cs) != 1 {
		t.Fatalf("sign-in set %d cookies", len(cs))
	}
	c := cs[0]
	if c.Name != console.CookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != "/console/" || c.MaxAge <= 0 {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP, Path /console/", c)
	}
	if strings.Contains(c.Value, f.env.OperatorToken) || strings.Contains(c.Value, "nlc_") {
		t.Errorf("the cookie carries the token")
	}

	p = b.signIn(t, f.env.OperatorToken)
	mustContain(t, "overview", p, "Sign out", "Queue by state and type")
	// Signed in, /signin leads to the overview.
	if p := b.get(t, "/signin"); !strings.Contains(p.body, "<h1>Overview</h1>") {
		t.Errorf("GET /signin when signed in: %s", p.url)
	}
	p = b.post(t, "/signout", nil)
	if !strings.HasSuffix(p.url, "/console/signin") {
		t.Fatalf("sign-out went to %s", p.url)
	}
	if p := b.get(t, "/jobs"); !strings.HasSuffix(p.url, "/console/signin") {
		t.Errorf("after sign-out, /jobs went to %s", p.url)
	}
	// The old cookie value is dead too, not only forgotten by the jar.
	if p := b.get(t, "/jobs/x/events"); p.code != http.StatusUnauthorized {
		t.Errorf("after sign-out, the events route answered %d", p.code)
	}
}

func TestSignInOverTLS(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	c, err := console.New(console.Config{API: env.Server.OperatorHandler(), VerifierKey: env.Server.ReceiptVerifierKey(), Origin: env.Config.Origin})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(c)
	t.Cleanup(srv.Close)
	hc := srv.Client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.PostForm(srv.URL+"/signin", url.Values{"token": {env.OperatorToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cs := resp.Cookies()
	if len(cs) != 1 || !cs[0].Secure || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/" {
		t.Fatalf("over TLS the cookie is %+v, want Secure, HttpOnly, SameSite=Strict, Path /", cs)
	}
}

// TestSessionsBounded checks that sessions are bounded per credential
// and in all, and that neither bound ever ends another credential's
// session: a credential's sign-ins end its own oldest, and a sign-in
// when every session is taken is refused. Before issue 29 the table
// ended the session that would expire first, anyone's: 1,000 sign-ins
// with one token signed every operator out.
func TestSessionsBounded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	clock := func() time.Time { return now }
	f := newFixture(t, func(c *console.Config) {
		c.MaxSessions, c.MaxSessionsPerCredential, c.SessionTTL, c.Now = 3, 2, time.Hour, clock
		c.SignInBurst = 100
	})
	other, _ := f.env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
	victim := f.browser(t)
	victim.signIn(t, f.env.OperatorToken)
	var bs []*browser
	for range 10 {
		b := f.browser(t)
		b.signIn(t, other)
		bs = append(bs, b)
	}
	if p := victim.get(t, "/jobs"); p.code != http.StatusOK || strings.HasSuffix(p.url, "/signin") {
		t.Errorf("10 sign-ins with another credential ended the first credential's session: %d %s", p.code, p.url)
	}
	if p := bs[0].get(t, "/jobs"); !strings.HasSuffix(p.url, "/signin") {
		t.Errorf("the first of 10 sessions of a credential with MaxSessionsPerCredential 2 is still live: %s", p.url)
	}
	for _, b := range bs[8:] {
		if p := b.get(t, "/jobs"); p.code != http.StatusOK || strings.HasSuffix(p.url, "/signin") {
			t.Errorf("one of the credential's 2 newest sessions is not live: %d %s", p.code, p.url)
		}
	}
	// Every session is taken (1 + 2): a third credential is refused,
	// and no session ends.
	third, _ := f.env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
	late := f.browser(t)
	p := late.post(t, "/signin", url.Values{"token": {third}})
	if p.code != http.StatusServiceUnavailable || !strings.Contains(p.body, "Every session of the console is taken") {
		t.Errorf("sign-in with every session taken: %d\n%s", p.code, p.body)
	}
	if cs := late.jar.Cookies(mustURL(t, f.url+"/")); len(cs) != 0 {
		t.Errorf("the refused sign-in set cookies %v", cs)
	}
	for _, b := range []*browser{victim, bs[8], bs[9]} {
		if p := b.get(t, "/jobs"); p.code != http.StatusOK {
			t.Errorf("a refused sign-in ended a session: %d %s", p.code, p.url)
		}
	}
	now = now.Add(time.Hour)
	if p := victim.get(t, "/jobs"); !strings.HasSuffix(p.url, "/signin") {
		t.Errorf("a session outlived its TTL: %s", p.url)
	}
	// Expired sessions make room.
	late.signIn(t, third)
}

// ranJob is a job the fixture ran to success through a real node.
type ranJob struct {
	id, workerID, artifactReceipt string
}

// registerNode registers a node with an rtx-4090 and the given tags.
func registerNode(t *testing.T, f *fixture, name string, tags ...string) *apitest.Node {
	t.Helper()
	n := f.env.NewNode(t, name)
	n.Register(t, wire.RegisterRequest{
		Name: name, Hostname: name + ".local", Role: "local_gpu_compute", Tags: tags,
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "lora_train"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
		Version:        "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	})
	return n
}

// runJob leases the queued job id on n and runs it to success: a status
// event, two log lines, an artifact, completion.
func runJob(t *testing.T, n *apitest.Node, id string) ranJob {
	t.Helper()
	poll := wire.LeaseRequest{SupportedJobTypes: []string{"status_check", "lora_train"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", poll, http.StatusOK)
	if l.Job == nil || l.Job.ID != id {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	tok := *l.LeaseToken
	p := "/workers/jobs/" + id
	apitest.Post[wire.AcceptResponse](t, n, p+"/accept", wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
	apitest.Post[wire.StatusResponse](t, n, p+"/status", wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "half way", Payload: json.RawMessage(`{"step":1}`)}, http.StatusOK)
	apitest.Post[wire.LogsResponse](t, n, p+"/logs", map[string]any{"lease_token": tok, "entries": []wire.LogEntry{{Seq: 1, Message: "epoch 1 <b>loss</b>"}, {Seq: 2, Message: "epoch 2"}}}, http.StatusOK)
	sum := strings.Repeat("ab", 32)
	size := int64(4)
	art := apitest.Post[wire.ArtifactResponse](t, n, p+"/artifacts", wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", URI: "file:///models/adapter.safetensors",
		ChecksumSHA256: &sum, SizeBytes: &size,
	}, http.StatusCreated)
	n.Env().Clock.Advance(5 * time.Millisecond) // a run time above 0 ms
	done := apitest.Post[wire.CompleteResponse](t, n, p+"/complete", wire.CompleteRequest{LeaseToken: tok, Metrics: json.RawMessage(`{"loss":0.12}`), WaitForProofs: true}, http.StatusOK)
	if done.Job.State != "succeeded" || done.Checkpoint == "" {
		t.Fatalf("complete = %+v", done)
	}
	return ranJob{id: id, workerID: n.WorkerID, artifactReceipt: art.ReceiptID}
}

// dispatch dispatches a job through the console and returns its id.
func dispatch(t *testing.T, b *browser, form url.Values) string {
	t.Helper()
	p := b.post(t, "/jobs", form)
	m := regexp.MustCompile(`/console/jobs/([A-Za-z0-9_-]+)$`).FindStringSubmatch(p.url)
	if p.code != http.StatusOK || m == nil {
		t.Fatalf("dispatch: %d at %s:\n%s", p.code, p.url, p.body)
	}
	mustContain(t, "dispatch", p, "Dispatched "+form.Get("job_type")+" as job "+m[1])
	return m[1]
}

// TestPages renders every page with real data: a job dispatched through
// the console, run by a real node and completed, its events, logs,
// artifact, cost and receipts verified.
func TestPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1", "lab-a")
	id := dispatch(t, b, url.Values{"job_type": {"status_check"}, "payload": {`{"probe":"nvidia-smi"}`}, "gpu_sku": {"rtx-4090"}, "gpu_count": {"1"}, "tags": {"lab-a"}})
	// A second job that stays queued: its leasability reason shows.
	queued := dispatch(t, b, url.Values{"job_type": {"lora_train"}, "gpu_sku": {"rtx-4090"}})
	job := runJob(t, n, id)

	pages := []struct {
		path  string
		wants []string
	}{
		{"/", []string{"<h1>Overview</h1>", "status_check", "lora_train", `id="liveness">1 workers: online 1`, `id="rate">`, "Runtime <strong>inactive</strong>"}},
		{"/workers", []string{job.workerID, "gpu-1", "rtx-4090 (24576 MB)", "lab-a", "online"}},
		{"/workers/" + job.workerID, []string{"gpu-1.local", "rtx-4090 (24576 MB)", "lab-a", "status_check lora_train", "No live lease.", `action="/console/workers/` + job.workerID + `/ban"`}},
		{"/jobs", []string{id, queued, "succeeded", "queued", job.workerID, "Dispatch a job"}},
		{"/jobs?state=succeeded", []string{id}},
		{"/jobs?job_type=lora_train", []string{queued}},
		{"/jobs/" + id, []string{
			`<span id="job-state" class="badge state-succeeded">succeeded</span>`,
			"progress", "half way", "epoch 1 &lt;b&gt;loss&lt;/b&gt;", "epoch 2", // the timeline and logs, escaped
			"adapter.safetensors", "file:///models/adapter.safetensors", job.artifactReceipt,
			`<td class="num" title="4 bytes">4 B</td><td><span class="note">metadata only</span></td>`, // no Download link
			"USD for", "GPU-hours", "on rtx-4090 at 1.800000 USD per GPU-hour",
			"job_completed", "job_charged", "artifact_reported",
			"✔ verified: included in the current signed checkpoint",
			`data-src="/console/jobs/` + id + `/events"`,
			"nvidia-smi",
		}},
		{"/jobs/" + queued, []string{"Not leasable now: ", `action="/console/jobs/` + queued + `/cancel"`, "Not charged yet."}},
		{"/envelope", []string{`id="active">inactive`, "lora_train", "Activate the runtime", "Deactivate"}},
		{"/receipts", []string{"✔ Signature verified", "job_charged", "worker_registered", id, "Verify an export"}},
		{"/receipts/" + job.artifactReceipt, []string{"artifact_reported", "✔ verified", "Inclusion proof", id}},
		{"/credentials", []string{apitest.OperatorID, apitest.ProvisionerID, "operator:jobs", "Mint a credential", "/revoke"}},
	}
	for _, tc := range pages {
		// In turn, at once: the worker shows online only so long after
		// its last heartbeat.
		t.Run(tc.path, func(t *testing.T) {
			p := b.get(t, tc.path)
			if p.code != http.StatusOK {
				t.Fatalf("%d:\n%s", p.code, p.body)
			}
			if p.header.Get("Cache-Control") != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", p.header.Get("Cache-Control"))
			}
			mustContain(t, tc.path, p, tc.wants...)
			if strings.Contains(p.body, f.env.OperatorToken) {
				t.Errorf("the page shows the operator token")
			}
		})
	}
	for _, r := range []string{"job_completed", "job_charged", "artifact_reported"} {
		re := regexp.MustCompile(`<td>` + r + `</td><td class="verified">✔ verified`)
		if !re.MatchString(b.get(t, "/jobs/"+id).body) {
			t.Errorf("the %s receipt is not marked verified", r)
		}
	}

	// The log follower's feed: JSON, after an event id.
	p := b.get(t, "/jobs/"+id+"/events")
	var ev struct {
		State  string              `json:"state"`
		Ended  bool                `json:"ended"`
		Events []wire.JobEventView `json:"events"`
	}
	if err := json.Unmarshal([]byte(p.body), &ev); err != nil || ev.State != "succeeded" || !ev.Ended || len(ev.Events) < 3 {
		t.Fatalf("events: %v %+v\n%s", err, ev, p.body)
	}
	last := ev.Events[len(ev.Events)-1].ID
	p = b.get(t, fmt.Sprintf("/jobs/%s/events?after=%d", id, last))
	if err := json.Unmarshal([]byte(p.body), &ev); err != nil || len(ev.Events) != 0 {
		t.Fatalf("events after the last: %v %+v", err, ev)
	}
	if p := b.get(t, "/jobs/"+id+"/events?after=x"); p.code != http.StatusBadRequest {
		t.Errorf("events?after=x: %d", p.code)
	}
	// A cursor that is not one, on the pages that pass it on, is refused
	// as the API would.
	for _, path := range []string{"/jobs/" + id + "?events_after=x", "/receipts?after=x", "/receipts?after=-2"} {
		if p := b.get(t, path); p.code != http.StatusBadRequest || !strings.Contains(p.body, `class="flash error"`) {
			t.Errorf("%s: %d, want 400 with an error", path, p.code)
		}
	}

	// Static assets and unknown pages carry the headers too.
	for _, tc := range []struct {
		path string
		code int
		ct   string
	}{
		{"/static/console.js", 200, "text/javascript"},
		{"/static/console.css", 200, "text/css"},
		{"/nothing", 404, "text/html"},
		{"/jobs/nosuchjob", 404, "text/html"},
		{"/workers/nosuchworker", 404, "text/html"},
	} {
		p := b.get(t, tc.path)
		if p.code != tc.code || !strings.HasPrefix(p.header.Get("Content-Type"), tc.ct) {
			t.Errorf("%s: %d %s, want %d %s", tc.path, p.code, p.header.Get("Content-Type"), tc.code, tc.ct)
		}
	}
}

// state reads the API's view of things an action changes.
func apiGet[T any](t *testing.T, f *fixture, path string) T {
	t.Helper()
	code, body := f.env.Operator(t, http.MethodGet, path, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) {})
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	wp := "/workers/" + n.WorkerID

	t.Run("ban", func(t *testing.T) {
		p := b.post(t, wp+"/ban", url.Values{"reason": {"flaky fans"}})
		mustContain(t, "ban", p, "Worker "+n.WorkerID+": ban done. Receipt ", `<span class="badge banned">banned</span> at`, "flaky fans")
		if w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID); !w.Worker.Banned {
			t.Fatal("the worker is not banned")
		}
		// The flash shows once.
		if p := b.get(t, wp); strings.Contains(p.body, "ban done") {
			t.Error("the flash showed twice")
		}
	})
	t.Run("unban", func(t *testing.T) {
		p := b.post(t, wp+"/unban", url.Values{"reason": {"fixed"}})
		mustContain(t, "unban", p, "unban done. Receipt ", "not banned")
		if w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID); w.Worker.Banned {
			t.Fatal("the worker is still banned")
		}
	})
	t.Run("approve", func(t *testing.T) {
		p := b.post(t, wp+"/approve", url.Values{"job_types": {"status_check"}, "tags": {"lab-a, lab-b"}, "reason": {"checked"}})
		mustContain(t, "approve", p, "approve done", "types status_check", "tags lab-a lab-b")
		w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID)
		if diff := cmp.Diff([]string{"lab-a", "lab-b"}, w.Worker.ApprovedTags); diff != "" || w.Worker.ApprovedBy == nil {
			t.Fatalf("approval: %s %+v", diff, w.Worker)
		}
	})
	t.Run("drain and resume", func(t *testing.T) {
		p := b.post(t, wp+"/drain", nil)
		mustContain(t, "drain", p, "drain done.", "requested by", "granted no job until resumed", `/resume"`)
		if w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID); !w.Worker.Drain {
			t.Fatal("the worker is not draining")
		}
		p = b.post(t, wp+"/resume", nil)
		mustContain(t, "resume", p, "resume done.", "not requested", `/drain"`)
		if w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID); w.Worker.Drain {
			t.Fatal("the worker still drains")
		}
	})
	t.Run("bad worker action", func(t *testing.T) {
		p := b.post(t, wp+"/explode", nil)
		mustContain(t, "explode", p, "there is no worker action")
	})
	t.Run("dispatch refused", func(t *testing.T) {
		before := settled(t, f)
		p := b.post(t, "/jobs", url.Values{"job_type": {"status_check"}, "payload": {"{not json"}})
		mustContain(t, "bad payload", p, "the payload is not JSON")
		p = b.post(t, "/jobs", url.Values{"job_type": {""}})
		mustContain(t, "no type", p, "The control plane answered 400 invalid_request")
		if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
			t.Fatalf("a refused dispatch changed the state:\n%s", diff)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		id := dispatch(t, b, url.Values{"job_type": {"lora_train"}})
		p := b.post(t, "/jobs/"+id+"/cancel", nil)
		mustContain(t, "cancel", p, "Job "+id+" is canceled.")
		if j := apiGet[wire.JobDetailResponse](t, f, "/operator/jobs/"+id); j.Job.State != "canceled" {
			t.Fatalf("job is %s", j.Job.State)
		}
	})
	t.Run("envelope", func(t *testing.T) {
		until := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Minute)
		p := b.post(t, "/envelope/activate", url.Values{"reason": {"training window"}, "until": {until.Format("2006-01-02T15:04")}})
		mustContain(t, "activate", p, "Envelope activated: runtime active=true", `id="active">active`)
		env := apiGet[wire.EnvelopeResponse](t, f, "/operator/envelope")
		if !env.Active || env.Until == nil || !env.Until.Equal(until) || env.Reason != "training window" {
			t.Fatalf("envelope = %+v", env)
		}
		p = b.post(t, "/envelope/deactivate", url.Values{"reason": {"done"}})
		mustContain(t, "deactivate", p, "Envelope deactivated: runtime active=false")
		if env := apiGet[wire.EnvelopeResponse](t, f, "/operator/envelope"); env.Active {
			t.Fatal("still active")
		}
		// The history, newest first, once sequenced.
		waitfor.Until(t, "the envelope's history to show the deactivation", func() bool {
			p = b.get(t, "/envelope")
			return strings.Contains(p.body, "envelope_deactivated")
		})
		mustContain(t, "history", p, "envelope_deactivated", "envelope_activated", "training window", apitest.OperatorID)
		if i, j := strings.Index(p.body, "envelope_deactivated"), strings.Index(p.body, "envelope_activated"); i > j {
			t.Error("the history is not newest first")
		}
		before := settled(t, f)
		p = b.post(t, "/envelope/activate", url.Values{"reason": {"x"}, "until": {"tomorrow"}})
		mustContain(t, "bad until", p, "is not a time")
		p = b.post(t, "/envelope/deactivate", url.Values{"reason": {""}})
		mustContain(t, "no reason", p, "400 invalid_request")
		if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
			t.Fatalf("a refused envelope change changed the state:\n%s", diff)
		}
	})
	t.Run("credentials", func(t *testing.T) {
		p := b.post(t, "/credentials", url.Values{"principal": {apitest.OperatorID}, "scope": {"operator:jobs"}, "ttl_hours": {"2"}})
		m := regexp.MustCompile(`Minted credential (\S+) for `).FindStringSubmatch(p.body)
		tok := regexp.MustCompile(`<code class="secret">(nlc_[A-Za-z0-9]+)</code>`).FindStringSubmatch(p.body)
		if m == nil || tok == nil {
			t.Fatalf("mint: %d\n%s", p.code, p.body)
		}
		// The token works, and is shown once.
		code, body := f.env.Bearer(t, tok[1], http.MethodGet, "/operator/jobs", nil)
		if code != http.StatusOK {
			t.Fatalf("the minted operator:jobs token on /operator/jobs: %d %s", code, body)
		}
		if p := b.get(t, "/credentials"); strings.Contains(p.body, tok[1]) {
			t.Fatal("the token was shown twice")
		}
		p = b.post(t, "/credentials/"+m[1]+"/revoke", url.Values{"reason": {"leaked"}})
		mustContain(t, "revoke", p, "Revoked credential "+m[1])
		if code, _ := f.env.Bearer(t, tok[1], http.MethodGet, "/operator/jobs", nil); code != http.StatusUnauthorized {
			t.Fatalf("a revoked token: %d", code)
		}
		p = b.post(t, "/credentials/"+m[1]+"/revoke", nil)
		mustContain(t, "revoke again", p, "was revoked already")
		// A scope the minting operator lacks is refused by the API.
		p = b.post(t, "/credentials", url.Values{"principal": {apitest.ProvisionerID}, "scope": {"node:register"}})
		mustContain(t, "scope not held", p, "Refused (403 insufficient_scope)")
	})
}

// TestCSRF checks that a cross-origin POST changes nothing, whatever the cookie.
func TestCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	before := settled(t, f)
	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"Sec-Fetch-Site cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"Sec-Fetch-Site same-site", map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"Origin elsewhere", map[string]string{"Origin": "https://evil.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/workers/" + n.WorkerID + "/ban", "/envelope/activate", "/credentials", "/signout", "/signin"} {
				req, _ := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader("reason=csrf&principal=apitest-operator&scope=operator:jobs&token="+f.env.OperatorToken))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				for k, v := range tc.headers {
					req.Header.Set(k, v)
				}
				p := b.do(t, req)
				if p.code != http.StatusForbidden || !strings.Contains(p.body, "cross-origin") {
					t.Errorf("%s: %d\n%s", path, p.code, p.body)
				}
			}
		})
	}
	if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
		t.Fatalf("a cross-origin POST changed the state:\n%s", diff)
	}
	// The session survived (sign-out was refused too).
	if p := b.get(t, "/workers"); p.code != http.StatusOK || !strings.Contains(p.body, n.WorkerID) {
		t.Fatalf("after the refused sign-out: %d %s", p.code, p.url)
	}
}

// TestScopeRefusal checks that an operator whose token lacks a scope sees the API's
// refusal, and nothing changes.
func TestScopeRefusal(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	n := registerNode(t, f, "gpu-1")
	tok, _, err := f.env.Server.Issuer().Mint(context.Background(), apitest.OperatorID, []credential.Scope{credential.ScopeOperatorJobs}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b := f.browser(t)
	p := b.signIn(t, tok) // a token without every scope signs in
	mustContain(t, "overview", p, "Refused (403 insufficient_scope)", `href="/console/jobs"`)
	// The nav links only the pages the token allows.
	for _, page := range []string{"workers", "envelope", "receipts", "credentials"} {
		if strings.Contains(p.body, `href="/console/`+page+`"`) {
			t.Errorf("the nav of a token with only operator:jobs links %s", page)
		}
	}
	before := settled(t, f)
	// Each page checks its scope itself, before it reads a form or asks
	// the API anything.
	for _, tc := range []struct {
		path, scope string
		form        url.Values
	}{
		{"/workers/" + n.WorkerID + "/ban", "operator:workers", url.Values{"reason": {"x"}}},
		{"/workers/" + n.WorkerID + "/approve", "operator:workers", nil},
		{"/envelope/activate", "operator:envelope", url.Values{"reason": {"x"}}},
		{"/credentials", "operator:credentials", url.Values{"principal": {apitest.OperatorID}, "scope": {"operator:jobs"}}},
	} {
		p := b.post(t, tc.path, tc.form)
		if p.code != http.StatusForbidden {
			t.Errorf("POST %s: %d, want 403", tc.path, p.code)
		}
		mustContain(t, tc.path, p, "Refused (403): this page needs "+tc.scope, "Your token does not allow this.")
	}
	for _, tc := range []struct{ path, scope string }{
		{"/workers", "operator:workers"}, {"/workers/" + n.WorkerID, "operator:workers"}, {"/envelope", "operator:envelope"},
		{"/credentials", "operator:credentials"}, {"/receipts", "operator:receipts"}, {"/receipts/x", "operator:receipts"},
	} {
		p := b.get(t, tc.path)
		if p.code != http.StatusForbidden {
			t.Errorf("GET %s: %d, want 403", tc.path, p.code)
		}
		mustContain(t, tc.path, p, "Refused (403): this page needs "+tc.scope)
	}
	if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
		t.Fatalf("refused actions changed the state:\n%s", diff)
	}
	// What the token allows works.
	dispatch(t, b, url.Values{"job_type": {"status_check"}})
}

func TestVerifyExport(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	runJob(t, n, dispatch(t, b, url.Values{"job_type": {"status_check"}}))
	if _, err := f.env.Server.Sequence(context.Background()); err != nil {
		t.Fatal(err)
	}
	var export bytes.Buffer
	cp, err := receipts.NewLog(f.env.DB.ReceiptStore(), &receipts.Config{Origin: f.env.Config.Origin}).Export(context.Background(), &export)
	if err != nil {
		t.Fatal(err)
	}
	send := func(t *testing.T, exp, note []byte) page {
		t.Helper()
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		// The checkpoint first, as the page's form sends it.
		for _, part := range []struct {
			name    string
			content []byte
		}{{"checkpoint", note}, {"export", exp}} {
			w, _ := mw.CreateFormFile(part.name, part.name)
			w.Write(part.content)
		}
		mw.Close()
		req, _ := http.NewRequest(http.MethodPost, f.url+"/receipts/verify", &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.Header.Set("Origin", f.srv.URL)
		return b.do(t, req)
	}
	p := send(t, export.Bytes(), cp.Note)
	mustContain(t, "good export", p, fmt.Sprintf("✔ Verified: %d receipts (%d with inclusion proofs)", cp.Size, cp.Size))

	lines := bytes.Split(bytes.TrimSpace(export.Bytes()), []byte("\n"))
	var l receipts.ExportLine
	if err := json.Unmarshal(lines[1], &l); err != nil {
		t.Fatal(err)
	}
	l.Body = bytes.Replace(l.Body, []byte(`"policy_version":`), []byte(`"policy_version": `), 1)
	tampered, _ := json.Marshal(l)
	bad := bytes.Join(append(append([][]byte{lines[0], tampered}, lines[2:]...), nil), []byte("\n"))
	for _, tc := range []struct {
		name       string
		exp, note  []byte
		wantPrefix string
	}{
		{"tampered receipt", bad, cp.Note, "✘ line 2"},
		{"missing receipt", bytes.Join(lines[:len(lines)-1], []byte("\n")), cp.Note, "✘ The export has"},
		{"forged checkpoint", export.Bytes(), bytes.Replace(cp.Note, []byte("\n"), []byte("\n\n"), 1), "✘ The checkpoint does not verify"},
		{"not JSON", []byte("hello\n"), cp.Note, "✘ line 1: not an export line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := send(t, tc.exp, tc.note)
			mustContain(t, tc.name, p, tc.wantPrefix)
			if strings.Contains(p.body, "✔ Verified") {
				t.Fatal("verified")
			}
		})
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestLimits checks that a form over 64 KiB and an export over
// Config.MaxExportBytes are refused with a message, and change nothing.
func TestLimits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) { c.MaxExportBytes = 1 << 20 })
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	before := settled(t, f)
	p := b.post(t, "/envelope/activate", url.Values{"reason": {strings.Repeat("r", 65<<10)}})
	mustContain(t, "large form", p, "the form could not be read")
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	w, _ := mw.CreateFormFile("checkpoint", "checkpoint")
	_, note := f.env.Operator(t, http.MethodGet, "/operator/receipts/checkpoint", nil)
	w.Write(note)
	w, _ = mw.CreateFormFile("export", "export")
	w.Write(bytes.Repeat([]byte("    \n"), 1<<20/5+1)) // blank lines: only the size refuses them
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, f.url+"/receipts/verify", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	p = b.do(t, req)
	mustContain(t, "large export", p, "✘ The export could not be read: the form is larger than 1048576 bytes")
	if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
		t.Fatalf("refused requests changed the state:\n%s", diff)
	}
	if p := b.get(t, "/envelope"); !strings.Contains(p.body, `id="active">inactive`) {
		t.Error("the envelope changed")
	}
}

// settled sequences every receipt minted so far (the background sequencer
// would, between two dumps) and returns the state, for a test to check
// that what follows changes nothing.
func settled(t *testing.T, f *fixture) map[string][]string {
	t.Helper()
	if _, err := f.env.Server.Sequence(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f.env.Dump(t)
}
