package wire

import "net/url"

// The worker routes, relative to where the host mounts the handlers.
const (
	PathRegister  = "/workers/register"
	PathHeartbeat = "/workers/heartbeat"
	// PathStart is what a worker with a token calls each time it starts.
	PathStart = "/workers/start"
	PathLease = "/workers/jobs/lease"
	// PathCompleteBatch completes several jobs in one request.
	PathCompleteBatch = "/workers/jobs/complete"
	PathAudit         = "/workers/audit"
	// PathSignals is the control long-poll a worker keeps open so that a
	// cancel, a lost job, a drain, a ban or a retirement reaches it in
	// seconds (SignalsRequest).
	PathSignals = "/workers/signals"
	PathOpenAPI = "/workers/openapi.json"
)

// The actions on one leased job, for JobPath.
const (
	ActionAccept    = "accept"
	ActionStatus    = "status"
	ActionLogs      = "logs"
	ActionArtifacts = "artifacts"
	ActionComplete  = "complete"
	ActionFail      = "fail"
	ActionRelease   = "release"
)

// JobPath is the route of action on job id: /workers/jobs/{id}/{action},
// with id path-escaped.
func JobPath(id, action string) string {
	return "/workers/jobs/" + url.PathEscape(id) + "/" + action
}

// Limits of the worker routes that a client must respect.
const (
	// MaxJobsPerLease is the largest max_jobs of a lease request.
	MaxJobsPerLease = 32
	// MaxWaitSeconds is the longest wait_seconds of a lease request: a
	// longer one is refused, as a longer one of signals is.
	MaxWaitSeconds = 60
	// MaxMetricsBytes bounds a heartbeat's metrics object.
	MaxMetricsBytes = 16 << 10
	// MaxAuditEvents bounds the events of one audit request.
	MaxAuditEvents = 100
	// MaxSignalsWaitSeconds is the longest wait_seconds of a signals
	// request.
	MaxSignalsWaitSeconds = 60
)
