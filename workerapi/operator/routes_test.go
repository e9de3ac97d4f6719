package operator_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// operatorRoutes returns the operator routes of workerapi's OpenAPI
// document (which TestOpenAPIRoutes keeps equal to the routes the
// Server serves), as "METHOD /path/{param}".
func operatorRoutes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	var out []string
	for p, ops := range doc.Paths {
		if !strings.HasPrefix(p, "/operator/") {
			continue
		}
		for m := range ops {
			switch m {
			case "get", "head", "post", "put", "patch", "delete":
				out = append(out, strings.ToUpper(m)+" "+p)
			}
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		t.Fatal("openapi.json has no operator route: the test would check nothing")
	}
	return out
}

// routeOf returns the route of routes that a request ("METHOD
// /escaped/path") reached: the one whose literal segments all match, with
// the fewest {parameters} (/operator/receipts/checkpoint before
// /operator/receipts/{id}), or "" when none does.
func routeOf(routes []string, req string) string {
	method, path, _ := strings.Cut(req, " ")
	segs := strings.Split(path, "/")
	best, bestParams := "", -1
	for _, r := range routes {
		m, p, _ := strings.Cut(r, " ")
		tsegs := strings.Split(p, "/")
		if m != method || len(tsegs) != len(segs) {
			continue
		}
		params, ok := 0, true
		for i, ts := range tsegs {
			if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "}") {
				params++
				ok = ok && segs[i] != ""
			} else {
				ok = ok && ts == segs[i]
			}
		}
		if ok && (bestParams < 0 || params < bestParams) {
			best, bestParams = r, params
		}
	}
	return best
}

// TestRouteOf checks the test's own matcher: a literal segment beats a
// parameter, and a method or a segment that differs matches nothing.
func TestRouteOf(t *testing.T) {
	t.Parallel()
	routes := []string{"GET /operator/receipts/{id}", "GET /operator/receipts/checkpoint", "POST /operator/jobs/{id}/cancel"}
	for req, want := range map[string]string{
		"GET /operator/receipts/checkpoint":  "GET /operator/receipts/checkpoint",
		"GET /operator/receipts/rcp_1":       "GET /operator/receipts/{id}",
		"POST /operator/jobs/a%2Fb/cancel":   "POST /operator/jobs/{id}/cancel",
		"GET /operator/jobs/j1/cancel":       "",
		"POST /operator/jobs/j1/cancel/more": "",
		"POST /operator/jobs//cancel":        "",
	} {
		if got := routeOf(routes, req); got != want {
			t.Errorf("routeOf(%q) = %q, want %q", req, got, want)
		}
	}
}

// TestEveryRouteHasAMethod checks that every operator route of the
// OpenAPI document has a Client method, and that each method reaches its
// route (and no other) and gets a 2xx answer from a real control plane:
// a route added to the Server without a method here fails it.
func TestEveryRouteHasAMethod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	n := f.node(t, "gpu-routes")
	var (
		jobID, credID, receiptID string
		size                     int64
	)
	artifactID := f.stored(t, n, []byte("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
	// In order: each call may use what one before it made.
	calls := []struct {
		route string
		call  func(c *operator.Client) error
	}{
		{"POST /operator/jobs", func(c *operator.Client) error {
			d, err := c.Dispatch(ctx, wire.DispatchRequest{JobType: "status_check"})
			if err == nil {
				jobID = d.Job.ID
			}
			return err
		}},
		{"POST /operator/jobs/batch", func(c *operator.Client) error {
			_, err := c.DispatchBatch(ctx, wire.DispatchBatchRequest{Jobs: []wire.DispatchRequest{{JobType: "status_check"}}})
			return err
		}},
		{"GET /operator/jobs", func(c *operator.Client) error { _, err := c.ListJobs(ctx, operator.JobQuery{}); return err }},
		{"GET /operator/jobs/{id}", func(c *operator.Client) error { _, err := c.Job(ctx, jobID, 0); return err }},
		{"GET /operator/artifacts", func(c *operator.Client) error {
			_, err := c.ListArtifacts(ctx, operator.ArtifactQuery{JobID: jobID})
			return err
		}},
		{"GET /operator/artifacts/{id}/content", func(c *operator.Client) error {
			_, err := c.DownloadArtifact(ctx, artifactID, io.Discard)
			return err
		}},
		{"HEAD /operator/artifacts/{id}/content", func(c *operator.Client) error {
			_, err := c.StatArtifactContent(ctx, artifactID)
			return err
		}},
		{"POST /operator/jobs/{id}/cancel", func(c *operator.Client) error { _, err := c.CancelJob(ctx, jobID); return err }},
		{"POST /operator/jobs/{id}/retry", func(c *operator.Client) error { _, err := c.RetryJob(ctx, jobID, "test"); return err }},
		{"GET /operator/workers", func(c *operator.Client) error { _, err := c.ListWorkers(ctx, operator.WorkerQuery{}); return err }},
		{"GET /operator/workers/{id}", func(c *operator.Client) error { _, err := c.Worker(ctx, n.WorkerID); return err }},
		{"POST /operator/workers/{id}/ban", func(c *operator.Client) error { _, err := c.BanWorker(ctx, n.WorkerID, "test"); return err }},
		{"POST /operator/workers/{id}/unban", func(c *operator.Client) error {
			_, err := c.UnbanWorker(ctx, n.WorkerID, "test")
			return err
		}},
		{"POST /operator/workers/{id}/approve", func(c *operator.Client) error {
			_, err := c.ApproveWorker(ctx, n.WorkerID, wire.ApproveRequest{Reason: "test"})
			return err
		}},
		{"POST /operator/workers/{id}/drain", func(c *operator.Client) error { _, err := c.DrainWorker(ctx, n.WorkerID); return err }},
		{"POST /operator/workers/{id}/resume", func(c *operator.Client) error { _, err := c.ResumeWorker(ctx, n.WorkerID); return err }},
		{"POST /operator/workers/{id}/retire", func(c *operator.Client) error {
			_, err := c.RetireWorker(ctx, n.WorkerID, "test")
			return err
		}},
		{"POST /operator/principals", func(c *operator.Client) error {
			_, err := c.CreatePrincipal(ctx, wire.CreatePrincipalRequest{ID: "ci-bot", Name: "CI"})
			return err
		}},
		{"POST /operator/credentials", func(c *operator.Client) error {
			m, err := c.MintCredential(ctx, wire.MintCredentialRequest{Principal: "ci-bot", Scopes: []string{"operator:jobs"}})
			if err == nil {
				credID, receiptID = m.CredentialID, m.ReceiptID
			}
			return err
		}},
		{"GET /operator/credentials", func(c *operator.Client) error {
			_, err := c.ListCredentials(ctx, operator.CredentialQuery{})
			return err
		}},
		{"POST /operator/credentials/{id}/revoke", func(c *operator.Client) error {
			_, err := c.RevokeCredential(ctx, credID, "test")
			return err
		}},
		{"GET /operator/envelope", func(c *operator.Client) error { _, err := c.Envelope(ctx); return err }},
		{"POST /operator/envelope/activate", func(c *operator.Client) error {
			_, err := c.ActivateEnvelope(ctx, wire.ActivateRequest{Reason: "test"})
			return err
		}},
		{"POST /operator/envelope/deactivate", func(c *operator.Client) error {
			_, err := c.DeactivateEnvelope(ctx, "test")
			return err
		}},
		{"GET /operator/costs", func(c *operator.Client) error {
			_, err := c.Costs(ctx, operator.CostQuery{From: time.Now().Add(-time.Hour)})
			return err
		}},
		{"GET /operator/receipts/{id}", func(c *operator.Client) error { _, err := c.Receipt(ctx, receiptID); return err }},
		{"GET /operator/receipts", func(c *operator.Client) error {
			_, err := c.ListReceipts(ctx, operator.ReceiptQuery{Kind: receipts.KindCredentialMinted})
			return err
		}},
		{"GET /operator/receipts/checkpoint", func(c *operator.Client) error {
			cp, err := c.VerifiedCheckpoint(ctx, f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin)
			if err == nil {
				size = cp.Size
			}
			return err
		}},
		{"GET /operator/receipts/consistency", func(c *operator.Client) error {
			_, err := c.Consistency(ctx, 1, size)
			return err
		}},
	}
	routes := operatorRoutes(t)
	covered := map[string]bool{}
	f.rec.requests()
	for _, c := range calls {
		if !slices.Contains(routes, c.route) {
			t.Errorf("%s is not an operator route of openapi.json", c.route)
		}
		if err := c.call(f.api); err != nil {
			t.Errorf("the method of %s: %v", c.route, err)
		}
		reqs := f.rec.requests()
		if len(reqs) != 1 {
			t.Errorf("the method of %s sent %d requests (%v), want 1", c.route, len(reqs), reqs)
			continue
		}
		if got := routeOf(routes, reqs[0]); got != c.route {
			t.Errorf("the method of %s sent %s, which reaches %q", c.route, reqs[0], got)
		}
		covered[c.route] = true
	}
	for _, r := range routes {
		if !covered[r] {
			t.Errorf("operator route %s has no Client method (add one, and a row here)", r)
		}
	}
}
