package workerapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// deafNotifier is a SignalNotifier that drops every NotifyWorker: a
// signal lost on its way.
type deafNotifier struct{ workerapi.SignalNotifier }

func (deafNotifier) NotifyWorker(context.Context, string) error { return nil }

// answer is a worker request's answer, sent from another goroutine.
type answer struct {
	status int
	body   obj
	err    error
	at     time.Time
}

// send sends req (built on the test's goroutine) from a goroutine of its
// own, and delivers its answer.
func send(req *http.Request) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		var m obj
		if err == nil {
			err = json.Unmarshal(b, &m)
		}
		out <- answer{status: resp.StatusCode, body: m, err: err, at: time.Now()}
	}()
	return out
}

// await waits for a, failing the test after limit.
func await(t *testing.T, what string, a <-chan answer, limit time.Duration) answer {
	t.Helper()
	select {
	case got := <-a:
		if got.err != nil {
			t.Fatalf("%s: %v", what, got.err)
		}
		return got
	case <-time.After(limit):
		t.Fatalf("%s: no answer within %v", what, limit)
		return answer{}
	}
}

// POST /workers/signals answers at once when a signal is due, wakes as
// soon as an operator's cancel or drain commits (well before the end of
// the wait), answers at the end of the wait otherwise, and a ban ends it,
// and the worker's waiting lease long-poll, with 403 worker_banned.
func TestSignals(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-signals", 2)
		a := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		ja, _ := runOne(t, n, "status_check")
		if ja != a {
			t.Fatalf("ran %s, want %s", ja, a)
		}

		// Nothing due: at once without a wait, and the shape of the answer.
		m := signedCall(t, n, http.StatusOK, wire.PathSignals, obj{"current_jobs": []string{a}})
		exactKeys(t, "signals answer", m, "cancel_jobs", "lost_jobs", "drain", "server_time")
		if len(m["cancel_jobs"].([]any)) != 0 || len(m["lost_jobs"].([]any)) != 0 || m["drain"] != false {
			t.Errorf("nothing due: %v", m)
		}
		// A job the worker does not hold: lost, at once, whatever the wait.
		m = signedCall(t, n, http.StatusOK, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a, "job_not_mine", "job_not_mine"}})
		if got := strs(m["lost_jobs"]); len(got) != 1 || got[0] != "job_not_mine" {
			t.Errorf("lost_jobs = %v, want [job_not_mine]", got)
		}
		// Nothing due with a wait: at its end.
		start := time.Now()
		m = signedCall(t, n, http.StatusOK, wire.PathSignals, obj{"wait_seconds": 1, "current_jobs": []string{a}})
		if time.Since(start) < 900*time.Millisecond || len(m["cancel_jobs"].([]any)) != 0 {
			t.Errorf("a wait with nothing due answered after %v: %v", time.Since(start), m)
		}

		// A cancel during the wait answers it at once.
		poll := send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a}}))
		env.AwaitLongPolls(t, 1)
		mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+a+"/cancel", nil)
		got := await(t, "signals during a cancel", poll, 10*time.Second)
		if got.status != http.StatusOK || strings.Join(strs(got.body["cancel_jobs"]), ",") != a {
			t.Errorf("signals after the cancel: %d %v", got.status, got.body)
		}
		// A known cancel is not due: the wait runs to its end, and still
		// lists it.
		m = signedCall(t, n, http.StatusOK, wire.PathSignals, obj{"wait_seconds": 1, "current_jobs": []string{a}, "known_cancels": []string{a}})
		if strings.Join(strs(m["cancel_jobs"]), ",") != a {
			t.Errorf("known cancel: %v", m)
		}

		// Drain: the wait ends at once; heartbeats, the worker's view and
		// the lease say so; no job is granted.
		poll = send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60}))
		env.AwaitLongPolls(t, 1)
		w := mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/drain", nil)
		if wv := w["worker"].(obj); wv["drain"] != true || wv["drain_requested_by"] != apitest.OperatorID || wv["drain_requested_at"] == nil || w["receipt_id"] != nil {
			t.Errorf("drain answer: %v", w)
		}
		got = await(t, "signals during a drain", poll, 10*time.Second)
		if got.status != http.StatusOK || got.body["drain"] != true {
			t.Errorf("signals after the drain: %d %v", got.status, got.body)
		}
		if hb := signedCall(t, n, http.StatusOK, wire.PathHeartbeat, obj{"status": "busy"}); hb["drain"] != true {
			t.Errorf("heartbeat while draining: %v", hb)
		}
		if d := dispatchJob(t, env, obj{"job_type": "status_check"}); d["leasable"] != false || !strings.Contains(d["reason"].(string), "draining") {
			t.Errorf("dispatch while the one worker drains: %v", d)
		}
		if msg := emptyLease(t, env, n, obj{"supported_job_types": []string{"status_check"}}); !strings.Contains(msg, "drain") {
			t.Errorf("lease while draining: %q", msg)
		}
		// Draining again changes nothing; resume wakes a poll that knows
		// of the drain.
		mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/drain", obj{})
		poll = send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "draining": true}))
		env.AwaitLongPolls(t, 1)
		mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/resume", nil)
		got = await(t, "signals during a resume", poll, 10*time.Second)
		if got.status != http.StatusOK || got.body["drain"] != false {
			t.Errorf("signals after the resume: %d %v", got.status, got.body)
		}
		if hb := signedCall(t, n, http.StatusOK, wire.PathHeartbeat, obj{"status": "idle"}); hb["drain"] != false {
			t.Errorf("heartbeat after resume: %v", hb)
		}

		// A ban ends the signals poll and the lease long-poll at once.
		signedCall(t, n, http.StatusOK, wire.PathSignals, obj{"current_jobs": []string{a}}) // a nonce of its own
		sp := send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a}, "known_cancels": []string{a}}))
		lp := send(n.Request(t, http.MethodPost, wire.PathLease, obj{"supported_job_types": []string{"lora_train"}, "wait_seconds": 60}))
		env.AwaitLongPolls(t, 2)
		mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/ban", obj{"reason": "stolen"})
		for what, ch := range map[string]<-chan answer{"signals": sp, "lease": lp} {
			got := await(t, what+" during a ban", ch, 10*time.Second)
			wantOpError(t, what+" during a ban", got.status, got.body, http.StatusForbidden, wire.CodeWorkerBanned)
		}
	})
}

// A lease the maintainer ends (here its TTL ran out) wakes the worker's
// waiting signals long-poll, which answers the job lost at once rather
// than at the end of its wait or at the next heartbeat.
func TestSignalsMaintainerEnd(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		logs := logtest.New()
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.Logger = slog.New(logs) }))
		n := opGPUNode(t, env, "gpu-expired", 1)
		a := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		if got, _ := runOne(t, n, "status_check"); got != a {
			t.Fatalf("ran %s, want %s", got, a)
		}
		poll := send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a}}))
		env.AwaitLongPolls(t, 1)
		env.Clock.Advance(workerapi.DefaultLeaseTTL + time.Second)
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := await(t, "signals after the maintainer ended the lease", poll, 10*time.Second)
		if got.status != http.StatusOK || strings.Join(strs(got.body["lost_jobs"]), ",") != a {
			t.Errorf("signals after the lease expired: %d %v, want lost_jobs [%s]", got.status, got.body, a)
		}
		// The wake-up ran after the commit, outside the transaction (in it,
		// PostgreSQL's pg_notify failed and another wake-up hid it).
		for _, r := range logs.Records() {
			if r.Level >= slog.LevelWarn {
				t.Errorf("logged %s %q", r.Level, r.Message)
			}
		}
	})
}

// A worker banned while its lease long-poll waits gets 403 and no job,
// and a job enqueued right after the ban stays queued: the claim checks
// the ban in its own transaction, even when the ban's wake-up is lost and
// only the job's wakes the long-poll (deaf), and when the Notifier has no
// per-worker signals (generic: the ban's Notify wakes every long-poll).
func TestBanDuringLeaseLongPoll(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"signal", "deaf", "generic"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			onDialects(t, func(t *testing.T, d string) {
				var notifier workerapi.Notifier = workerapi.NewLocalNotifier()
				switch mode {
				case "deaf":
					notifier = deafNotifier{workerapi.NewLocalNotifier()}
				case "generic":
					notifier = genericNotifier{notifier}
				}
				env := newOpEnv(t, d, apitest.WithNotifier(func(testing.TB, *bunstore.DB) workerapi.Notifier { return notifier }))
				n := opGPUNode(t, env, "gpu-banned", 2)
				lp := send(n.Request(t, http.MethodPost, wire.PathLease, obj{"supported_job_types": []string{"status_check"}, "wait_seconds": 30, "accept": true}))
				env.AwaitLongPolls(t, 1)
				mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/ban", obj{"reason": "compromised"})
				job := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
				got := await(t, "lease long-poll during a ban", lp, 20*time.Second)
				wantOpError(t, "lease long-poll during a ban", got.status, got.body, http.StatusForbidden, wire.CodeWorkerBanned)
				if j := env.Job(t, job); j.State != lease.StateQueued || j.Lease != nil {
					t.Errorf("job after the banned worker's long-poll: state %s, lease %+v", j.State, j.Lease)
				}
			})
		})
	}
}

// genericNotifier hides the SignalNotifier methods of the notifier it
// wraps: the Server falls back on Notify alone.
type genericNotifier struct{ inner workerapi.Notifier }

func (g genericNotifier) Notify(ctx context.Context) error     { return g.inner.Notify(ctx) }
func (g genericNotifier) Subscribe() (<-chan struct{}, func()) { return g.inner.Subscribe() }

// A retirement ends the worker's signals long-poll with 403
// worker_banned.
func TestSignalsRetire(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-retire-signals", 1)
		sp := send(n.Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60}))
		env.AwaitLongPolls(t, 1)
		mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/retire", obj{"reason": "old"})
		got := await(t, "signals during a retirement", sp, 10*time.Second)
		wantOpError(t, "signals during a retirement", got.status, got.body, http.StatusForbidden, wire.CodeWorkerBanned)
		st, m := op(t, env, "POST", "/operator/workers/"+n.WorkerID+"/drain", nil)
		wantOpError(t, "drain a retired worker", st, m, http.StatusConflict, wire.CodeInvalidTransition)
	})
}

// Across replicas on PostgreSQL: a cancel on one replica reaches a
// signals long-poll on another through the bunstore Notifier's channel.
func TestSignalsAcrossReplicas(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "postgres", apitest.WithNotifier(func(t testing.TB, db *bunstore.DB) workerapi.Notifier {
		n, err := db.Notifier(context.Background(), nil)
		if err != nil {
			t.Fatalf("notifier: %v", err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}))
	other := env.Replica(t)
	n := opGPUNode(t, env, "gpu-replicas", 1)
	dispatchJob(t, env, obj{"job_type": "status_check"})
	a, _ := runOne(t, n, "status_check")
	poll := send(n.On(other).Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a}}))
	other.AwaitLongPolls(t, 1)
	mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+a+"/cancel", nil)
	got := await(t, "signals on another replica", poll, 10*time.Second)
	if got.status != http.StatusOK || strings.Join(strs(got.body["cancel_jobs"]), ",") != a {
		t.Fatalf("signals on another replica: %d %v", got.status, got.body)
	}
	// A drain on one replica ends a poll waiting on the other.
	poll = send(n.On(other).Request(t, http.MethodPost, wire.PathSignals, obj{"wait_seconds": 60, "current_jobs": []string{a}, "known_cancels": []string{a}}))
	other.AwaitLongPolls(t, 1)
	mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/drain", nil)
	got = await(t, "drain on another replica", poll, 10*time.Second)
	if got.status != http.StatusOK || got.body["drain"] != true {
		t.Fatalf("drain on another replica: %d %v", got.status, got.body)
	}
}

// Refused signals requests and drain/resume calls.
func TestSignalsRefused(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-refused", 1)
		long := strings.Repeat("j", wire.MaxNameBytes+1)
		many := make([]string, wire.MaxCurrentJobs+1)
		for i := range many {
			many[i] = "job"
		}
		for name, body := range map[string]any{
			"malformed JSON":          `{"wait_seconds": `,
			"wait_seconds a string":   obj{"wait_seconds": "5"},
			"wait_seconds negative":   obj{"wait_seconds": -1},
			"wait_seconds over 60":    obj{"wait_seconds": 61},
			"current_jobs not array":  obj{"current_jobs": "job_1"},
			"current_jobs too many":   obj{"current_jobs": many},
			"current_jobs id long":    obj{"current_jobs": []string{long}},
			"known_cancels too many":  obj{"known_cancels": many},
			"known_cancels id long":   obj{"known_cancels": []string{long}},
			"draining not a boolean":  obj{"draining": "yes"},
			"trailing data":           `{} {}`,
			"an array, not an object": `[]`,
		} {
			resp, b := n.Do(t, http.MethodPost, wire.PathSignals, body)
			var m obj
			json.Unmarshal(b, &m)
			wantOpError(t, name, resp.StatusCode, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
		// No credential, an operator's, an unsigned request.
		req, _ := http.NewRequest(http.MethodPost, env.URL+wire.PathSignals, bytes.NewReader([]byte(`{}`)))
		req.Header.Set("Content-Type", "application/json")
		resp, b := env.Raw(t, req)
		var m obj
		json.Unmarshal(b, &m)
		wantOpError(t, "no credential", resp.StatusCode, m, http.StatusUnauthorized, wire.CodeMissingCredential)
		st, m := op(t, env, http.MethodPost, wire.PathSignals, obj{})
		if st != http.StatusForbidden && st != http.StatusUnauthorized {
			t.Errorf("operator token on signals: %d %v", st, m)
		}
		// A wrong token for the node's signature.
		r := n.Request(t, http.MethodPost, wire.PathSignals, obj{})
		r.Header.Set("Authorization", "Bearer "+env.OperatorToken)
		resp, b = env.Raw(t, r)
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("signals signed by a node with an operator token: %d %s", resp.StatusCode, b)
		}

		// Drain and resume: scope, unknown worker, body.
		path := "/operator/workers/" + n.WorkerID + "/drain"
		jobsOnly, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
		before := env.Dump(t)
		st, m = opCall(t, env, jobsOnly, "POST", path, nil)
		wantOpError(t, "drain without operator:workers", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		st, m = opCall(t, env, n.Token, "POST", path, nil)
		wantOpError(t, "drain with the node's token", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		st, m = op(t, env, "POST", "/operator/workers/wrk_nobody/drain", nil)
		wantOpError(t, "drain an unknown worker", st, m, http.StatusNotFound, wire.CodeNotFound)
		st, m = op(t, env, "POST", "/operator/workers/wrk_nobody/resume", nil)
		wantOpError(t, "resume an unknown worker", st, m, http.StatusNotFound, wire.CodeNotFound)
		st, m = op(t, env, "POST", path, `{"x":`)
		wantOpError(t, "drain with malformed JSON", st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		st, m = op(t, env, "POST", path, `[]`)
		wantOpError(t, "drain with an array", st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		stateUnchanged(t, env, "refused drains", before)
		// Resume of a worker that does not drain: nothing changes.
		w := mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/resume", nil)
		if w["worker"].(obj)["drain"] != false || w["worker"].(obj)["drain_requested_at"] != nil {
			t.Errorf("resume of a worker not draining: %v", w)
		}
		stateUnchanged(t, env, "a resume that changes nothing", before)
	})
}
