package workerapi_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// gatedTx holds the transactions begun while it is closed until it
// opens, each in the turn it took.
type gatedTx struct {
	workerapi.Transactor
	mu      sync.Mutex
	closed  chan struct{} // nil: open
	entered chan struct{}
}

func (g *gatedTx) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed != nil {
		g.entered <- struct{}{}
		<-closed
	}
	return g.Transactor.InTx(ctx, fn)
}

// A request whose credential the store keeps in memory verifies it
// without taking a turn: with the one turn held by a signed request's
// transaction, an operator's read, whose credential was read before, is
// answered. Taking a turn for it, it would wait for that transaction.
func TestVerifyFromMemoryTakesNoTurn(t *testing.T) {
	t.Parallel()
	gate := &gatedTx{entered: make(chan struct{}, 1)}
	env := apitest.New(t, "sqlite",
		apitest.WithConfig(func(c *workerapi.Config) { c.MaxActiveRequests = 1 }),
		apitest.WithDBConfig(&bunstore.Config{CacheTTL: time.Hour}),
		apitest.WithStores(func(st workerapi.Stores) workerapi.Stores {
			gate.Transactor = st.Tx
			st.Tx = gate
			return st
		}))
	n := env.NewNode(t, "n")
	n.Register(t, registerRequest())
	if st, b := env.Operator(t, http.MethodGet, "/operator/workers", nil); st != http.StatusOK {
		t.Fatalf("list workers: %d %s", st, b)
	}

	closed := make(chan struct{})
	gate.mu.Lock()
	gate.closed = closed
	gate.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() {
		if st, b := post(t, n, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
			t.Errorf("heartbeat: %d %s", st, b)
		}
	})
	<-gate.entered // the heartbeat holds the one turn
	gate.mu.Lock()
	gate.closed = nil
	gate.mu.Unlock()
	answered := make(chan int, 1)
	go func() {
		st, b := env.Operator(t, http.MethodGet, "/operator/workers", nil)
		if st != http.StatusOK {
			t.Errorf("list workers while the one turn is held: %d %s", st, b)
		}
		answered <- st
	}()
	hang := time.NewTimer(30 * time.Second) // a guard against a hang, not a measure
	defer hang.Stop()
	select {
	case <-answered:
		close(closed)
	case <-hang.C:
		t.Error("an operator's read whose credential is in memory waited for the turn a transaction held")
		close(closed)
		<-answered
	}
	wg.Wait()
}
