package workerapi_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// One rule per bound, in the server and in PROTOCOL.md alike (issue 29):
// before, lease clamped a wait_seconds that §5.14 said was refused, and
// register kept a tag that requirements.tags refuses.

// One rule for wait_seconds (PROTOCOL.md §5.3, §5.14, §5.18): 0 to 60,
// anything else refused with 400, on lease and on signals alike.
func TestWaitSecondsBounds(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		f := setup(t, dialect)
		env := f.env
		for _, w := range []int{-1, wire.MaxWaitSeconds + 1} {
			t.Run(fmt.Sprint(w), func(t *testing.T) {
				dispatchJob(t, env, obj{"job_type": "status_check"})
				before := env.Dump(t)
				st, b := post(t, f.node, wire.PathLease, obj{"supported_job_types": []string{"status_check"}, "wait_seconds": w})
				refused(t, env, before, "lease", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "wait_seconds", fmt.Sprint(wire.MaxWaitSeconds))
				st, b = post(t, f.node, wire.PathSignals, obj{"wait_seconds": w, "current_jobs": []string{"job_gone"}})
				refused(t, env, before, "signals", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "wait_seconds", fmt.Sprint(wire.MaxSignalsWaitSeconds))
				// At the bound, each is served: a queued job, a lost
				// one, answer at once.
				lr := nodeCall[wire.LeaseResponse](t, f.node, "lease", wire.PathLease, obj{"supported_job_types": []string{"status_check"}, "wait_seconds": wire.MaxWaitSeconds}, http.StatusOK)
				if len(lr.Leases) != 1 {
					t.Errorf("lease at wait_seconds %d: %+v", wire.MaxWaitSeconds, lr)
				}
				sr := nodeCall[wire.SignalsResponse](t, f.node, "signals", wire.PathSignals, obj{"wait_seconds": wire.MaxSignalsWaitSeconds, "current_jobs": []string{"job_gone"}}, http.StatusOK)
				if len(sr.LostJobs) != 1 {
					t.Errorf("signals at wait_seconds %d: %+v", wire.MaxSignalsWaitSeconds, sr)
				}
			})
		}
	})
}

// register and start refuse a tag that requirements.tags refuses: one
// rule, so that every registered tag can be asked for.
func TestRegisterTagRule(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		f := setup(t, dialect)
		env := f.env
		for _, tag := range []string{"gpu pool", "", "a\u00a0b"} {
			t.Run(fmt.Sprintf("%q", tag), func(t *testing.T) {
				before := env.Dump(t)
				st, b := env.Operator(t, http.MethodPost, "/operator/jobs", obj{"job_type": "status_check", "requirements": obj{"tags": []string{tag}}})
				refused(t, env, before, "dispatch", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "requirements.tags[0]")

				n := env.NewNode(t, "tagged-node")
				r := registerRequest()
				r.NodeID, r.PublicKey, r.Tags = n.NodeID, n.PublicKey, []string{"lab", tag}
				req := n.Request(t, http.MethodPost, wire.PathRegister, r)
				req.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
				resp, b := n.Raw(t, req)
				refused(t, env, before, "register", resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest, "tags[1]")

				st, b = post(t, f.node, wire.PathStart, wire.StartRequest{Name: "n", Hostname: "h", Role: "r", Version: "v", Tags: []string{tag}, CurrentJobs: &[]string{}})
				refused(t, env, before, "start", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "tags[0]")
			})
		}
	})
}
