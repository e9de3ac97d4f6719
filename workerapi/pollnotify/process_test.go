package pollnotify_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/workerapi/pollnotify"
)

// childEnv names the SQLite DSN a re-executed test binary subscribes on
// (TestCrossProcess).
const childEnv = "POLLNOTIFY_TEST_CHILD_DB"

// TestCrossProcess runs a Notifier in another process, a re-executed
// test binary on the same SQLite file, with the real clock: it subscribes,
// prints "ready", and exits 0 once woken. This process commits a Notify
// in a transaction and waits for the child to exit, bound only by the
// test's deadline.
func TestCrossProcess(t *testing.T) {
	if dsn := os.Getenv(childEnv); dsn != "" {
		child(t, dsn)
		return
	}
	t.Parallel()
	d := testdb.SQLite(t)
	db := open(t, d)
	c := counter(t, db)

	ctx := t.Context()
	args := []string{"-test.run=^TestCrossProcess$", "-test.count=1"}
	if deadline, ok := t.Deadline(); ok {
		// Kill the child a little before the test binary's own timeout,
		// so that the failure names it.
		left := time.Until(deadline)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-left/10))
		defer cancel()
		args = append(args, "-test.timeout="+left.String())
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+d.DSN)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	var seen []string
	ready := false
	for !ready && lines.Scan() {
		seen = append(seen, lines.Text())
		ready = lines.Text() == "ready"
	}
	if !ready {
		err := cmd.Wait()
		t.Fatalf("the child ended (%v) without printing ready; output:\n%s", err, strings.Join(seen, "\n"))
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Bump(withTx(ctx, tx)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		seen = append(seen, lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			t.Fatalf("the child was not woken before the test's deadline (%v); output:\n%s", err, strings.Join(seen, "\n"))
		}
		t.Fatalf("the child: %v; output:\n%s", err, strings.Join(seen, "\n"))
	}
}

// child is TestCrossProcess in the re-executed binary.
func child(t *testing.T, dsn string) {
	db := open(t, testdb.DB{Dialect: "sqlite", DSN: dsn})
	c, err := pollnotify.NewSQLCounter(db, "", txOf)
	if err != nil {
		t.Fatal(err)
	}
	n, err := pollnotify.New(t.Context(), c, &pollnotify.Config{Interval: pollnotify.MinInterval})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ch, cancel := n.Subscribe()
	defer cancel()
	fmt.Println("ready")
	<-ch
}
