package workerapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The batch complete (PROTOCOL.md §5.15), over real HTTP on every dialect.

// batchSetup is setup with a node that may hold 16 live leases.
func batchSetup(t *testing.T, dialect string, opts ...apitest.Option) *fx {
	t.Helper()
	opts = append([]apitest.Option{apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{sku: rate}}
		c.ProofWait = 10 * time.Second
	})}, opts...)
	env := apitest.New(t, dialect, opts...)
	node := env.NewNode(t, "batch-gpu-1")
	reg := registerRequest()
	reg.GovernorLimits.MaxJobs = 16
	node.Register(t, reg)
	return &fx{env: env, node: node}
}

// grant is a job the node leased, with its token.
type grant struct{ id, token string }

// runningJobs leases n status_check jobs with accept.
func (f *fx) runningJobs(t *testing.T, n int) []grant {
	t.Helper()
	_, out := f.leaseAccept(t, "status_check", n)
	var gs []grant
	for _, g := range out.Leases {
		if g.Job.State != wire.JobStateRunning {
			t.Fatalf("grant %s is %s", g.Job.ID, g.Job.State)
		}
		gs = append(gs, grant{g.Job.ID, g.LeaseToken})
	}
	return gs
}

// completeBatch posts a batch and decodes a 200 answer, checking it
// against the served OpenAPI document.
func (f *fx) completeBatch(t *testing.T, body any) wire.CompleteBatchResponse {
	t.Helper()
	st, b := post(t, f.node, wire.PathCompleteBatch, body)
	if st != http.StatusOK {
		t.Fatalf("batch complete: %d %s", st, b)
	}
	checkSchema(t, f.env, "CompleteBatchResponse", b)
	return decode[wire.CompleteBatchResponse](t, b)
}

// checkSchema checks an answer against a schema of the OpenAPI document
// the server serves, with every response object closed
// (additionalProperties false), as openapi_test.go's checker does.
func checkSchema(t *testing.T, env *apitest.Env, schema string, body []byte) {
	t.Helper()
	resp, doc := env.Bearer(t, "", http.MethodGet, wire.PathOpenAPI, nil)
	if resp != http.StatusOK {
		t.Fatalf("openapi.json: %d", resp)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	schemas := v.(map[string]any)["components"].(map[string]any)["schemas"].(map[string]any)
	for _, name := range []string{"CompleteBatchResponse", "CompletionResult", "CompletedJob", "ErrorDetail", "Receipt", "Proof",
		"LeaseResponse", "Grant", "Job", "Requirements", "JobError"} {
		schemas[name].(map[string]any)["additionalProperties"] = false
	}
	const base = "https://nodelane.test/served-openapi.json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(base, v); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(base + "#/components/schemas/" + schema)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("answer is not JSON: %v: %s", err, body)
	}
	if err := s.Validate(inst); err != nil {
		t.Errorf("the answer is not a %s of the OpenAPI document: %v\n%s", schema, err, body)
	}
}

// wantCompleted checks an OK result: its receipts, job_completed then
// job_charged, verify against its checkpoint, and the job is stored
// succeeded with that receipt.
func wantCompleted(t *testing.T, f *fx, r wire.CompletionResult, id string, ms int64) {
	t.Helper()
	if r.JobID != id || !r.OK || r.Status != http.StatusOK || r.Error != nil || r.Completed == nil {
		t.Fatalf("result %+v, want job %s completed", r, id)
	}
	c := r.Completed
	if c.ActualMS != ms || c.ActualHours != receipts.Hours(ms) || len(c.Receipts) != 2 || len(c.Proofs) != 2 || c.Checkpoint == "" {
		t.Fatalf("job %s: completed %+v", id, c)
	}
	if c.Receipts[0].ID != c.ReceiptID || c.Receipts[0].Kind != receipts.KindJobCompleted ||
		c.Receipts[1].ID != c.ReceiptID+".charge" || c.Receipts[1].Kind != receipts.KindJobCharged {
		t.Errorf("job %s: receipts %+v", id, c.Receipts)
	}
	for i, wr := range c.Receipts {
		rc, err := receipts.Verify(f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin, wr.Body, c.Proofs[i], []byte(c.Checkpoint))
		if err != nil {
			t.Fatalf("job %s: receipt %s does not verify: %v", id, wr.ID, err)
		}
		if rc.JobID != id || rc.WorkerID != f.node.WorkerID {
			t.Errorf("job %s: receipt %+v", id, rc)
		}
	}
	if j := f.env.Job(t, id); j.State != lease.StateSucceeded || j.ReceiptID != c.ReceiptID {
		t.Errorf("job %s as stored: %s, receipt %q", id, j.State, j.ReceiptID)
	}
}

// wantNoProofs checks an OK result of a completion that did not wait for
// its proofs: its two receipts, without index, proof or checkpoint.
func wantNoProofs(t *testing.T, r wire.CompletionResult, id string) {
	t.Helper()
	if r.JobID != id || !r.OK || r.Completed == nil {
		t.Fatalf("result %+v, want job %s completed", r, id)
	}
	c := r.Completed
	if len(c.Receipts) != 2 || c.Receipts[0].ID != c.ReceiptID || c.Receipts[1].ID != c.ReceiptID+".charge" ||
		c.Proofs == nil || len(c.Proofs) != 0 || c.Checkpoint != "" {
		t.Fatalf("job %s: completed %+v, want its receipts and no proofs", id, c)
	}
	for _, wr := range c.Receipts {
		if wr.Index != nil {
			t.Errorf("job %s: receipt %s has index %d before it was sequenced", id, wr.ID, *wr.Index)
		}
	}
}

// waitSequenced waits until the latest signed checkpoint covers the
// receipts ids: the background sequencer's work, since GetReceipt and
// LatestCheckpoint sequence nothing.
func waitSequenced(t *testing.T, env *apitest.Env, ids ...string) {
	t.Helper()
	st := env.DB.ReceiptStore()
	waitfor.Until(t, "the sequencer to sign a checkpoint of the receipts", func() bool {
		cp, err := st.LatestCheckpoint(context.Background())
		if err != nil {
			return false
		}
		for _, id := range ids {
			r, err := st.GetReceipt(context.Background(), id)
			if err != nil || !r.Sequenced || r.Index >= cp.Size {
				return false
			}
		}
		return true
	})
}

// bodies returns the receipts' bodies.
func bodies(rs []receipts.WireReceipt) [][]byte {
	var out [][]byte
	for _, r := range rs {
		out = append(out, r.Body)
	}
	return out
}

// wantRefused checks a refused result.
func wantRefused(t *testing.T, r wire.CompletionResult, id string, status int, code string) {
	t.Helper()
	if r.JobID != id || r.OK || r.Status != status || r.Completed != nil || r.Error == nil ||
		r.Error.Code != code || r.Error.Message == "" || r.Error.ServerTime.IsZero() {
		t.Errorf("result %+v, want job %s refused %d %s", r, id, status, code)
	}
}

func flipLast(tok string) string { return tok[:len(tok)-1] + flip(tok[len(tok)-1]) }

func TestCompleteBatch(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			f := batchSetup(t, d.Name, apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = rec }), apitest.Started())
			now := time.Now().UTC().Truncate(time.Millisecond)
			f.env.Clock.Set(now)
			defer f.env.Clock.Follow()

			t.Run("together", func(t *testing.T) {
				gs := f.runningJobs(t, 3)
				f.env.Clock.Advance(1234 * time.Millisecond)
				n := f.env.Receipts(t)
				var cs []wire.Completion
				for i, g := range gs {
					cs = append(cs, wire.Completion{JobID: g.id, CompleteRequest: wire.CompleteRequest{
						LeaseToken: g.token, Metrics: []byte(fmt.Sprintf(`{"i":%d}`, i)), FinalMessage: ptr("done"),
						WaitForProofs: true,
					}})
				}
				out := f.completeBatch(t, wire.CompleteBatchRequest{Completions: cs})
				if len(out.Results) != 3 {
					t.Fatalf("%d results", len(out.Results))
				}
				for i, g := range gs {
					wantCompleted(t, f, out.Results[i], g.id, 1234)
					if j := f.env.Job(t, g.id); string(j.Result.Metrics) != fmt.Sprintf(`{"i":%d}`, i) || j.Result.FinalMessage != "done" {
						t.Errorf("job %s result %+v", g.id, j.Result)
					}
				}
				if got := f.env.Receipts(t) - n; got != 6 {
					t.Errorf("%d receipts minted, want 2 a job", got)
				}
				if cp := out.Results[0].Completed.Checkpoint; out.Results[1].Completed.Checkpoint != cp || out.Results[2].Completed.Checkpoint != cp {
					t.Errorf("the results' proofs are not against one checkpoint")
				}
				// Each job's hooks, as a complete of it reports them.
				var done []string
				waitfor.Until(t, "the hooks to see the three jobs succeed", func() bool {
					done = nil
					rec.mu.Lock()
					for _, c := range rec.changes {
						if c.From == lease.StateRunning && c.Job.State == lease.StateSucceeded && c.Job.ReceiptID != "" {
							done = append(done, c.Job.ID)
						}
					}
					rec.mu.Unlock()
					return len(done) >= 3
				})
				for _, g := range gs {
					if !slices.Contains(done, g.id) {
						t.Errorf("no running>succeeded hook for job %s (hooks for %v)", g.id, done)
					}
				}
			})

			t.Run("mixed", func(t *testing.T) {
				gs := f.runningJobs(t, 6)
				good1, badSum, wrongTok, good2, canceled := gs[0], gs[1], gs[2], gs[3], gs[4]
				leased, leasedTok := f.leased(t, "telemetry_sync")
				if _, err := f.env.Server.Leases().Cancel(context.Background(), canceled.id); err != nil {
					t.Fatal(err)
				}
				f.env.Clock.Advance(2 * time.Second)
				before := map[string]state{}
				for _, id := range []string{badSum.id, wrongTok.id, leased} {
					before[id] = f.state(t, id)
				}
				n := f.env.Receipts(t)
				c := func(id, tok string) wire.Completion {
					return wire.Completion{JobID: id, CompleteRequest: wire.CompleteRequest{LeaseToken: tok, WaitForProofs: true}}
				}
				body := wire.CompleteBatchRequest{Completions: []wire.Completion{
					c(good1.id, good1.token),
					c(badSum.id, flipLast(badSum.token)), // the checksum fails
					c("job-nope", good1.token),           // no such job
					c(good2.id, good2.token),
					c(wrongTok.id, good2.token), // another job's token
					c(leased, leasedTok),        // not accepted
					c(canceled.id, canceled.token),
				}}
				req := f.node.Request(t, http.MethodPost, wire.PathCompleteBatch, body)
				resp, b := f.env.Raw(t, req)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("batch: %d %s", resp.StatusCode, b)
				}
				checkSchema(t, f.env, "CompleteBatchResponse", b)
				out := decode[wire.CompleteBatchResponse](t, b)
				if len(out.Results) != 7 {
					t.Fatalf("%d results: %s", len(out.Results), b)
				}
				check := func(out wire.CompleteBatchResponse) {
					t.Helper()
					wantCompleted(t, f, out.Results[0], good1.id, 2000)
					wantRefused(t, out.Results[1], badSum.id, http.StatusBadRequest, wire.CodeInvalidRequest)
					wantRefused(t, out.Results[2], "job-nope", http.StatusConflict, wire.CodeLeaseLost)
					wantCompleted(t, f, out.Results[3], good2.id, 2000)
					wantRefused(t, out.Results[4], wrongTok.id, http.StatusConflict, wire.CodeLeaseLost)
					wantRefused(t, out.Results[5], leased, http.StatusConflict, wire.CodeInvalidTransition)
					wantRefused(t, out.Results[6], canceled.id, http.StatusConflict, wire.CodeJobCanceled)
					// A job that does not exist is answered as one the caller
					// holds no lease on.
					if out.Results[2].Error.Message != out.Results[4].Error.Message {
						t.Errorf("an unknown job answers %q, another's %q", out.Results[2].Error.Message, out.Results[4].Error.Message)
					}
				}
				check(out)
				for id, st := range before {
					// Receipts counts every receipt: the other jobs' are
					// checked below.
					if after := f.state(t, id); after.State != st.State || after.Rev != st.Rev || after.Events != st.Events {
						t.Errorf("job %s changed: %+v -> %+v", id, st, after)
					}
				}
				// The canceled job ends canceled, as complete of it ends it.
				j := f.env.Job(t, canceled.id)
				if j.State != lease.StateCanceled || j.ReceiptID == "" {
					t.Fatalf("canceled job as stored: %s %q", j.State, j.ReceiptID)
				}
				if r := receiptOf(t, f.env, j.ReceiptID); r.Kind != receipts.KindJobFailed || r.Outcome != receipts.OutcomeCanceled || r.ErrorCode != "completed" {
					t.Errorf("the canceled job's receipt %+v", r)
				}
				if got := f.env.Receipts(t) - n; got != 5 {
					t.Errorf("%d receipts minted, want 2 for each completed job and 1 for the canceled one", got)
				}

				t.Run("again", func(t *testing.T) {
					// The batch sent again (its answer was lost): the same
					// answer, nothing minted, nothing changed.
					dump := f.env.Dump(t)
					again := f.completeBatch(t, body)
					check(again)
					for i := range out.Results {
						if a, b := out.Results[i].Completed, again.Results[i].Completed; a != nil &&
							(b == nil || a.ReceiptID != b.ReceiptID || a.ActualMS != b.ActualMS || a.ActualCostUSD != b.ActualCostUSD) {
							t.Errorf("result %d: %+v, first %+v", i, b, a)
						}
					}
					if diff := cmp.Diff(dump, f.env.Dump(t)); diff != "" {
						t.Errorf("a repeated batch changed state (-before +after):\n%s", diff)
					}
				})
				t.Run("replayed", func(t *testing.T) {
					dump := f.env.Dump(t)
					resp, b := f.env.Raw(t, req)
					wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
					if diff := cmp.Diff(dump, f.env.Dump(t)); diff != "" {
						t.Errorf("a replayed batch changed state (-before +after):\n%s", diff)
					}
				})
			})

			t.Run("without waiting", func(t *testing.T) {
				gs := f.runningJobs(t, 3)
				f.env.Clock.Advance(time.Second)
				body := wire.CompleteBatchRequest{}
				for i, g := range gs {
					body.Completions = append(body.Completions, wire.Completion{JobID: g.id,
						CompleteRequest: wire.CompleteRequest{LeaseToken: g.token, WaitForProofs: i == 1}})
				}
				out := f.completeBatch(t, body)
				// Only the completion that asked waited for its proofs.
				wantCompleted(t, f, out.Results[1], gs[1].id, 1000)
				var ids []string
				for _, i := range []int{0, 2} {
					wantNoProofs(t, out.Results[i], gs[i].id)
					for _, r := range out.Results[i].Completed.Receipts {
						ids = append(ids, r.ID)
					}
				}
				// The background sequencer integrates them all the same;
				// the batch sent again then answers every proof, against
				// one checkpoint, without asking to wait.
				waitSequenced(t, f.env, ids...)
				for i := range body.Completions {
					body.Completions[i].WaitForProofs = false
				}
				again := f.completeBatch(t, body)
				for i, g := range gs {
					wantCompleted(t, f, again.Results[i], g.id, 1000)
					if !slices.EqualFunc(bodies(out.Results[i].Completed.Receipts), bodies(again.Results[i].Completed.Receipts), bytes.Equal) {
						t.Errorf("job %s: the receipts answered again differ", g.id)
					}
				}
				if cp := again.Results[0].Completed.Checkpoint; again.Results[1].Completed.Checkpoint != cp || again.Results[2].Completed.Checkpoint != cp {
					t.Errorf("the results' proofs are not against one checkpoint")
				}
			})

			t.Run("refused whole", func(t *testing.T) {
				g := f.runningJobs(t, 1)[0]
				good := fmt.Sprintf(`{"job_id":%q,"lease_token":%q}`, g.id, g.token)
				many := strings.TrimSuffix(strings.Repeat(good+",", wire.MaxBatchComplete+1), ",")
				for _, tc := range []struct{ name, body, says string }{
					{"no completions", `{"completions":[]}`, "1 to 100"},
					{"absent", `{}`, "1 to 100"},
					{"over the count", `{"completions":[` + many + `]}`, "101 completions"},
					{"no lease_token", `{"completions":[` + good + `,{"job_id":"j"}]}`, "completions[1]: lease_token is required"},
					{"no job_id", `{"completions":[` + good + `,{"lease_token":"` + g.token + `"}]}`, "completions[1]: job_id is required"},
					{"malformed token", `{"completions":[` + good + `,{"job_id":"j","lease_token":"nll_short"}]}`, "completions[1]"},
					{"token not base62", `{"completions":[` + good + `,{"job_id":"j","lease_token":"nll_` + strings.Repeat("!", 49) + `"}]}`, "completions[1]"},
					{"metrics an array", `{"completions":[{"job_id":"` + g.id + `","lease_token":"` + g.token + `","metrics":[1]}]}`, "completions[0]: metrics"},
					{"output_uri over its limit", `{"completions":[{"job_id":"` + g.id + `","lease_token":"` + g.token + `","output_uri":"` + strings.Repeat("u", wire.MaxURIBytes+1) + `"}]}`, "completions[0]: output_uri is 2049 bytes"},
					{"job_id over its limit", `{"completions":[` + good + `,{"job_id":"` + strings.Repeat("j", wire.MaxNameBytes+1) + `","lease_token":"` + g.token + `"}]}`, "completions[1]: job_id is 256 bytes"},
					{"output_uri a number", `{"completions":[{"job_id":"` + g.id + `","lease_token":"` + g.token + `","output_uri":5}]}`, "output_uri"},
					{"wait_for_proofs a string", `{"completions":[{"job_id":"` + g.id + `","lease_token":"` + g.token + `","wait_for_proofs":"yes"}]}`, "wait_for_proofs"},
					{"completions an object", `{"completions":{}}`, "completions"},
				} {
					t.Run(tc.name, func(t *testing.T) {
						dump := f.env.Dump(t)
						st, b := post(t, f.node, wire.PathCompleteBatch, tc.body)
						wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
						if !strings.Contains(string(b), tc.says) {
							t.Errorf("the message does not say %q: %s", tc.says, b)
						}
						if diff := cmp.Diff(dump, f.env.Dump(t)); diff != "" {
							t.Errorf("a refused batch changed state (-before +after):\n%s", diff)
						}
					})
				}
				if j := f.env.Job(t, g.id); j.State != lease.StateRunning {
					t.Errorf("job %s", j.State)
				}
			})

			t.Run("scope", func(t *testing.T) {
				// node:result:submit, as complete: a token without it is
				// refused before the body is read.
				g := f.runningJobs(t, 1)[0]
				tok, _ := f.env.Credential(t, f.node.WorkerID, credential.ScopeNodeHeartbeat, credential.ScopeNodePoll)
				narrow := *f.node
				narrow.Token = tok
				st, b := post(t, &narrow, wire.PathCompleteBatch, wire.CompleteBatchRequest{Completions: []wire.Completion{
					{JobID: g.id, CompleteRequest: wire.CompleteRequest{LeaseToken: g.token}},
				}})
				wantErr(t, st, b, http.StatusForbidden, wire.CodeInsufficientScope)
				if j := f.env.Job(t, g.id); j.State != lease.StateRunning {
					t.Errorf("job %s", j.State)
				}
			})
		})
	}
}

// TestLeaseAcceptAnswerSchema checks that a lease answer with accepted grants is
// one the OpenAPI document describes.
func TestLeaseAcceptAnswerSchema(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	f.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{Accept: true})
	if st != http.StatusOK || !strings.Contains(string(b), `"state":"running"`) {
		t.Fatalf("lease: %d %s", st, b)
	}
	checkSchema(t, f.env, "LeaseResponse", b)
}
