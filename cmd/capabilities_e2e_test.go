//go:build linux

package cmd

// End-to-end tests of issue 25's "capabilities follow the box": a real
// cmd/worker restarted with the same identity and other job types,
// tags or -max-jobs, against a real cmd/server on SQLite and on
// PostgreSQL, over loopback.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// capsHeartbeat is the heartbeat interval the control plane advises in
// these tests: a restarted worker's new job type must run within it (plus
// capsSlack for two slow shared cores), not at a later heartbeat.
const (
	capsHeartbeat = 5 * time.Second
	capsSlack     = 5 * time.Second
)

// capsCluster starts a control plane on a fresh database of dialect d
// advising capsHeartbeat, with more server flags.
func capsCluster(t *testing.T, d testdb.Dialect, args ...string) *cluster {
	t.Helper()
	db := d.New(t) // before the server, so that its cleanup runs after the server is gone
	return newCluster(t, append([]string{"-db", db.DSN, "-heartbeat-interval", capsHeartbeat.String()}, args...)...)
}

// capsConfig is a worker -config whose job types each run script, with
// the given top-level tags.
func capsConfig(script string, tags []string, types ...string) string {
	var b strings.Builder
	q, _ := json.Marshal(tags)
	fmt.Fprintf(&b, "tags = %s\n", q)
	for _, typ := range types {
		fmt.Fprintf(&b, "\n[[job]]\ntype = %q\ncommand = [%q]\ngpus = 1\n", typ, script)
	}
	return b.String()
}

// capsStop sends SIGTERM and waits for the worker to exit 0.
func capsStop(t *testing.T, w *proc) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
		if !w.cmd.ProcessState.Success() {
			t.Fatalf("%s exited %v after SIGTERM", w.name, w.cmd.ProcessState)
		}
	case <-time.After(startTimeout):
		t.Fatalf("%s did not exit after SIGTERM", w.name)
	}
}

// capsDispatch queues a one-GPU job of jobType that requires tags.
func (c *cluster) capsDispatch(jobType string, tags ...string) wire.DispatchResponse {
	c.t.Helper()
	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: jobType, Payload: json.RawMessage(`{}`),
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 1, Tags: tags}, MaxAttempts: 2}, &d)
	return d
}

// capsDispatchHold queues a cap_hold job, which needs no GPU.
func (c *cluster) capsDispatchHold() wire.DispatchResponse {
	c.t.Helper()
	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: "cap_hold", Payload: json.RawMessage(`{}`), MaxAttempts: 2}, &d)
	return d
}

// capsView is the operator's view of worker id.
func (c *cluster) capsView(id string) wire.WorkerView {
	c.t.Helper()
	var wd wire.WorkerDetailResponse
	c.call("GET", "/operator/workers/"+id, nil, &wd)
	return wd.Worker
}

// capsReceipts decodes the sequenced receipts of kind about worker id.
func (c *cluster) capsReceipts(kind receipts.Kind, id string) []*receipts.Receipt {
	c.t.Helper()
	return c.receiptsWhere(kind, func(r *receipts.Receipt) bool { return r.WorkerID == id })
}

// TestE2ECapabilities checks issue 25 item 4 with real processes, on SQLite and
// PostgreSQL. A worker restarted with the same identity brings its new job
// types, tags and -max-jobs: they are recorded at once with a
// worker_updated receipt (old and new), leasable within a heartbeat;
// under -approve-nodes a widening waits for the operator while what was
// approved keeps working; and a lost identity is refused with a message
// that says how to fix it.
func TestE2ECapabilities(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("restart with a new job type, tag and max_jobs", func(t *testing.T) { t.Parallel(); capsRestart(t, d) })
			t.Run("a widening waits for approval", func(t *testing.T) { t.Parallel(); capsApproval(t, d) })
			t.Run("a lost identity is refused", func(t *testing.T) { t.Parallel(); capsLostIdentity(t, d) })
		})
	}
}

func capsRestart(t *testing.T, d testdb.Dialect) {
	c := capsCluster(t, d)
	c.activate()
	dir := t.TempDir()
	ok := script(t, dir, "ok.sh", "echo done\n")
	// hold runs until the test creates release.
	release := filepath.Join(dir, "release")
	hold := script(t, dir, "hold.sh", "while [ ! -e "+release+" ]; do sleep 0.1; done\necho released\n")
	const node = "caps-node"
	w := c.startCommandWorker(node, capsConfig(ok, []string{"e2e"}, "cap_a"), "-gpu", "rtx-4090:24576", "-max-jobs", "1")
	wid := c.workerID(node)
	c.checkSucceeded(c.waitDone(c.capsDispatch("cap_a").Job.ID, "succeeded"))

	// Before the restart, the new type runs nowhere.
	if d := c.capsDispatch("cap_b"); d.Leasable || !strings.Contains(d.Reason, "cap_b") {
		t.Fatalf("cap_b before the restart: leasable %t, reason %q", d.Leasable, d.Reason)
	} else {
		c.call("POST", "/operator/jobs/"+d.Job.ID+"/cancel", map[string]any{}, nil)
	}
	capsStop(t, w)

	// The same identity, a config with another [[job]], a new -tag and
	// another -max-jobs.
	restartedAt := time.Now()
	w = c.startCommandWorker(node, capsConfig(ok, []string{"e2e"}, "cap_a", "cap_b")+
		fmt.Sprintf("\n[[job]]\ntype = \"cap_hold\"\ncommand = [%q]\ngpus = 0\n", hold),
		"-gpu", "rtx-4090:24576", "-tag", "fast", "-max-jobs", "2")
	deadline := restartedAt.Add(capsHeartbeat + capsSlack)
	waitfor.Within(c.t, time.Until(deadline), "the restarted worker's job types recorded", func() bool {
		var wd wire.WorkerDetailResponse
		return c.try("GET", "/operator/workers/"+wid, nil, &wd) == nil && slices.Contains(wd.Worker.Capabilities.JobTypes, "cap_b")
	})
	// A job of the new type that needs the new tag, dispatched right
	// after: leasable, and done within a heartbeat of the restart.
	nd := c.capsDispatch("cap_b", "fast")
	if !nd.Leasable {
		t.Fatalf("cap_b (tag fast) after the restart is not leasable: %s", nd.Reason)
	}
	var jd wire.JobDetailResponse
	waitfor.Within(c.t, time.Until(deadline), "the new type's job to succeed within a heartbeat of the restart", func() bool {
		return c.try("GET", "/operator/jobs/"+nd.Job.ID, nil, &jd) == nil && jd.Job.State == "succeeded"
	})
	t.Logf("the new type's job succeeded %v after the restart", time.Since(restartedAt).Round(time.Millisecond))
	if jd.Job.WorkerID == nil || *jd.Job.WorkerID != wid {
		t.Errorf("cap_b ran on %v, want the restarted worker %s (the same worker, no new node)", jd.Job.WorkerID, wid)
	}
	c.checkSucceeded(jd)

	// The operator's view shows what the box runs now.
	v := c.capsView(wid)
	if got := strings.Join(v.Capabilities.JobTypes, " "); got != "cap_a cap_b cap_hold" {
		t.Errorf("worker view job types %q, want cap_a cap_b cap_hold", got)
	}
	if got := strings.Join(v.Tags, " "); got != "e2e fast" {
		t.Errorf("worker view tags %q, want e2e fast", got)
	}
	if v.GovernorLimits.MaxJobs != 2 {
		t.Errorf("worker view max_jobs %d, want 2", v.GovernorLimits.MaxJobs)
	}
	if len(v.PendingJobTypes)+len(v.PendingTags) != 0 {
		t.Errorf("without -approve-nodes nothing is pending: %v %v", v.PendingJobTypes, v.PendingTags)
	}

	// Exactly one worker_updated receipt, naming old and new values, that
	// verifies offline.
	var ups []*receipts.Receipt
	waitfor.Within(c.t, jobTimeout, "the worker_updated receipt sequenced", func() bool {
		ups = c.capsReceipts(receipts.KindWorkerUpdated, wid)
		return len(ups) > 0
	})
	if len(ups) != 1 {
		t.Fatalf("%d worker_updated receipts, want 1 (one restart)", len(ups))
	}
	r := c.verifyReceipt(ups[0].ID)
	if r.Kind != receipts.KindWorkerUpdated || r.WorkerID != wid || r.NodeID != node {
		t.Errorf("receipt %s: kind %s worker %s node %s", r.ID, r.Kind, r.WorkerID, r.NodeID)
	}
	// The worker logs what the start answered: the receipt's id.
	if !strings.Contains(w.stderr.String(), "changed=true receipt_id="+r.ID) {
		t.Errorf("the restarted worker's log does not name receipt %s:\n%s", r.ID, w.stderr.String())
	}
	for _, f := range []struct{ name, got, want string }{
		{"old_job_types", r.OldJobTypes, "cap_a"},
		{"job_types", r.JobTypes, "cap_a cap_b cap_hold"},
		{"old_tags", r.OldTags, "e2e"},
		{"tags", r.Tags, "e2e fast"},
		{"old_gpus", r.OldGPUs, "rtx-4090:24576"},
		{"gpus", r.GPUs, "rtx-4090:24576"},
		{"old_max_jobs", fmt.Sprint(r.OldMaxJobs), "1"},
		{"max_jobs", fmt.Sprint(r.MaxJobs), "2"},
	} {
		if f.got != f.want {
			t.Errorf("worker_updated %s = %q, want %q", f.name, f.got, f.want)
		}
	}

	// The new max_jobs is used: two jobs (that need no GPU) run at once,
	// which max_jobs 1 would not allow.
	holds := []wire.DispatchResponse{c.capsDispatchHold(), c.capsDispatchHold()}
	waitfor.Within(c.t, jobTimeout, "two cap_hold jobs running at once", func() bool {
		for _, h := range holds {
			var jd wire.JobDetailResponse
			if c.try("GET", "/operator/jobs/"+h.Job.ID, nil, &jd) != nil || jd.Job.State != "running" {
				return false
			}
		}
		return true
	})
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, h := range holds {
		c.checkSucceeded(c.waitDone(h.Job.ID, "succeeded"))
	}
	capsStop(t, w)

	// A restart that changes nothing mints no receipt.
	w = c.startCommandWorker(node, capsConfig(ok, []string{"e2e"}, "cap_a", "cap_b")+
		fmt.Sprintf("\n[[job]]\ntype = \"cap_hold\"\ncommand = [%q]\ngpus = 0\n", hold),
		"-gpu", "rtx-4090:24576", "-tag", "fast", "-max-jobs", "2")
	waitfor.Within(c.t, startTimeout, "the unchanged restart started", func() bool {
		return strings.Contains(w.stderr.String(), "changed=false receipt_id=\"\"")
	})
	c.checkSucceeded(c.waitDone(c.capsDispatch("cap_b", "fast").Job.ID, "succeeded"))
	if n := len(c.capsReceipts(receipts.KindWorkerUpdated, wid)); n != 1 {
		t.Errorf("%d worker_updated receipts after a restart that changed nothing, want still 1", n)
	}
	capsStop(t, w)
	c.checkNoTokensLogged()
}

func capsApproval(t *testing.T, d testdb.Dialect) {
	c := capsCluster(t, d, "-approve-nodes")
	c.activate()
	ok := script(t, t.TempDir(), "ok.sh", "echo done\n")
	const node = "caps-approved"
	w := c.startCommandWorker(node, capsConfig(ok, []string{"e2e"}, "cap_a"), "-gpu", "rtx-4090:24576")
	wid := c.workerID(node)
	if v := c.capsView(wid); v.Approval != "pending" {
		t.Fatalf("a new node under -approve-nodes is %q, want pending", v.Approval)
	}
	// Approved with no pins: it covers what the worker has now.
	c.call("POST", "/operator/workers/"+wid+"/approve", wire.ApproveRequest{Reason: "e2e"}, nil)
	c.checkSucceeded(c.waitDone(c.capsDispatch("cap_a").Job.ID, "succeeded"))
	capsStop(t, w)

	// Restarted with a new job type and a new tag: a widening.
	w = c.startCommandWorker(node, capsConfig(ok, []string{"e2e"}, "cap_a", "cap_b"), "-gpu", "rtx-4090:24576", "-tag", "fast")
	var v wire.WorkerView
	waitfor.Within(c.t, jobTimeout, "the widening pending in the worker view", func() bool {
		var wd wire.WorkerDetailResponse
		if c.try("GET", "/operator/workers/"+wid, nil, &wd) != nil {
			return false
		}
		v = wd.Worker
		return slices.Contains(v.Capabilities.JobTypes, "cap_b")
	})
	if !slices.Equal(v.PendingJobTypes, []string{"cap_b"}) || !slices.Equal(v.PendingTags, []string{"fast"}) {
		t.Errorf("worker view pending_job_types %v pending_tags %v, want [cap_b] [fast]", v.PendingJobTypes, v.PendingTags)
	}
	if v.Approval != "approved" {
		t.Errorf("worker view approval %q after the widening, want approved (what was approved keeps working)", v.Approval)
	}
	var ups []*receipts.Receipt
	waitfor.Within(c.t, jobTimeout, "the worker_updated receipt sequenced", func() bool {
		ups = c.capsReceipts(receipts.KindWorkerUpdated, wid)
		return len(ups) > 0
	})
	if len(ups) != 1 {
		t.Fatalf("%d worker_updated receipts, want 1", len(ups))
	}
	if r := c.verifyReceipt(ups[0].ID); r.OldJobTypes != "cap_a" || r.JobTypes != "cap_a cap_b" {
		t.Errorf("worker_updated job types %q -> %q", r.OldJobTypes, r.JobTypes)
	}

	// The new type's job, dispatched first, stays queued with a reason
	// naming the approval; the old type's, dispatched after it, runs: the
	// worker leased since, and the queue skipped the new type.
	pend := c.capsDispatch("cap_b")
	if pend.Leasable || !strings.Contains(pend.Reason, "approved") || !strings.Contains(pend.Reason, "cap_b") {
		t.Errorf("cap_b under a pending widening: leasable %t, reason %q; want a reason naming the approval", pend.Leasable, pend.Reason)
	}
	c.checkSucceeded(c.waitDone(c.capsDispatch("cap_a").Job.ID, "succeeded"))
	jd := c.job(pend.Job.ID)
	if jd.Job.State != "queued" || jd.Leasable || !strings.Contains(jd.Reason, "approved") {
		t.Fatalf("cap_b while its type awaits approval: %s, leasable %t, reason %q", jd.Job.State, jd.Leasable, jd.Reason)
	}
	t.Logf("the pending job's reason: %s", jd.Reason)

	// The operator approves again: the widening is granted.
	c.call("POST", "/operator/workers/"+wid+"/approve", wire.ApproveRequest{Reason: "e2e widening"}, nil)
	if v := c.capsView(wid); len(v.PendingJobTypes)+len(v.PendingTags) != 0 {
		t.Errorf("after the approval still pending: %v %v", v.PendingJobTypes, v.PendingTags)
	}
	got := c.waitDone(pend.Job.ID, "succeeded")
	c.checkSucceeded(got)
	if got.Job.WorkerID == nil || *got.Job.WorkerID != wid {
		t.Errorf("cap_b ran on %v, want %s", got.Job.WorkerID, wid)
	}
	// A job that needs the new tag runs too.
	c.checkSucceeded(c.waitDone(c.capsDispatch("cap_b", "fast").Job.ID, "succeeded"))
	capsStop(t, w)
	c.checkNoTokensLogged()
}

func capsLostIdentity(t *testing.T, d testdb.Dialect) {
	c := capsCluster(t, d)
	const node = "caps-lost"
	w := c.startWorker(node)
	wid := c.workerID(node)
	// Registered on its side too: a SIGTERM before that ends the start,
	// not a running worker (exit 1, not a drain).
	waitfor.Within(c.t, startTimeout, "the worker's registered line", func() bool {
		return strings.Contains(w.stderr.String(), "msg=registered")
	})
	capsStop(t, w)
	if err := os.Remove(c.identityPath(node)); err != nil {
		t.Fatal(err)
	}

	// A new key under the same -node-id: 409 node_exists, and the worker
	// exits non-zero saying how to fix it.
	w = c.startWorker(node)
	select {
	case <-w.done:
	case <-time.After(startTimeout):
		t.Fatal("the worker with a lost identity did not exit")
	}
	if code := w.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("the worker exited %v, want exit status 1", w.cmd.ProcessState)
	}
	stderr := w.stderr.String()
	for _, want := range []string{"worker: ", "409 node_exists", `node "` + node + `" is registered with another key`,
		"restore that identity", "register under another node_id"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the worker's stderr lacks %q:\n%s", want, stderr)
		}
	}
	// Nothing was taken over: one worker, the original.
	var l wire.WorkerListResponse
	c.call("GET", "/operator/workers", nil, &l)
	if len(l.Workers) != 1 || l.Workers[0].WorkerID != wid {
		t.Errorf("workers after the refused registration: %+v, want only %s", l.Workers, wid)
	}
}
