//go:build linux

package cmd

// End-to-end tests of what a worker crash does to its commands (issue
// 25, docs/COMMANDS.md §5): real cmd/server and cmd/worker
// processes, real commands that ignore SIGTERM and print nothing.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/command"
	"github.com/nodelane/nodelane/internal/waitfor"
)

// stubbornScript ignores SIGTERM and prints nothing; so does the
// grandchild it starts (and, with escape, a process that leaves the
// group with setsid). It writes their pids to $NODELANE_OUTPUT_DIR/pids.
func stubbornScript(escape bool) string {
	s := `trap '' TERM
sh -c 'trap "" TERM; exec sleep 1000' &
echo $$ > "$NODELANE_OUTPUT_DIR/pids.tmp"; echo $! >> "$NODELANE_OUTPUT_DIR/pids.tmp"
`
	if escape {
		s += `setsid sh -c 'trap "" TERM; echo $$ >> "$NODELANE_OUTPUT_DIR/pids.tmp"; exec sleep 1000' &
while [ $(wc -l < "$NODELANE_OUTPUT_DIR/pids.tmp") -lt 3 ]; do sleep 0.01; done
`
	}
	return s + `mv "$NODELANE_OUTPUT_DIR/pids.tmp" "$NODELANE_OUTPUT_DIR/pids"
while :; do sleep 1; done
`
}

// jobPIDs waits for a run of node's worker to write n pids and returns
// them; the test's cleanup kills those left.
func (c *cluster) jobPIDs(node string, n int) []int {
	c.t.Helper()
	var out []int
	waitfor.Within(c.t, startTimeout, fmt.Sprintf("%d pids of the job of %s", n, node), func() bool {
		files, _ := filepath.Glob(filepath.Join(c.dir, "work-"+node, "runs", "*", "output", "pids"))
		if len(files) == 0 {
			return false
		}
		b, _ := os.ReadFile(files[0])
		out = out[:0]
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				out = append(out, p)
			}
		}
		return len(out) >= n
	})
	c.t.Cleanup(func() {
		for _, p := range out {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	return out
}

// procRunning reports whether pid runs (exists and is no zombie).
func procRunning(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z' && b[i+2] != 'X'
}

// waitAllGone waits until no pid runs, failing the test after within,
// and says how long it took.
func waitAllGone(t *testing.T, pids []int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitfor.Within(t, within, fmt.Sprintf("the processes %v of the job to end after the worker died", pids), func() bool {
		for _, p := range pids {
			if procRunning(p) {
				return false
			}
		}
		return true
	})
	return time.Since(start)
}

// TestE2EWorkerCrashLeavesNoOrphans covers a worker SIGKILLed mid-job, not
// restarted: every process of the job (a command and a grandchild that
// ignore SIGTERM and print nothing, and a process that left the group)
// is gone within kill_grace + 2 s. And a worker SIGKILLed together with
// its command shim: its next start kills the leftovers before it
// registers.
func TestE2EWorkerCrashLeavesNoOrphans(t *testing.T) {
	t.Parallel()
	args := []string{"-gpu", "rtx-4090:24576"}

	t.Run("SIGKILL, no restart", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t)
		c.activate()
		const grace = 2 * time.Second
		escape := script(t, c.dir, "escape.sh", stubbornScript(true))
		w := c.startCommandWorker("crash-a", fmt.Sprintf("[[job]]\ntype = \"stubborn_a\"\ncommand = [%q]\ngpus = 0\nkill_grace = %q\n", escape, grace.String()), args...)
		c.workerID("crash-a")
		c.dispatchGPUs("stubborn_a", 1)
		pids := c.jobPIDs("crash-a", 3)
		for _, p := range pids {
			if !procRunning(p) {
				t.Fatalf("process %d of the job is not running: the test tests nothing", p)
			}
		}
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		took := waitAllGone(t, pids, grace+2*time.Second)
		t.Logf("the job's processes were gone %v after the worker's SIGKILL (kill_grace %v)", took, grace)
		if took < grace-500*time.Millisecond {
			t.Errorf("the processes were gone after %v, before kill_grace: no SIGTERM first?", took)
		}
	})

	t.Run("SIGKILL with the shim, restart", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t)
		c.activate()
		plain := script(t, c.dir, "plain.sh", stubbornScript(false))
		// kill_grace is long: only the restart can end the job's processes.
		cfg := fmt.Sprintf("[[job]]\ntype = \"stubborn_b\"\ncommand = [%q]\ngpus = 0\nkill_grace = \"30s\"\n", plain)
		w := c.startCommandWorker("crash-b", cfg, args...)
		c.workerID("crash-b")
		c.dispatchGPUs("stubborn_b", 1)
		pids := c.jobPIDs("crash-b", 2)
		b, err := os.ReadFile(filepath.Join(c.dir, "work-crash-b", command.StateFile))
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Runs []command.RunRecord }
		if err := json.Unmarshal(b, &st); err != nil || len(st.Runs) != 1 || st.Runs[0].ShimPID == 0 || st.Runs[0].PGID != pids[0] {
			t.Fatalf("state file %s: %v", b, err)
		}
		// The worker first (the shim then sends SIGTERM, which the job
		// ignores, and waits its kill_grace), then the shim: had the shim
		// died first, the worker would have killed the group itself.
		shim := st.Runs[0].ShimPID
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		w.kill()
		for _, p := range pids {
			if !procRunning(p) {
				t.Fatalf("process %d ended with the worker and its shim: the test tests nothing", p)
			}
		}
		w2 := c.startCommandWorker("crash-b", cfg, args...)
		const killed = "killed the processes a previous run of the worker left behind"
		waitfor.Within(c.t, startTimeout, "the restarted worker's log line", func() bool {
			return strings.Contains(w2.stderr.String(), killed) || w2.exited()
		})
		// KillLeftovers logs once they are gone, before the worker starts.
		for _, p := range pids {
			if procRunning(p) {
				t.Errorf("process %d still runs when the worker says it killed it", p)
			}
		}
		log := w2.stderr.String()
		at, starting := strings.Index(log, killed), strings.Index(log, `msg="worker starting"`)
		if at < 0 {
			t.Fatalf("the restarted worker did not say it killed the leftovers:\n%s", log)
		}
		if starting >= 0 && starting < at {
			t.Errorf("the leftovers were not killed before the worker started:\n%s", log)
		}
		line := log[at:]
		line = line[:strings.IndexByte(line, '\n')]
		for _, want := range []string{"pgid=" + strconv.Itoa(pids[0]), "shim_pid=" + strconv.Itoa(shim), strconv.Itoa(pids[1])} {
			if !strings.Contains(line, want) {
				t.Errorf("the log line %q lacks %s", line, want)
			}
		}
	})
}
