//go:build linux

package command

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// The documented example (cmd/commands: worker.toml and train.py)
// loads, and, where python3 is installed, runs as docs/COMMANDS.md says.
func TestDocumentedExample(t *testing.T) {
	t.Parallel()
	cfg, err := Load("../../commands/worker.toml")
	if _, lookErr := exec.LookPath("python3"); lookErr != nil {
		if !errors.Is(err, exec.ErrNotFound) {
			t.Fatalf("without python3, Load says %v", err)
		}
		t.Log("no python3 on PATH: the example was loaded, not run")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Jobs) != 1 || cfg.Jobs[0].Type != "lora_train" || cfg.Jobs[0].GPUs != 1 || strings.Join(cfg.Tags, ",") != "example,python" {
		t.Fatalf("example config: %+v %+v", cfg, cfg.Jobs[0])
	}
	devs, _ := NewDevices([]string{"0"})
	e, err := NewExecutor(cfg, devs, &Options{Workdir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	job := &wire.Job{ID: "job-example", JobType: "lora_train", Attempt: 1, Payload: json.RawMessage(`{"epochs": 2, "step_seconds": 0}`)}
	if err := e.Run(context.Background(), job, rec); err != nil {
		t.Fatalf("%v; logs %q", err, rec.logs)
	}
	if len(rec.progress) != 2 || rec.messages[1] != "epoch 2/2" || rec.progress[1]["fraction"] != 1.0 {
		t.Errorf("progress %v %q", rec.progress, rec.messages)
	}
	if len(rec.artifacts) != 1 {
		t.Fatalf("artifacts %+v; logs %q", rec.artifacts, rec.logs)
	}
	a := rec.artifacts[0]
	b, err := os.ReadFile(strings.TrimPrefix(a.URI, "file://"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if a.Type != "adapter" || a.Name != "adapter_model.safetensors" || a.SHA256 != hex.EncodeToString(sum[:]) || a.SizeBytes != int64(len(b)) ||
		filepath.Base(a.URI) != "adapter_model.safetensors" {
		t.Errorf("artifact %+v", a)
	}
	if m, _ := rec.metrics.(json.RawMessage); !strings.Contains(string(m), `"loss": 0.5`) {
		t.Errorf("metrics %s", m)
	}
	if !rec.logged("on GPUs [0]") || !rec.logged("epoch 2/2 loss 0.5000") {
		t.Errorf("logs %q", rec.logs)
	}
	// A bad payload fails the job for good (exit 2, not in retry_on_exit).
	job.Payload = json.RawMessage(`{"epochs": 0}`)
	if f := failure(t, e.Run(context.Background(), job, &recorder{})); f.Code != "exit_2" || f.Retryable {
		t.Errorf("bad payload: %+v", f)
	}
}
