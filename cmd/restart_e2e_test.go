//go:build linux

package cmd

// The acceptance test of issue 25's first promise with real processes: a
// worker SIGKILLed mid-job and restarted at once with the same identity
// never runs the job a second time beside the first attempt's processes,
// the server requeues the job at the restart (not at the lease's expiry),
// and the job completes exactly once. On SQLite and on PostgreSQL.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// restartScript is a job command. Its first attempt ignores SIGTERM,
// prints nothing and starts a grandchild that does the same, writing both
// pids to DIR/first.pids. Any later attempt writes to DIR/overlap the
// first attempt's pids that still run (so an empty file says none did),
// then exits 0.
func restartScript(dir string) string {
	return fmt.Sprintf(`d=%q
if [ "$NODELANE_ATTEMPT" = 1 ]; then
	trap '' TERM
	sh -c 'trap "" TERM; exec sleep 1000' &
	echo $$ > "$d/first.tmp"; echo $! >> "$d/first.tmp"
	mv "$d/first.tmp" "$d/first.pids"
	while :; do sleep 1; done
fi
: > "$d/overlap.tmp"
for p in $(cat "$d/first.pids"); do
	# One read of the state: a zombie reaped between two looks is gone,
	# not running.
	s=$(grep '^State:' "/proc/$p/status" 2>/dev/null) || continue
	case "$s" in *Z*|*X*) ;; *) echo "$p" >> "$d/overlap.tmp";; esac
done
mv "$d/overlap.tmp" "$d/overlap"
`, dir)
}

// TestE2EWorkerRestartRunsJobOnce checks that a worker SIGKILLed mid-job
// and restarted at once never runs the job beside the first attempt's
// processes, that the restart (not the lease's expiry) requeues the job,
// and that the job completes exactly once.
func TestE2EWorkerRestartRunsJobOnce(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := d.New(t)
			// A 10-minute lease and a 30 s heartbeat, as in production: neither
			// the lease's expiry nor the offline check can requeue the job
			// within the test's bound, only the restart's reconciliation.
			c := newCluster(t, "-db", db.DSN, "-lease-ttl", "600s", "-accept-timeout", "60s", "-heartbeat-interval", "30s")
			c.activate()
			marks := filepath.Join(c.dir, "marks")
			if err := os.Mkdir(marks, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := script(t, c.dir, "restart.sh", restartScript(marks))
			// kill_grace is long: the dead worker's shim would wait that long
			// before its SIGKILL, so only the restart's cleanup (or nothing)
			// ends the first attempt's processes in time.
			cfg := fmt.Sprintf("[[job]]\ntype = \"restartable\"\ncommand = [%q]\ngpus = 0\nkill_grace = \"60s\"\n", cmd)
			args := []string{"-gpu", "rtx-4090:24576"}

			w := c.startCommandWorker("restart-1", cfg, args...)
			wid := c.workerID("restart-1")
			disp := c.dispatchGPUs("restartable", 1)
			first := readPids(c, filepath.Join(marks, "first.pids"), 2)
			for _, p := range first {
				if !running(p) {
					t.Fatalf("process %d of the first attempt is not running: the test tests nothing", p)
				}
			}
			if jd := c.job(disp.Job.ID); jd.Job.State != "running" || jd.Job.Attempt != 1 {
				t.Fatalf("before the crash the job is %s, attempt %d; want running, attempt 1", jd.Job.State, jd.Job.Attempt)
			}

			if err := w.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			w.kill()
			restarted := time.Now()
			c.startCommandWorker("restart-1", cfg, args...)

			// Requeued by the restart within 15 s, long before the lease's
			// 10 minutes or the 90 s offline bound.
			waitfor.Within(c.t, 15*time.Second, "the job requeued by the restart", func() bool {
				var jd wire.JobDetailResponse
				return c.try("GET", "/operator/jobs/"+disp.Job.ID, nil, &jd) == nil &&
					jd.Job.LastError != nil && jd.Job.LastError.Code == "worker_restarted"
			})
			t.Logf("requeued %v after the restart", time.Since(restarted).Round(time.Millisecond))

			jd := c.waitDone(disp.Job.ID, "succeeded")
			if jd.Job.Attempt != 2 {
				t.Errorf("the job succeeded on attempt %d, want 2 (the first was accepted, so its end used it)", jd.Job.Attempt)
			}
			if jd.Job.WorkerID == nil || *jd.Job.WorkerID != wid {
				t.Errorf("the job was finished by %v, want the restarted worker %s", jd.Job.WorkerID, wid)
			}
			overlap, err := os.ReadFile(filepath.Join(marks, "overlap"))
			if err != nil {
				t.Fatalf("the second attempt did not check the first's processes: %v", err)
			}
			if s := strings.TrimSpace(string(overlap)); s != "" {
				t.Errorf("the second attempt started while the first attempt's processes %s still ran", s)
			}
			for _, p := range first {
				if running(p) {
					t.Errorf("process %d of the first attempt still runs", p)
				}
			}
			// Exactly one job_completed receipt, once it is sequenced.
			c.checkSucceeded(jd)
			// The first attempt's end is a receipt too, sequenced before
			// the completion's: exactly one, naming the restart, its GPU
			// time and that it was not charged.
			failed := c.receiptsOf(receipts.KindJobFailed, disp.Job.ID)
			if len(failed) != 1 {
				t.Fatalf("%d job_failed receipts, want exactly 1 (the first attempt's end)", len(failed))
			}
			if f := failed[0]; f.ErrorCode != "worker_restarted" || f.Attempt != 1 || f.Outcome != receipts.OutcomeRequeued ||
				f.Charged != receipts.ChargedNo || f.ActualMS <= 0 {
				t.Errorf("the first attempt's receipt: error_code %q attempt %d outcome %q charged %q actual_ms %d; want worker_restarted, 1, requeued, no, > 0",
					f.ErrorCode, f.Attempt, f.Outcome, f.Charged, f.ActualMS)
			}
			c.verifyReceipt(failed[0].ID)
			c.checkNoTokensLogged()
		})
	}
}
