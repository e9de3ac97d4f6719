//go:build linux

package cmd

// End-to-end tests of cmd/worker -config: job types mapped to real
// commands (shell scripts), run by a real worker process against a real
// cmd/server over loopback.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/gpu/gputest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// startCommandWorker starts a worker process running the commands of the
// TOML config, with args after the usual flags (and so over them).
func (c *cluster) startCommandWorker(node, config string, args ...string) *proc {
	c.t.Helper()
	cfg := filepath.Join(c.dir, node+".toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return c.startConfigWorker(node, cfg, args...)
}

// startConfigWorker starts a worker process running the commands of the
// TOML file at cfg, with args after the usual flags (and so over them).
func (c *cluster) startConfigWorker(node, cfg string, args ...string) *proc {
	c.t.Helper()
	tokenFile := filepath.Join(c.dir, node+".provisioning-token")
	if err := os.WriteFile(tokenFile, []byte(c.tokens.ProvisioningToken+"\n"), 0o600); err != nil {
		c.t.Fatal(err)
	}
	p := startProc(c.t, "worker "+node, c.workerBin, nil, append([]string{
		"-provisioning-token-file", tokenFile,
		"-server", c.base(),
		"-identity", c.identityPath(node),
		"-node-id", node, "-name", node,
		"-config", cfg,
		"-workdir", filepath.Join(c.dir, "work-"+node),
		"-wait-seconds", "1", "-drain-timeout", "5s"}, args...)...)
	c.workers = append(c.workers, p)
	return p
}

// dispatchGPUs queues a job that asks for gpus GPUs of the cluster's SKU.
func (c *cluster) dispatchGPUs(jobType string, gpus int) wire.DispatchResponse {
	c.t.Helper()
	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: jobType, Payload: json.RawMessage(`{"steps": 2}`),
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: gpus}, MaxAttempts: 2}, &d)
	return d
}

// script writes an executable /bin/sh script and returns its path. It is
// written through a child process (gputest.WriteExecutable), so that no
// process another test forks meanwhile holds it open for writing, which
// would fail its run with "text file busy".
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := gputest.WriteExecutable(path, "#!/bin/sh\n"+body); err != nil {
		t.Fatal(err)
	}
	return path
}

func logLines(d wire.JobDetailResponse) []string {
	var out []string
	for _, e := range d.Events {
		if e.Kind == "log" {
			out = append(out, e.Message)
		}
	}
	return out
}

// readPids waits for a script's pid file to hold n pids, and kills them
// when the test ends if they still run.
func readPids(c *cluster, path string, n int) []int {
	c.t.Helper()
	var out []int
	waitfor.Within(c.t, jobTimeout, "the script's pids", func() bool {
		b, _ := os.ReadFile(path)
		out = out[:0]
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				out = append(out, p)
			}
		}
		return len(out) >= n
	})
	// A failed test leaves nothing running.
	leftover := append([]int(nil), out...)
	c.t.Cleanup(func() {
		for _, p := range leftover {
			if running(p) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	return out
}

// running reports whether pid still runs (a zombie waiting for init to
// reap it runs nothing).
func running(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// cmdAdapter is what cmd_ok writes as its adapter artifact.
const cmdAdapter = "simulated adapter weights\n"

// commandJobs starts a control plane, heartbeats every second, and a
// worker (node cmd-node) whose job types run scripts: cmd_ok succeeds
// with logs, progress, an artifact and a result; cmd_exit3 exits 3;
// cmd_sleep and cmd_stubborn (which ignores SIGTERM, as its children do)
// write their pids to pidFile and run until killed.
func commandJobs(t *testing.T) (c *cluster, w *proc, pidFile string) {
	t.Helper()
	c = newCluster(t, "-heartbeat-interval", "1s")
	c.activate()
	t.Cleanup(c.checkNoTokensLogged)
	dir := t.TempDir()
	pidFile = filepath.Join(dir, "pids")
	ok := script(t, dir, "ok.sh", `
echo "line one"
echo "line two"
echo "a warning" >&2
echo 'nodelane:progress {"fraction": 0.5, "message": "epoch 1", "metrics": {"loss": 0.9}}'
echo 'nodelane:progress {"fraction": 1.0, "message": "epoch 2", "metrics": {"loss": 0.4}}'
mkdir -p "$NODELANE_OUTPUT_DIR/adapter"
printf '`+strings.TrimSuffix(cmdAdapter, "\n")+`\n' > "$NODELANE_OUTPUT_DIR/adapter/adapter.safetensors"
echo 'nodelane:artifact {"name": "adapter.safetensors", "path": "adapter/adapter.safetensors", "kind": "adapter"}'
echo '{"loss": 0.4}' > "$NODELANE_OUTPUT_DIR/result.json"
exit 0
`)
	exit3 := script(t, dir, "exit3.sh", "echo about to fail\necho bad input >&2\nexit 3\n")
	sleeper := script(t, dir, "sleeper.sh", `sleep 1000 &
echo $$ > `+pidFile+`
echo $! >> `+pidFile+`
echo started
wait
`)
	// stubborn ignores SIGTERM, and so do its children.
	stubborn := script(t, dir, "stubborn.sh", `trap '' TERM
sh -c 'trap "" TERM; sleep 1000' &
echo $$ > `+pidFile+`
echo $! >> `+pidFile+`
while :; do sleep 0.2; done
`)
	w = c.startCommandWorker("cmd-node", fmt.Sprintf(`
tags = ["e2e"]

[[job]]
type = "cmd_ok"
command = [%q]

[[job]]
type = "cmd_exit3"
command = ["/bin/sh", %q]
retry_on_exit = [75]

[[job]]
type = "cmd_sleep"
command = [%q]
gpus = 0
kill_grace = "3s"

[[job]]
type = "cmd_stubborn"
command = [%q]
gpus = 0
kill_grace = "6s"
`, ok, exit3, sleeper, stubborn), "-gpu", "rtx-4090:24576", "-tag", "extra", "-drain-timeout", "1s")
	return c, w, pidFile
}

// TestE2ECommandJobs runs a worker that runs job types as commands: output
// lines become logs, progress events and an artifact with the right
// sha256; exit codes fail jobs; a cancel kills the whole process group;
// SIGTERM drains. Each case has a control plane and a worker of its own.
func TestE2ECommandJobs(t *testing.T) {
	t.Parallel()

	t.Run("registration", func(t *testing.T) {
		t.Parallel()
		c, _, _ := commandJobs(t)
		var wd wire.WorkerDetailResponse
		c.call("GET", "/operator/workers/"+c.workerID("cmd-node"), nil, &wd)
		wv := wd.Worker
		if got := strings.Join(wv.Tags, ","); got != "e2e,extra" {
			t.Errorf("registered tags %q, want the file's and the flag's", got)
		}
		if got := strings.Join(wv.Capabilities.JobTypes, ","); got != "cmd_ok,cmd_exit3,cmd_sleep,cmd_stubborn" {
			t.Errorf("registered job types %q, want the configured ones only", got)
		}
	})

	t.Run("exit 0", func(t *testing.T) {
		t.Parallel()
		c, _, _ := commandJobs(t)
		d := c.waitDone(c.dispatchGPUs("cmd_ok", 1).Job.ID, "succeeded")
		logs := strings.Join(logLines(d), "\n")
		for _, want := range []string{"line one", "line two", "a warning"} {
			if !strings.Contains(logs, want) {
				t.Errorf("no log line %q in\n%s", want, logs)
			}
		}
		if strings.Contains(logs, "nodelane:") {
			t.Errorf("a progress or artifact line was logged:\n%s", logs)
		}
		if n := progressEvents(d); n != 2 {
			t.Errorf("%d progress events, want 2", n)
		}
		var fractions []string
		for _, e := range d.Events {
			if e.EventType != nil && *e.EventType == "progress" {
				fractions = append(fractions, e.Message+" "+string(e.Payload))
			}
		}
		if len(fractions) == 2 && (!strings.Contains(fractions[0], "epoch 1") || !strings.Contains(fractions[0], `"fraction":0.5`) ||
			!strings.Contains(fractions[1], `"loss":0.4`)) {
			t.Errorf("progress events %q", fractions)
		}
		if len(d.Artifacts) != 1 {
			t.Fatalf("artifacts %+v", d.Artifacts)
		}
		a := d.Artifacts[0]
		sum := sha256.Sum256([]byte(cmdAdapter))
		if a.ChecksumSHA256 == nil || *a.ChecksumSHA256 != hex.EncodeToString(sum[:]) || a.SizeBytes != int64(len(cmdAdapter)) ||
			a.ArtifactType != "adapter" || a.Name != "adapter.safetensors" {
			t.Errorf("artifact %+v (checksum %v), want sha256 %x size %d", a, a.ChecksumSHA256, sum, len(cmdAdapter))
		}
		b, err := os.ReadFile(strings.TrimPrefix(a.URI, "file://"))
		if err != nil || string(b) != cmdAdapter {
			t.Errorf("the artifact's uri %s holds %q, %v", a.URI, b, err)
		}
		if d.Result == nil || !strings.Contains(string(d.Result.Metrics), `"loss"`) {
			t.Errorf("result %+v", d.Result)
		}
		c.checkSucceeded(d)
	})

	t.Run("exit 3", func(t *testing.T) {
		t.Parallel()
		c, _, _ := commandJobs(t)
		d := c.waitDone(c.dispatchGPUs("cmd_exit3", 1).Job.ID, "failed")
		if d.Job.LastError == nil || d.Job.LastError.Code != "exit_3" || !strings.Contains(d.Job.LastError.Message, "bad input") {
			t.Errorf("last error %+v, want exit_3", d.Job.LastError)
		}
		if d.Job.Attempt != 1 {
			t.Errorf("attempt %d: exit 3 is not in retry_on_exit, so the job is not retried", d.Job.Attempt)
		}
		if !strings.Contains(strings.Join(logLines(d), "\n"), "about to fail") {
			t.Errorf("logs %q", logLines(d))
		}
	})

	t.Run("cancel kills the process group", func(t *testing.T) {
		t.Parallel()
		c, _, pidFile := commandJobs(t)
		d := c.dispatchGPUs("cmd_sleep", 0)
		pids := readPids(c, pidFile, 2)
		for _, p := range pids {
			if !running(p) {
				t.Fatalf("process %d is not running before the cancel", p)
			}
		}
		c.call("POST", "/operator/jobs/"+d.Job.ID+"/cancel", nil, nil)
		// The worker learns of the cancel by its next heartbeat (1 s),
		// then the group has kill_grace (3 s), plus 1 s.
		waitfor.Within(t, time.Second+3*time.Second+time.Second, "the script's processes gone after the cancel", func() bool {
			for _, p := range pids {
				if running(p) {
					return false
				}
			}
			return true
		})
		jd := c.waitDone(d.Job.ID, "canceled")
		if !strings.Contains(strings.Join(logLines(jd), "\n"), "started") {
			t.Errorf("logs %q", logLines(jd))
		}
	})
	// SIGTERM drains the worker: the job outlives -drain-timeout (1 s), so
	// its process group is sent SIGTERM, which it ignores, and the job is
	// released; the worker exits only once the group is gone, after the
	// job's kill_grace (6 s), though its runner gives up on the job sooner.
	t.Run("drain", func(t *testing.T) {
		t.Parallel()
		c, w, pidFile := commandJobs(t)
		d := c.dispatchGPUs("cmd_stubborn", 0)
		pids := readPids(c, pidFile, 2)
		start := time.Now()
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.done:
			if !w.cmd.ProcessState.Success() {
				t.Errorf("the worker exited %v after SIGTERM", w.cmd.ProcessState)
			}
		case <-time.After(startTimeout):
			t.Fatal("the worker did not drain after SIGTERM")
		}
		if took := time.Since(start); took < 7*time.Second {
			t.Errorf("the worker exited %v after SIGTERM, before -drain-timeout + kill_grace", took)
		}
		for _, p := range pids {
			if running(p) {
				t.Errorf("process %d outlived the worker", p)
			}
		}
		if jd := c.job(d.Job.ID); jd.Job.State != "queued" {
			t.Errorf("after the drain the job is %s, want queued (released)", jd.Job.State)
		}
	})
}

// TestE2ECommandGPUs checks that a worker with the two GPUs a fake nvidia-smi lists
// runs two 1-GPU jobs at once, each with its own CUDA_VISIBLE_DEVICES.
func TestE2ECommandGPUs(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.activate()
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	if err := os.Mkdir(seen, 0o700); err != nil {
		t.Fatal(err)
	}
	// Each job records its devices, then waits (up to 30 s) until the
	// other has recorded its own: the two run at once.
	gpu := script(t, dir, "gpu.sh", `
printf '%s' "$CUDA_VISIBLE_DEVICES" > `+seen+`/"$NODELANE_JOB_ID"
i=0
while [ "$(ls `+seen+` | wc -l)" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
[ "$(ls `+seen+` | wc -l)" -ge 2 ]
`)
	// A fake nvidia-smi lists two GPUs, numbered 2 and 5 as on a box
	// whose other GPUs are hidden: the jobs get those numbers.
	_, smi := gputest.Write(t, map[string]string{
		gputest.DiscoverQuery: "2, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, NVIDIA GeForce RTX 4090, 24564\n" +
			"5, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, NVIDIA GeForce RTX 4090, 24564\n",
		gputest.SampleQuery: "2, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, 37, 1234, 24564, 55\n" +
			"5, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, 0, 3, 24564, 31\n",
	})
	c.startCommandWorker("gpu-node", fmt.Sprintf("[[job]]\ntype = \"cmd_gpu\"\ncommand = [%q]\n", gpu),
		"-nvidia-smi", smi, "-max-jobs", "2")
	c.workerID("gpu-node")
	a := c.dispatchGPUs("cmd_gpu", 1)
	b := c.dispatchGPUs("cmd_gpu", 1)
	c.waitDone(a.Job.ID, "succeeded")
	c.waitDone(b.Job.ID, "succeeded")
	da, errA := os.ReadFile(filepath.Join(seen, a.Job.ID))
	db, errB := os.ReadFile(filepath.Join(seen, b.Job.ID))
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if string(da) == string(db) || (string(da) != "2" && string(da) != "5") || (string(db) != "2" && string(db) != "5") {
		t.Errorf("CUDA_VISIBLE_DEVICES %q and %q: want 2 and 5, one each", da, db)
	}
}

// TestE2ECommandTrainPy runs the documented example as a reader runs it, the
// worker given the repository's cmd/commands/worker.toml, which runs
// train.py with python3: two progress events, the adapter as an artifact
// whose sha256 is the file's in the run's output directory, the metrics of
// result.json; a bad payload fails for good (exit 2); SIGTERM drains.
func TestE2ECommandTrainPy(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 is needed to run cmd/commands/train.py: %v", err)
		}
		t.Skipf("no python3 on PATH: %v", err)
	}
	cfg, err := filepath.Abs(filepath.Join("commands", "worker.toml"))
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t)
	c.activate()
	w := c.startConfigWorker("train-py", cfg, "-gpu", "rtx-4090:24576")
	var wd wire.WorkerDetailResponse
	c.call("GET", "/operator/workers/"+c.workerID("train-py"), nil, &wd)
	if got := strings.Join(wd.Worker.Capabilities.JobTypes, ","); got != "lora_train" {
		t.Errorf("registered job types %q, want lora_train", got)
	}
	dispatch := func(payload string) string {
		var d wire.DispatchResponse
		c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: "lora_train", Payload: json.RawMessage(payload),
			Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 1}, MaxAttempts: 3}, &d)
		return d.Job.ID
	}

	d := c.waitDone(dispatch(`{"epochs": 2, "step_seconds": 0.05}`), "succeeded")
	type progress struct {
		Fraction float64            `json:"fraction"`
		Metrics  map[string]float64 `json:"metrics"`
	}
	var got []string
	for _, e := range d.Events {
		if e.EventType != nil && *e.EventType == "progress" {
			var p progress
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				t.Fatalf("progress payload %s: %v", e.Payload, err)
			}
			got = append(got, fmt.Sprintf("%s %v %v %v", e.Message, p.Fraction, p.Metrics["epoch"], p.Metrics["loss"]))
		}
	}
	if want := []string{"epoch 1/2 0.5 1 1", "epoch 2/2 1 2 0.5"}; !slices.Equal(got, want) {
		t.Errorf("progress events (message fraction epoch loss) %q, want %q", got, want)
	}
	logs := strings.Join(logLines(d), "\n")
	for _, want := range []string{"on GPUs [0]", "epoch 2/2 loss 0.5000"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no log line %q in\n%s", want, logs)
		}
	}
	if len(d.Artifacts) != 1 {
		t.Fatalf("artifacts %+v", d.Artifacts)
	}
	a := d.Artifacts[0]
	path, ok := strings.CutPrefix(a.URI, "file://")
	runs := filepath.Join(c.dir, "work-train-py", "runs") + string(filepath.Separator)
	if !ok || !strings.HasPrefix(path, runs+d.Job.ID+"-a1-") || !strings.HasSuffix(path, "/output/adapter/adapter_model.safetensors") {
		t.Errorf("artifact uri %s, want a file in the run's output directory under %s", a.URI, runs)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if a.ChecksumSHA256 == nil || *a.ChecksumSHA256 != hex.EncodeToString(sum[:]) || a.SizeBytes != int64(len(b)) {
		t.Errorf("artifact checksum %v size %d, the file's is %x size %d", a.ChecksumSHA256, a.SizeBytes, sum, len(b))
	}
	if string(b) != "simulated LoRA adapter, rank 8, loss 0.500000\n" {
		t.Errorf("adapter file holds %q", b)
	}
	var md map[string]int
	if err := json.Unmarshal(a.Metadata, &md); err != nil || a.ArtifactType != "adapter" || a.Name != "adapter_model.safetensors" ||
		md["rank"] != 8 || md["epochs"] != 2 || a.Status != wire.ArtifactTrained {
		t.Errorf("artifact %+v, metadata %s", a, a.Metadata)
	}
	if d.Result == nil {
		t.Fatal("the succeeded job has no result")
	}
	var metrics map[string]float64
	if json.Unmarshal(d.Result.Metrics, &metrics) != nil || len(metrics) != 2 || metrics["loss"] != 0.5 || metrics["epochs"] != 2 {
		t.Errorf("result metrics %s, want loss 0.5 and epochs 2", d.Result.Metrics)
	}
	if out := filepath.Dir(filepath.Dir(path)); d.Result.OutputURI == nil || *d.Result.OutputURI != "file://"+out {
		t.Errorf("output_uri %v, want file://%s", d.Result.OutputURI, out)
	}
	c.checkSucceeded(d)

	// train.py exits 2 on a bad payload: not in retry_on_exit, so the
	// job fails at its first attempt.
	f := c.waitDone(dispatch(`{"epochs": 0}`), "failed")
	if f.Job.LastError == nil || f.Job.LastError.Code != "exit_2" || !strings.Contains(f.Job.LastError.Message, "epochs must be 1 to 1000") ||
		f.Job.Attempt != 1 {
		t.Errorf("bad payload: attempt %d, last error %+v", f.Job.Attempt, f.Job.LastError)
	}

	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
		if !w.cmd.ProcessState.Success() {
			t.Errorf("the worker exited %v after SIGTERM", w.cmd.ProcessState)
		}
	case <-time.After(startTimeout):
		t.Fatal("the worker did not drain after SIGTERM")
	}
	c.checkNoTokensLogged()
}
