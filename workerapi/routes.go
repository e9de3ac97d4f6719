package workerapi

import (
	"context"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// workerRoutes are the worker routes of PROTOCOL.md.
func (s *Server) workerRoutes() []route {
	post := func(path string, scope credential.Scope, h func(ctx context.Context, c *call) (int, any, error)) route {
		return route{method: http.MethodPost, path: path, scope: scope, signed: true, handle: h}
	}
	return []route{
		post(wire.PathRegister, credential.ScopeNodeRegister, nil), // s.register runs it: its key is in the body
		post(wire.PathHeartbeat, credential.ScopeNodeHeartbeat, s.heartbeat),
		post(wire.PathStart, credential.ScopeNodeHeartbeat, s.start),
		post(wire.PathToken, credential.ScopeNodeHeartbeat, s.renewToken),
		post(wire.PathSignals, credential.ScopeNodeHeartbeat, s.signals),
		post(wire.PathLease, credential.ScopeNodePoll, s.lease),
		post("/workers/jobs/{id}/accept", credential.ScopeNodePoll, s.accept),
		post("/workers/jobs/{id}/status", credential.ScopeNodeHeartbeat, s.status),
		post("/workers/jobs/{id}/logs", credential.ScopeNodeHeartbeat, s.logs),
		{method: http.MethodPost, path: "/workers/jobs/{id}/artifacts", scope: credential.ScopeNodeResultSubmit,
			signed: true, prepare: s.prepareArtifact, handle: s.artifacts},
		post("/workers/jobs/{id}/uploads", credential.ScopeNodeResultSubmit, s.uploads),
		{method: http.MethodPut, path: "/workers/jobs/{id}/uploads/{upload}/parts/{n}", scope: credential.ScopeNodeResultSubmit,
			signed: true, stream: true, handle: s.uploadPart},
		{method: http.MethodGet, path: "/workers/jobs/{id}/artifacts/{artifact}/content", scope: credential.ScopeNodePoll,
			signed: true, handle: s.workerContent},
		post("/workers/jobs/{id}/complete", credential.ScopeNodeResultSubmit, s.complete),
		post(wire.PathCompleteBatch, credential.ScopeNodeResultSubmit, s.completeBatch),
		post("/workers/jobs/{id}/fail", credential.ScopeNodeResultSubmit, s.failJob),
		post("/workers/jobs/{id}/release", credential.ScopeNodePoll, s.release),
		post(wire.PathAudit, credential.ScopeNodeAuditSubmit, s.audit),
		{method: http.MethodGet, path: wire.PathOpenAPI, public: true, handle: s.openAPI},
	}
}

// operatorRoutes are the operator routes of PROTOCOL.md.
func (s *Server) operatorRoutes() []route {
	op := func(method, path string, scope credential.Scope, h func(ctx context.Context, c *call) (int, any, error)) route {
		return route{method: method, path: path, scope: scope, handle: h}
	}
	// get is an operator GET route and the query parameters it accepts:
	// any other is refused (checkQuery), so a new GET route states its
	// parameters here or accepts none.
	get := func(path string, scope credential.Scope, h func(ctx context.Context, c *call) (int, any, error), query ...string) route {
		return route{method: http.MethodGet, path: path, scope: scope, handle: h, query: query}
	}
	post := http.MethodPost
	return []route{
		op(post, "/operator/jobs", credential.ScopeOperatorJobs, s.opDispatch),
		op(post, "/operator/jobs/batch", credential.ScopeOperatorJobs, s.opDispatchBatch),
		get("/operator/jobs", credential.ScopeOperatorJobs, s.opListJobs, "state", "job_type", "worker_id", "tag", "after", "limit", "order"),
		get("/operator/jobs/{id}", credential.ScopeOperatorJobs, s.opGetJob, "events_after"),
		op(post, "/operator/jobs/{id}/cancel", credential.ScopeOperatorJobs, s.opCancelJob),
		op(post, "/operator/jobs/{id}/retry", credential.ScopeOperatorJobs, s.opRetryJob),
		get("/operator/artifacts", credential.ScopeOperatorJobs, s.opListArtifacts, "job_id", "artifact_type", "after", "limit", "order"),
		get("/operator/artifacts/{id}/content", credential.ScopeOperatorJobs, s.opArtifactContent),
		op(http.MethodHead, "/operator/artifacts/{id}/content", credential.ScopeOperatorJobs, s.opArtifactContent),
		get("/operator/workers", credential.ScopeOperatorWorkers, s.opListWorkers, "after", "limit", "order"),
		get("/operator/workers/{id}", credential.ScopeOperatorWorkers, s.opGetWorker),
		op(post, "/operator/workers/{id}/ban", credential.ScopeOperatorWorkers, s.opBanWorker),
		op(post, "/operator/workers/{id}/unban", credential.ScopeOperatorWorkers, s.opUnbanWorker),
		op(post, "/operator/workers/{id}/approve", credential.ScopeOperatorWorkers, s.opApproveWorker),
		op(post, "/operator/workers/{id}/retire", credential.ScopeOperatorWorkers, s.opRetireWorker),
		op(post, "/operator/workers/{id}/drain", credential.ScopeOperatorWorkers, s.opDrainWorker),
		op(post, "/operator/workers/{id}/resume", credential.ScopeOperatorWorkers, s.opResumeWorker),
		op(post, "/operator/credentials", credential.ScopeOperatorCredentials, s.opMintCredential),
		op(post, "/operator/credentials/{id}/revoke", credential.ScopeOperatorCredentials, s.opRevokeCredential),
		get("/operator/credentials", credential.ScopeOperatorCredentials, s.opListCredentials, "principal", "after", "limit", "order"),
		op(post, "/operator/principals", credential.ScopeOperatorCredentials, s.opCreatePrincipal),
		get("/operator/envelope", credential.ScopeOperatorEnvelope, s.opGetEnvelope),
		op(post, "/operator/envelope/activate", credential.ScopeOperatorEnvelope, s.opActivate),
		op(post, "/operator/envelope/deactivate", credential.ScopeOperatorEnvelope, s.opDeactivate),
		op(post, "/operator/envelope/safe-types", credential.ScopeOperatorEnvelope, s.opSetSafeTypes),
		get("/operator/costs", credential.ScopeOperatorReceipts, s.opCosts, "from", "to", "group_by"),
		get("/operator/receipts", credential.ScopeOperatorReceipts, s.opListReceipts, "kind", "after", "limit", "order"),
		get("/operator/receipts/checkpoint", credential.ScopeOperatorReceipts, s.opCheckpoint),
		get("/operator/receipts/consistency", credential.ScopeOperatorReceipts, s.opConsistency, "old", "new"),
		get("/operator/receipts/{id}", credential.ScopeOperatorReceipts, s.opGetReceipt),
	}
}

// WorkerHandler serves the worker routes (paths starting /workers/),
// relative to where it is mounted. Signatures cover the request-target as
// the client sent it, so the handler may sit behind http.StripPrefix.
func (s *Server) WorkerHandler() http.Handler { return s.mux(s.workerRoutes()) }

// OperatorHandler serves the operator routes (paths starting /operator/).
func (s *Server) OperatorHandler() http.Handler { return s.mux(s.operatorRoutes()) }

// Handler serves both the worker and the operator routes.
func (s *Server) Handler() http.Handler {
	return s.mux(append(s.workerRoutes(), s.operatorRoutes()...))
}
