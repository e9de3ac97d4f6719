package main

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nodelane/nodelane/internal/testdb"
)

// TestParseStat reads utime and stime after a command name that holds
// spaces and parentheses, and refuses a line cut short.
func TestParseStat(t *testing.T) {
	t.Parallel()
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 1 0 100 0 0\n"
	d, err := parseStat(4242, []byte(line))
	if err != nil || d != 3250*time.Millisecond {
		t.Errorf("parseStat = %v, %v; want 3.25s (325 ticks, children not counted)", d, err)
	}
	for _, bad := range []string{"4242 no name S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 2x0 75\n"} {
		if _, err := parseStat(4242, []byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

// TestProcCPU reads this process's CPU time, which grows while it
// works, and fails for a process that does not exist.
func TestProcCPU(t *testing.T) {
	t.Parallel()
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Work until the clock ticks past two of USER_HZ's ticks.
	x := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		for i := range 1 << 20 {
			x += i
		}
		if d, err := procCPU(os.Getpid()); err != nil || d-before >= 2*time.Second/userHZ {
			break
		}
	}
	after, err := procCPU(os.Getpid())
	if err != nil || after-before < 2*time.Second/userHZ {
		t.Errorf("CPU time %v then %v (%v, x %d): it did not grow", before, after, err, x)
	}
	if _, err := procsCPU([]int{os.Getpid(), 1 << 30}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("procsCPU of a process that does not exist: %v", err)
	}
}

// TestBackendCPU measures the backends of a PostgreSQL database: a query
// that burns CPU on one of them is counted, the backends it excludes are
// not.
func TestBackendCPU(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t)
	ctx := t.Context()
	conns := make([]*pgx.Conn, 3) // the sampler's, a backend excluded, a backend counted
	for i := range conns {
		c, err := pgx.Connect(ctx, db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		conns[i] = c
	}
	burn := func(c *pgx.Conn) time.Duration {
		start, err := procCPU(int(c.PgConn().PID()))
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := c.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 3000000) g WHERE g % 7 = 0`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		end, err := procCPU(int(c.PgConn().PID()))
		if err != nil {
			t.Fatal(err)
		}
		return end - start
	}
	b := newBackendCPU(ctx, conns[0], []int{int(conns[0].PgConn().PID()), int(conns[1].PgConn().PID())}, 50*time.Millisecond)
	if b.unavailable != nil {
		t.Fatalf("PostgreSQL on loopback: %v", b.unavailable)
	}
	b.start(ctx)
	excluded := burn(conns[1])
	counted := burn(conns[2])
	got, backends, err := b.finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The test database is shared with the other tests, each in a schema
	// of its own: their backends are counted too, so the measure is at
	// least what the counted backend used, and the backends those seen.
	b.mu.Lock()
	_, sawCounted := b.last[int(conns[2].PgConn().PID())]
	_, sawSampler := b.last[int(conns[0].PgConn().PID())]
	_, sawExcluded := b.last[int(conns[1].PgConn().PID())]
	seen := len(b.last)
	b.mu.Unlock()
	if !sawCounted || sawSampler || sawExcluded || backends != seen {
		t.Errorf("backends seen: the counted one %v, the sampler %v, the excluded one %v; %d reported of %d", sawCounted, sawSampler, sawExcluded, backends, seen)
	}
	if counted < 5*time.Second/userHZ || got < counted {
		t.Errorf("measured %v; the counted backend used %v (the excluded one %v)", got, counted, excluded)
	}
}
