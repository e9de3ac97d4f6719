package operator

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// get reads route path (with query q) into a new T.
func get[T any](ctx context.Context, c *Client, path string, q url.Values) (*T, error) {
	var out T
	if err := c.call(ctx, http.MethodGet, path, q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// post sends in (nil: no body) to route path and reads its answer into a
// new T.
func post[T any](ctx context.Context, c *Client, path string, in any) (*T, error) {
	var out T
	if err := c.call(ctx, http.MethodPost, path, nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// set adds v to q under k unless v is "".
func set(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// setInt adds n to q under k unless n is 0.
func setInt(q url.Values, k string, n int64) {
	if n != 0 {
		q.Set(k, strconv.FormatInt(n, 10))
	}
}

func jobPath(id string) string    { return "/operator/jobs/" + url.PathEscape(id) }
func workerPath(id string) string { return "/operator/workers/" + url.PathEscape(id) }

// --- jobs

// Dispatch queues a job (POST /operator/jobs): the answer says whether a
// registered worker could lease it now, and why not. A 503 whose message
// says the job "may have been accepted" means the server could not learn
// whether it was queued: list the jobs before dispatching it again.
func (c *Client) Dispatch(ctx context.Context, req wire.DispatchRequest) (*wire.DispatchResponse, error) {
	return post[wire.DispatchResponse](ctx, c, "/operator/jobs", req)
}

// DispatchBatch queues the jobs of req (1 to wire.MaxBatchDispatch) in one
// transaction, all or none: POST /operator/jobs/batch.
func (c *Client) DispatchBatch(ctx context.Context, req wire.DispatchBatchRequest) (*wire.DispatchBatchResponse, error) {
	return post[wire.DispatchBatchResponse](ctx, c, "/operator/jobs/batch", req)
}

// JobQuery selects the jobs of GET /operator/jobs: each filter that is
// not "" must match (they combine). After is the cursor: the jobs with
// ids above it (below it with Order "desc"); Limit the page's size (1 to
// 1,000; 0 means the server's default, 100).
type JobQuery struct {
	// State is a job state (queued, leased, running, succeeded, failed,
	// canceled); JobType a job type.
	State, JobType string
	// WorkerID selects the jobs whose last lease, live or ended, was that
	// worker's; Tag those whose requirements.tags include it.
	WorkerID, Tag string
	After         string
	Limit         int
	// Order is wire.OrderAsc (oldest first, as "" means) or
	// wire.OrderDesc (newest first).
	Order string
}

func (q JobQuery) values() url.Values {
	v := url.Values{}
	set(v, "state", q.State)
	set(v, "job_type", q.JobType)
	set(v, "worker_id", q.WorkerID)
	set(v, "tag", q.Tag)
	set(v, "after", q.After)
	setInt(v, "limit", int64(q.Limit))
	set(v, "order", q.Order)
	return v
}

// ListJobs reads one page of jobs in id order (GET /operator/jobs). Its
// Next, when not nil, is the After of the next page; Jobs follows them.
func (c *Client) ListJobs(ctx context.Context, q JobQuery) (*wire.JobListResponse, error) {
	return get[wire.JobListResponse](ctx, c, "/operator/jobs", q.values())
}

// Job reads a job with its result, its leasability, its first artifacts
// and a page of its events: those with ids above eventsAfter (0: from
// the first) (GET /operator/jobs/{id}). JobEvents follows the events'
// pages.
func (c *Client) Job(ctx context.Context, id string, eventsAfter int64) (*wire.JobDetailResponse, error) {
	q := url.Values{}
	setInt(q, "events_after", eventsAfter)
	return get[wire.JobDetailResponse](ctx, c, jobPath(id), q)
}

// CancelJob cancels a job (POST /operator/jobs/{id}/cancel): a queued
// job at once, a leased or running one by asking its worker
// (cancel_requested). Canceling again changes nothing; a succeeded or
// failed job answers 409 invalid_transition.
func (c *Client) CancelJob(ctx context.Context, id string) (*wire.OperatorJobResponse, error) {
	return post[wire.OperatorJobResponse](ctx, c, jobPath(id)+"/cancel", nil)
}

// RetryJob puts a failed or canceled job back in the queue with a fresh
// attempt budget (POST /operator/jobs/{id}/retry), recording reason (""
// for none, at most wire.MaxReasonBytes) in its job_retried receipt,
// whose id the answer's ReceiptID is. A job in any other state answers
// 409 invalid_transition.
func (c *Client) RetryJob(ctx context.Context, id, reason string) (*wire.OperatorJobResponse, error) {
	return post[wire.OperatorJobResponse](ctx, c, jobPath(id)+"/retry", wire.ReasonRequest{Reason: reason})
}

// ArtifactQuery selects the artifacts of GET /operator/artifacts: of one
// job and of one type when not "". After is the cursor (artifact ids
// above it, below it with Order "desc"); Limit the page's size (1 to
// 1,000; 0 means 1,000).
type ArtifactQuery struct {
	JobID, ArtifactType string
	After               string
	Limit               int
	// Order is wire.OrderAsc (oldest first, as "" means) or
	// wire.OrderDesc (newest first).
	Order string
}

func (q ArtifactQuery) values() url.Values {
	v := url.Values{}
	set(v, "job_id", q.JobID)
	set(v, "artifact_type", q.ArtifactType)
	set(v, "after", q.After)
	setInt(v, "limit", int64(q.Limit))
	set(v, "order", q.Order)
	return v
}

// ListArtifacts reads one page of artifacts in id order, each with its
// job's outcome (GET /operator/artifacts). Artifacts follows the pages.
func (c *Client) ListArtifacts(ctx context.Context, q ArtifactQuery) (*wire.ArtifactListResponse, error) {
	return get[wire.ArtifactListResponse](ctx, c, "/operator/artifacts", q.values())
}

// --- workers

// WorkerQuery selects the workers of GET /operator/workers, which takes
// no filter: After is the cursor (worker ids above it, below it with
// Order "desc"), Limit the page's size (1 to 1,000; 0 means 1,000).
type WorkerQuery struct {
	After string
	Limit int
	// Order is wire.OrderAsc (oldest first, as "" means) or
	// wire.OrderDesc (newest first).
	Order string
}

func (q WorkerQuery) values() url.Values {
	v := url.Values{}
	set(v, "after", q.After)
	setInt(v, "limit", int64(q.Limit))
	set(v, "order", q.Order)
	return v
}

// ListWorkers reads one page of workers in id order (GET
// /operator/workers). Workers follows the pages.
func (c *Client) ListWorkers(ctx context.Context, q WorkerQuery) (*wire.WorkerListResponse, error) {
	return get[wire.WorkerListResponse](ctx, c, "/operator/workers", q.values())
}

// Worker reads a worker with its latest heartbeat metrics and its live
// leases (GET /operator/workers/{id}).
func (c *Client) Worker(ctx context.Context, id string) (*wire.WorkerDetailResponse, error) {
	return get[wire.WorkerDetailResponse](ctx, c, workerPath(id), nil)
}

// BanWorker bans a worker, and every worker of its key, for reason ("":
// none) (POST /operator/workers/{id}/ban). ReceiptID is nil when it was
// banned already with the same reason.
func (c *Client) BanWorker(ctx context.Context, id, reason string) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/ban", wire.ReasonRequest{Reason: reason})
}

// UnbanWorker lifts a worker's ban, and that of every worker of its key
// (POST /operator/workers/{id}/unban). ReceiptID is nil when it was not
// banned; a retired worker answers 409 invalid_transition.
func (c *Client) UnbanWorker(ctx context.Context, id, reason string) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/unban", wire.ReasonRequest{Reason: reason})
}

// RetireWorker retires a worker for good (POST
// /operator/workers/{id}/retire): its credentials revoked, its principal
// banned, its live leases ended. Retiring again answers as the first
// retirement did.
func (c *Client) RetireWorker(ctx context.Context, id, reason string) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/retire", wire.ReasonRequest{Reason: reason})
}

// DrainWorker asks a worker to drain (POST /operator/workers/{id}/drain):
// it is granted no job while the request stands, and keeps those it
// holds. It mints no receipt.
func (c *Client) DrainWorker(ctx context.Context, id string) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/drain", nil)
}

// ResumeWorker withdraws a worker's drain request (POST
// /operator/workers/{id}/resume). It mints no receipt.
func (c *Client) ResumeWorker(ctx context.Context, id string) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/resume", nil)
}

// ApproveWorker approves a worker, pinning the job types and tags req
// names (nil pins nothing) (POST /operator/workers/{id}/approve).
// ReceiptID is nil when the same pins stood already.
func (c *Client) ApproveWorker(ctx context.Context, id string, req wire.ApproveRequest) (*wire.WorkerResponse, error) {
	return post[wire.WorkerResponse](ctx, c, workerPath(id)+"/approve", req)
}

// --- credentials and principals

// MintCredential mints a credential for a principal (POST
// /operator/credentials). Its Token is shown this once. The caller's
// credential must hold every scope it asks for (403 insufficient_scope).
func (c *Client) MintCredential(ctx context.Context, req wire.MintCredentialRequest) (*wire.MintCredentialResponse, error) {
	return post[wire.MintCredentialResponse](ctx, c, "/operator/credentials", req)
}

// RevokeCredential revokes a credential (POST
// /operator/credentials/{id}/revoke). ReceiptID is nil when it was
// revoked already.
func (c *Client) RevokeCredential(ctx context.Context, id, reason string) (*wire.RevokeCredentialResponse, error) {
	return post[wire.RevokeCredentialResponse](ctx, c, "/operator/credentials/"+url.PathEscape(id)+"/revoke", wire.ReasonRequest{Reason: reason})
}

// CredentialQuery selects the credentials of GET /operator/credentials:
// of one principal when Principal is not "". After is the cursor
// (credential ids above it, in byte order; below it with Order "desc");
// Limit the page's size (1 to 1,000; 0 means 100).
type CredentialQuery struct {
	Principal string
	After     string
	Limit     int
	// Order is wire.OrderAsc (as "" means) or wire.OrderDesc: descending
	// byte order of the ids, which are random, so not creation order.
	Order string
}

func (q CredentialQuery) values() url.Values {
	v := url.Values{}
	set(v, "principal", q.Principal)
	set(v, "after", q.After)
	setInt(v, "limit", int64(q.Limit))
	set(v, "order", q.Order)
	return v
}

// ListCredentials reads one page of credentials, live, expired and
// revoked, never their tokens (GET /operator/credentials). Credentials
// follows the pages.
func (c *Client) ListCredentials(ctx context.Context, q CredentialQuery) (*wire.CredentialListResponse, error) {
	return get[wire.CredentialListResponse](ctx, c, "/operator/credentials", q.values())
}

// CreatePrincipal creates an operator principal, with no credential
// (POST /operator/principals); an id held already answers 409
// principal_exists.
func (c *Client) CreatePrincipal(ctx context.Context, req wire.CreatePrincipalRequest) (*wire.CreatePrincipalResponse, error) {
	return post[wire.CreatePrincipalResponse](ctx, c, "/operator/principals", req)
}

// --- envelope

// Envelope reads the envelope's state (GET /operator/envelope).
func (c *Client) Envelope(ctx context.Context) (*wire.EnvelopeResponse, error) {
	return get[wire.EnvelopeResponse](ctx, c, "/operator/envelope", nil)
}

// ActivateEnvelope lets blocked job types run, until req.Until when set
// (POST /operator/envelope/activate). req.Reason is required.
func (c *Client) ActivateEnvelope(ctx context.Context, req wire.ActivateRequest) (*wire.EnvelopeResponse, error) {
	return post[wire.EnvelopeResponse](ctx, c, "/operator/envelope/activate", req)
}

// SetSafeTypes changes the job types operators made safe at run time
// (POST /operator/envelope/safe-types): req.Add made safe, req.Remove
// blocked again, with a new policy version and an
// envelope_safe_types_changed receipt (ReceiptID). A canonical blocked
// type answers 400 invalid_request naming it.
func (c *Client) SetSafeTypes(ctx context.Context, req wire.SafeTypesRequest) (*wire.EnvelopeResponse, error) {
	return post[wire.EnvelopeResponse](ctx, c, "/operator/envelope/safe-types", req)
}

// DeactivateEnvelope blocks the blocked job types again (POST
// /operator/envelope/deactivate). The reason is required.
func (c *Client) DeactivateEnvelope(ctx context.Context, reason string) (*wire.EnvelopeResponse, error) {
	return post[wire.EnvelopeResponse](ctx, c, "/operator/envelope/deactivate", wire.ReasonRequest{Reason: reason})
}

// --- costs and receipts

// CostQuery is the window and grouping of GET /operator/costs. A zero
// From means the start of the current UTC month, a zero To now, an empty
// GroupBy wire.CostGroupBySKU.
type CostQuery struct {
	From, To time.Time
	// GroupBy is wire.CostGroupBySKU, CostGroupByWorker or
	// CostGroupByJobType.
	GroupBy string
}

// Costs sums the job_charged receipts whose server_time is in [From, To)
// by group, with the GPU time no one was charged for (GET
// /operator/costs).
func (c *Client) Costs(ctx context.Context, q CostQuery) (*wire.CostReport, error) {
	v := url.Values{}
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339Nano))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339Nano))
	}
	set(v, "group_by", q.GroupBy)
	return get[wire.CostReport](ctx, c, "/operator/costs", v)
}

// ReceiptQuery selects the sequenced receipts of GET /operator/receipts:
// those of Kind when it is not "", from the log index From on (0: from
// the first), Limit a page (1 to 1,000; 0 means 100). With Order
// wire.OrderDesc they come newest first, from index From down (0: from
// the newest).
type ReceiptQuery struct {
	Kind  receipts.Kind
	From  int64
	Limit int
	// Order is wire.OrderAsc (oldest first, as "" means) or
	// wire.OrderDesc (newest first).
	Order string
}

// cursor is the after= of q's first page (-1: none).
func (q ReceiptQuery) cursor() int64 {
	if q.Order == wire.OrderDesc {
		if q.From > 0 {
			return q.From + 1
		}
		return -1
	}
	return q.From - 1
}

// ListReceipts reads one page of sequenced receipts in index order (GET
// /operator/receipts). Its Next, when not nil, is the index after which
// the next page starts: the next page's From is *Next+1 (*Next-1 with
// Order desc). With a Kind, a page may hold fewer receipts than Limit,
// or none, and still have a next. Receipts follows the pages.
func (c *Client) ListReceipts(ctx context.Context, q ReceiptQuery) (*wire.ReceiptListResponse, error) {
	return c.listReceipts(ctx, q, q.cursor())
}

// listReceipts reads the page of q's receipts past index after, in q's
// order (from the first of the order when after is negative).
func (c *Client) listReceipts(ctx context.Context, q ReceiptQuery, after int64) (*wire.ReceiptListResponse, error) {
	v := url.Values{}
	set(v, "kind", string(q.Kind))
	if after >= 0 {
		v.Set("after", strconv.FormatInt(after, 10))
	}
	setInt(v, "limit", int64(q.Limit))
	set(v, "order", q.Order)
	return get[wire.ReceiptListResponse](ctx, c, "/operator/receipts", v)
}

// Receipt reads a receipt with, once it is sequenced, its inclusion proof
// and the signed checkpoint the proof is against (GET
// /operator/receipts/{id}); receipts.Verify checks them offline.
func (c *Client) Receipt(ctx context.Context, id string) (*wire.ReceiptResponse, error) {
	return get[wire.ReceiptResponse](ctx, c, "/operator/receipts/"+url.PathEscape(id), nil)
}

// Checkpoint reads the latest signed checkpoint note of the receipt log
// (GET /operator/receipts/checkpoint), as receipts.OpenCheckpoint takes
// it.
func (c *Client) Checkpoint(ctx context.Context) ([]byte, error) {
	var b text
	if err := c.call(ctx, http.MethodGet, "/operator/receipts/checkpoint", nil, nil, &b); err != nil {
		return nil, err
	}
	return b, nil
}

// VerifiedCheckpoint reads the latest signed checkpoint and opens it with
// the log's note verifier key and origin (receipts.OpenCheckpoint): a
// checkpoint that does not verify is an error.
func (c *Client) VerifiedCheckpoint(ctx context.Context, verifierKey, origin string) (*receipts.Checkpoint, error) {
	note, err := c.Checkpoint(ctx)
	if err != nil {
		return nil, err
	}
	return receipts.OpenCheckpoint(note, verifierKey, origin)
}

// Consistency reads the consistency proof from the log's tree of oldSize
// receipts to its tree of newSize (GET /operator/receipts/consistency);
// receipts.CheckConsistency checks it against two checkpoints.
func (c *Client) Consistency(ctx context.Context, oldSize, newSize int64) (*wire.ConsistencyResponse, error) {
	v := url.Values{"old": {strconv.FormatInt(oldSize, 10)}, "new": {strconv.FormatInt(newSize, 10)}}
	return get[wire.ConsistencyResponse](ctx, c, "/operator/receipts/consistency", v)
}
