package workerapi_test

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A node over its quota of live nonces gets 429 rate_limited with
// Retry-After, and its request changes nothing; other nodes go on.
func TestNonceQuotaRateLimited(t *testing.T) {
	t.Parallel()
	const quota = 3
	env := apitest.New(t, "sqlite", apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
		s.Nonces = s.Tx.(*bunstore.DB).NonceStore(&bunstore.NonceConfig{PerNode: quota})
		return s
	}))
	busy, other := env.NewNode(t, "busy"), env.NewNode(t, "other")
	busy.Register(t, studioGPU()) // nonce 1
	other.Register(t, studioGPU())
	hb := wire.HeartbeatRequest{Status: "idle", Metrics: []byte(`{"n":1}`)}
	for i := 2; i <= quota; i++ {
		nodeCall[wire.HeartbeatResponse](t, busy, "heartbeat within the quota", "/workers/heartbeat", hb, http.StatusOK)
	}
	before := env.Dump(t)
	resp, body := busy.Do(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "busy", Metrics: []byte(`{"n":2}`)})
	wantCode(t, "over the quota", resp.StatusCode, body, http.StatusTooManyRequests, wire.CodeRateLimited)
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	if d := cmp.Diff(before, env.Dump(t)); d != "" {
		t.Fatalf("a rate-limited request changed state (-before +after):\n%s", d)
	}
	nodeCall[wire.HeartbeatResponse](t, other, "another node", "/workers/heartbeat", hb, http.StatusOK)
}
