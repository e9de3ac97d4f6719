package bunstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/uptrace/bun"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/receipts"
)

// queryLog is a bun query hook that keeps every query's text.
type queryLog struct {
	mu sync.Mutex
	qs []string
}

func (l *queryLog) BeforeQuery(ctx context.Context, e *bun.QueryEvent) context.Context {
	l.mu.Lock()
	l.qs = append(l.qs, e.Query)
	l.mu.Unlock()
	return ctx
}

func (l *queryLog) AfterQuery(context.Context, *bun.QueryEvent) {}

func (l *queryLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	qs := l.qs
	l.qs = nil
	return qs
}

// Open's SQLite connections keep temporary storage, the journals of
// savepoints among it, in memory (temp_store 2), each of them.
func TestSQLiteTempStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, testdb.SQLite(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conns := make([]*sql.Conn, 3)
	for i := range conns {
		if conns[i], err = db.bun.DB.Conn(ctx); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
		var n int
		if err := conns[i].QueryRowContext(ctx, "PRAGMA temp_store").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("connection %d: temp_store = %d, want 2 (MEMORY)", i, n)
		}
	}
}

// On SQLite a durable transaction runs with synchronous=FULL, and its
// connection goes back to the pool with the setting it had; the receipts
// sequencer's transaction is one.
func TestDurableTxSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, testdb.SQLite(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// One connection: the one the transaction ran on is the one read
	// after it.
	db.bun.SetMaxOpenConns(1)
	level := func(idb bun.IDB) int {
		t.Helper()
		var n int
		if err := idb.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := level(db.bun); n != 1 {
		t.Fatalf("synchronous = %d outside a durable transaction, want 1 (NORMAL)", n)
	}
	errBoom := errors.New("boom")
	for _, fail := range []bool{false, true} {
		var in int
		err := db.durableTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			in = level(tx)
			if fail {
				return errBoom
			}
			return nil
		})
		if fail != errors.Is(err, errBoom) {
			t.Fatalf("durableTx (fail %v) = %v", fail, err)
		}
		if in != sqliteSyncFull {
			t.Errorf("synchronous = %d in a durable transaction (fail %v), want 2 (FULL)", in, fail)
		}
		if n := level(db.bun); n != 1 {
			t.Errorf("synchronous = %d after a durable transaction (fail %v), want 1 (NORMAL) again", n, fail)
		}
	}

	ql := &queryLog{}
	hooked, err := New(db.bun.WithQueryHook(ql), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := hooked.ReceiptStore().Sequence(ctx, 10, func(receipts.Tree, []*receipts.Stored, tlog.HashReader) (*receipts.Batch, error) {
		return nil, errors.New("nothing is pending: never called")
	}); err != nil {
		t.Fatal(err)
	}
	qs := strings.Join(ql.take(), "\n")
	full, begin := strings.Index(qs, "PRAGMA synchronous = FULL"), strings.Index(qs, "BEGIN")
	if full < 0 || begin < full {
		t.Errorf("the sequencing transaction did not run under synchronous=FULL:\n%s", qs)
	}
	if n := level(db.bun); n != 1 {
		t.Errorf("synchronous = %d after sequencing, want 1 (NORMAL) again", n)
	}
}
