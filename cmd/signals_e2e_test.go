//go:build linux

package cmd

// End-to-end tests of signals in seconds (PROTOCOL.md §5.18): a real
// cmd/server and cmd/worker processes, with heartbeats every
// 30 s and leases of 10 minutes, so that only the worker's signals
// long-poll can bring a cancel, a ban or a retirement within 2 s.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// signalBound is how soon a signal must reach the worker's command.
const signalBound = 2 * time.Second

// silentConfig is a worker config whose one job type runs a command that
// prints nothing, notes every SIGTERM it gets in marker (and ignores it),
// and writes its pid to pidFile.
func silentConfig(t *testing.T, dir, marker, pidFile string) string {
	t.Helper()
	silent := script(t, dir, "silent.sh", `trap 'echo term >> `+marker+`' TERM
echo $$ > `+pidFile+`
while :; do sleep 0.1; done
`)
	return fmt.Sprintf(`
[[job]]
type = "cmd_silent"
command = [%q]
gpus = 0
kill_grace = "1s"
`, silent)
}

// waitSignaled waits up to signalBound for the command to note a SIGTERM
// in marker, and says how long it took.
func waitSignaled(t *testing.T, marker, after string) time.Duration {
	t.Helper()
	start := time.Now()
	waitfor.Within(t, signalBound, "the command's SIGTERM after the "+after, func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	return time.Since(start)
}

// signalsCluster starts a control plane advising heartbeats every 30 s,
// with leases of 10 minutes.
func signalsCluster(t *testing.T) *cluster {
	t.Helper()
	c := newCluster(t, "-heartbeat-interval", "30s", "-lease-ttl", "10m", "-accept-timeout", "60s")
	c.activate()
	return c
}

// startSilentWorker starts a worker for cmd_silent with 30 s heartbeats,
// runs one job on it, and returns the worker, its id, the job's id and
// the marker file its command writes on SIGTERM.
func startSilentWorker(c *cluster, node string) (w *proc, wid, jobID, marker string) {
	c.t.Helper()
	dir := c.t.TempDir()
	marker, pidFile := filepath.Join(dir, "term"), filepath.Join(dir, "pid")
	w = c.startCommandWorker(node, silentConfig(c.t, dir, marker, pidFile),
		"-gpu", "rtx-4090:24576", "-heartbeat-interval", "30s", "-wait-seconds", "20")
	wid = c.workerID(node)
	d := c.dispatchGPUs("cmd_silent", 0)
	readPids(c, pidFile, 1)
	waitfor.Within(c.t, jobTimeout, "the job running", func() bool { return c.job(d.Job.ID).Job.State == "running" })
	return w, wid, d.Job.ID, marker
}

// TestE2ESignals checks that, with heartbeats every 30 s, an operator's cancel sends
// SIGTERM to a silent command within 2 s; a ban and a retirement stop the
// worker and its command within 2 s; a worker banned while its lease
// long-poll waits is granted nothing. Each case has a control plane of
// its own.
func TestE2ESignals(t *testing.T) {
	t.Parallel()
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		c := signalsCluster(t)
		_, _, job, marker := startSilentWorker(c, "sig-cancel")
		start := time.Now()
		c.call("POST", "/operator/jobs/"+job+"/cancel", nil, nil)
		t.Logf("SIGTERM %v after the cancel", waitSignaled(t, marker, "cancel"))
		c.waitDone(job, "canceled")
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("the job ended %v after the cancel", took)
		}
	})

	for _, action := range []string{"ban", "retire"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			c := signalsCluster(t)
			w, wid, job, marker := startSilentWorker(c, "sig-"+action)
			c.call("POST", "/operator/workers/"+wid+"/"+action, wire.ReasonRequest{Reason: "e2e"}, nil)
			waitSignaled(t, marker, action)
			select {
			case <-w.done:
			case <-time.After(startTimeout):
				t.Fatalf("the worker still runs after the %s", action)
			}
			if !strings.Contains(w.stderr.String(), "worker_banned") && !strings.Contains(w.stderr.String(), "token_revoked") {
				t.Errorf("the worker's log does not say it was refused:\n%s", w.stderr.String())
			}
			if action == "retire" {
				if jd := c.job(job); jd.Job.State != "queued" {
					t.Errorf("after the retirement the job is %s, want queued", jd.Job.State)
				}
			}
		})
	}

	t.Run("ban during a waiting lease long-poll", func(t *testing.T) {
		t.Parallel()
		c := signalsCluster(t)
		dir := t.TempDir()
		marker, pidFile := filepath.Join(dir, "term"), filepath.Join(dir, "pid")
		w := c.startCommandWorker("sig-idle", silentConfig(t, dir, marker, pidFile),
			"-gpu", "rtx-4090:24576", "-heartbeat-interval", "30s", "-wait-seconds", "2", "-v")
		wid := c.workerID("sig-idle")
		// Its first lease long-poll waited its 2 s for a job nobody
		// dispatched, and the second is open (the Runner logs each at
		// DEBUG as it sends it).
		waitfor.Within(t, startTimeout, "the worker's second lease long-poll", func() bool {
			return strings.Count(w.stderr.String(), "lease long-poll") >= 2
		})
		c.call("POST", "/operator/workers/"+wid+"/ban", wire.ReasonRequest{Reason: "e2e"}, nil)
		d := c.dispatchGPUs("cmd_silent", 0)
		select {
		case <-w.done:
		case <-time.After(startTimeout):
			t.Fatal("the banned worker still runs")
		}
		if _, err := os.Stat(pidFile); err == nil {
			t.Error("the banned worker ran the job")
		}
		if jd := c.job(d.Job.ID); jd.Job.State != "queued" || jd.Job.WorkerID != nil {
			t.Errorf("the job after the ban: %s (worker %v), want queued", jd.Job.State, jd.Job.WorkerID)
		}
	})
}
