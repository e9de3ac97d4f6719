package workerapi_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// An idle long-poll holds no database connection while it waits: more
// long-polls than the pool has connections all park, the pool shows none
// in use meanwhile, and a heartbeat is answered past them. A long-poll
// that kept its transaction (or a connection) open would leave the others
// queued for the pool, and AwaitLongPolls would time out.
func TestLongPollHoldsNoConnection(t *testing.T) {
	t.Parallel()
	const pool, polls = 2, 5 // PostgreSQL's Migrate needs two connections
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, d.Name, apitest.WithDBConfig(&bunstore.Config{MaxOpenConns: pool}))
			nodes := make([]*apitest.Node, polls)
			for i := range nodes {
				nodes[i] = env.NewNode(t, "node-"+string(rune('a'+i)))
				nodes[i].Register(t, studioGPU())
			}
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			for _, n := range nodes {
				req := n.Request(t, http.MethodPost, wire.PathLease, wire.LeaseRequest{MaxJobs: 1, WaitSeconds: wire.MaxWaitSeconds})
				req = req.WithContext(ctx)
				wg.Go(func() {
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				})
			}
			env.AwaitLongPolls(t, polls)
			if st := env.DB.Bun().DB.Stats(); st.InUse != 0 {
				t.Errorf("%d long-polls waiting hold %d of the pool's %d connections, want none", polls, st.InUse, st.OpenConnections)
			}
			st, b := post(t, nodes[0], wire.PathHeartbeat, wire.HeartbeatRequest{Status: "idle"})
			if st != http.StatusOK {
				t.Fatalf("heartbeat while %d long-polls wait: %d %s", polls, st, b)
			}
			if n := env.Server.LongPolls(); n != polls {
				t.Errorf("%d long-polls waiting after the heartbeat, want %d", n, polls)
			}
		})
	}
}
