package workerapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A worker reads online, stale after a missed heartbeat and offline after
// OfflineAfter, in the list and its own view; each heartbeat answer names
// the deadline of the next; the maintainer then ends its leases, and their
// tokens get 409 lease_lost; a job that only the offline worker matches is
// not leasable.
func TestWorkerLiveness(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		now := time.Now().UTC().Truncate(time.Millisecond)
		env.Clock.Set(now)
		defer env.Clock.Follow()
		const interval, offline = workerapi.DefaultHeartbeatInterval, 3 * workerapi.DefaultHeartbeatInterval

		n := opGPUNode(t, env, "gpu-1", 2)
		liveness := func(want string) {
			t.Helper()
			w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)["worker"].(obj)
			if w["liveness"] != want {
				t.Fatalf("worker view: liveness %v, want %s (last seen %v)", w["liveness"], want, w["last_seen_at"])
			}
			l := mustOp(t, env, http.StatusOK, "GET", "/operator/workers", nil)["workers"].([]any)[0].(obj)
			if l["liveness"] != want {
				t.Fatalf("worker list: liveness %v, want %s", l["liveness"], want)
			}
		}
		liveness(wire.LivenessOnline)

		env.Clock.Advance(time.Second)
		hb := signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "idle"})
		seen := env.Clock.Now().UTC()
		if got, err := time.Parse(time.RFC3339Nano, hb["heartbeat_deadline"].(string)); err != nil || !got.Equal(seen.Add(offline)) {
			t.Fatalf("heartbeat_deadline %v (%v), want %v", hb["heartbeat_deadline"], err, seen.Add(offline))
		}
		dispatchJob(t, env, obj{"job_type": "status_check"})
		jobID, token := runOne(t, n, "status_check")

		env.Clock.Advance(interval + interval/2)
		liveness(wire.LivenessOnline)
		env.Clock.Advance(time.Millisecond)
		liveness(wire.LivenessStale)
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if j := env.Job(t, jobID); j.State != lease.StateRunning {
			t.Fatalf("a stale worker's job is %s, want running", j.State)
		}
		env.Clock.Set(seen.Add(offline))
		liveness(wire.LivenessOffline)
		w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)["worker"].(obj)
		if w["status"] != "idle" || w["last_seen_at"] != seen.Format(time.RFC3339Nano) {
			t.Errorf("offline worker: status %v, last_seen_at %v (want %v)", w["status"], w["last_seen_at"], seen.Format(time.RFC3339Nano))
		}

		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		j := env.Job(t, jobID)
		if j.State != lease.StateQueued || j.LastError == nil || j.LastError.Code != lease.CodeWorkerOffline || j.Attempt != 2 {
			t.Fatalf("after the maintainer: %s, attempt %d, last error %+v", j.State, j.Attempt, j.LastError)
		}
		for _, path := range []string{wire.JobPath(jobID, wire.ActionStatus), wire.JobPath(jobID, wire.ActionComplete)} {
			m := signedCall(t, n, http.StatusConflict, path, obj{"lease_token": token, "event_type": "progress"})
			if m["error"].(obj)["code"] != wire.CodeLeaseLost {
				t.Errorf("%s with the old token: %v", path, m)
			}
		}

		// Only the offline worker matches: not leasable, and it says so.
		d := dispatchJob(t, env, obj{"job_type": "status_check"})
		if d["leasable"] != false || !strings.Contains(d["reason"].(string), "no online worker matches") {
			t.Errorf("dispatch with only an offline worker: leasable %v, reason %q", d["leasable"], d["reason"])
		}
		// A heartbeat brings it back: online, and the job leasable.
		hb = signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "idle", "current_jobs": []string{jobID}})
		if lost := hb["lost_jobs"].([]any); len(lost) != 1 || lost[0] != jobID {
			t.Errorf("heartbeat after coming back: lost_jobs %v, want [%s]", lost, jobID)
		}
		liveness(wire.LivenessOnline)
		env.Clock.Advance(2 * time.Second) // past Explain's cached worker list
		d = dispatchJob(t, env, obj{"job_type": "status_check"})
		if d["leasable"] != true {
			t.Errorf("dispatch with the worker back: leasable %v, reason %q", d["leasable"], d["reason"])
		}
	})
}
