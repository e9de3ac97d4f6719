package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/gpu"
	"github.com/nodelane/nodelane/cmd/internal/gpu/gputest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// startDiscoveringWorker starts a worker process without -gpu, with env
// over the test's environment, so that it discovers its GPUs.
func (c *cluster) startDiscoveringWorker(node string, env []string) *proc {
	c.t.Helper()
	tokenFile := filepath.Join(c.dir, node+".provisioning-token")
	if err := os.WriteFile(tokenFile, []byte(c.tokens.ProvisioningToken+"\n"), 0o600); err != nil {
		c.t.Fatal(err)
	}
	p := startProc(c.t, "worker "+node, c.workerBin, env,
		"-provisioning-token-file", tokenFile,
		"-server", c.base(),
		"-identity", c.identityPath(node),
		"-node-id", node, "-name", node,
		"-workdir", filepath.Join(c.dir, "work-"+node),
		"-wait-seconds", "2", "-drain-timeout", "5s")
	c.workers = append(c.workers, p)
	return p
}

// TestE2EGPUDiscovery checks that a worker with an nvidia-smi on its PATH
// registers the GPUs it lists, under their SKU and with their memory,
// sends their utilisation, memory and temperature in its heartbeats, and
// is granted a job that needs both GPUs.
func TestE2EGPUDiscovery(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "-heartbeat-interval", "1s")
	dir, _ := gputest.Write(t, gputest.TwoGPUs)
	w := c.startDiscoveringWorker("gpu-node", []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")})
	wid := c.workerID("gpu-node")

	var wd wire.WorkerDetailResponse
	c.call("GET", "/operator/workers/"+wid, nil, &wd)
	rtx := wire.GPU{SKU: "rtx-4090", VRAMMB: 24564}
	if got := wd.Worker.Capabilities.GPUs; !reflect.DeepEqual(got, []wire.GPU{rtx, rtx}) {
		t.Errorf("registered GPUs %+v, want two %+v", got, rtx)
	}
	if got := wd.Worker.GovernorLimits.MaxVRAMMB; got != 2*24564 {
		t.Errorf("governor max_vram_mb %d, want both GPUs' %d", got, 2*24564)
	}
	if n := strings.Count(w.stderr.String(), `msg="GPU found"`); n != 2 {
		t.Errorf("the worker logged %d GPUs found, want 2:\n%s", n, w.stderr.String())
	}

	var m gpu.Metrics
	waitfor.Within(c.t, startTimeout, "a heartbeat with the GPUs' metrics", func() bool {
		if c.try("GET", "/operator/workers/"+wid, nil, &wd) != nil || len(wd.Metrics) == 0 || string(wd.Metrics) == "null" {
			return false
		}
		m = gpu.Metrics{}
		if err := json.Unmarshal(wd.Metrics, &m); err != nil {
			t.Fatalf("metrics %s: %v", wd.Metrics, err)
		}
		return len(m.GPUs) > 0
	})
	type sample struct{ index, util, used, total, temp int }
	want := []sample{{0, 37, 1234, 24564, 55}, {1, 0, 3, 24564, 31}}
	var got []sample
	for _, g := range m.GPUs {
		if g.UtilizationPct == nil || g.MemoryUsedMB == nil || g.MemoryTotalMB == nil || g.TemperatureC == nil {
			t.Fatalf("metrics %s lack a value", wd.Metrics)
		}
		got = append(got, sample{g.Index, *g.UtilizationPct, *g.MemoryUsedMB, *g.MemoryTotalMB, *g.TemperatureC})
	}
	if !reflect.DeepEqual(got, want) || m.SampledAt == nil || !strings.HasPrefix(m.GPUs[0].UUID, "GPU-5d3b2c9e") {
		t.Errorf("heartbeat metrics %s, want GPUs %+v", wd.Metrics, want)
	}

	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: "status_check", Payload: json.RawMessage(`{}`),
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 2, MinVRAMMB: 24000}}, &d)
	if !d.Leasable {
		t.Errorf("a job for both discovered GPUs is not leasable: %+v", d.Reason)
	}
	c.waitDone(d.Job.ID, "succeeded")
}

// TestE2ENoGPURefused checks that the worker binary with no nvidia-smi (an empty
// PATH, or -nvidia-smi off) and no -gpu exits non-zero, naming -gpu and
// -simulate-gpu, before it creates its identity.
func TestE2ENoGPURefused(t *testing.T) {
	t.Parallel()
	_, workerBin := binaries(t)
	dir := t.TempDir()
	for i, args := range [][]string{nil, {"-nvidia-smi", "off"}} {
		identity := filepath.Join(dir, fmt.Sprintf("id%d.json", i))
		cmd := exec.Command(workerBin, append([]string{"-server", "http://127.0.0.1:1", "-identity", identity, "-node-id", "n"}, args...)...)
		cmd.Env = []string{"PATH=" + t.TempDir(), "NODELANE_PROVISIONING_TOKEN=nlc_x"}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("worker %q = %v, want a non-zero exit\n%s", args, err, out)
		}
		if !strings.Contains(string(out), "-gpu SKU:VRAM_MB") || !strings.Contains(string(out), "-simulate-gpu") {
			t.Errorf("worker %q says %q, want it to name -gpu and -simulate-gpu", args, out)
		}
		if _, err := os.Stat(identity); !os.IsNotExist(err) {
			t.Errorf("the identity was created: %v", err)
		}
	}
}
