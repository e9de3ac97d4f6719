// Package jobs holds the example job handlers that cmd/worker and
// cmd/demo both run: status_check, embedding_dry_run and a simulated
// lora_train that writes a checkpoint file and reports it as an artifact.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Job types the handlers run.
const (
	StatusCheck     = "status_check"
	EmbeddingDryRun = "embedding_dry_run"
	LoraTrain       = "lora_train"
)

// Types lists the job types Register handles, sorted.
func Types() []string { return []string{EmbeddingDryRun, LoraTrain, StatusCheck} }

// Register installs every handler on w. lora_train writes its checkpoints
// under workdir (created 0700 if missing).
func Register(w *client.Runner, workdir string) {
	w.Handle(StatusCheck, StatusCheckHandler)
	w.Handle(EmbeddingDryRun, EmbeddingDryRunHandler)
	w.Handle(LoraTrain, LoraTrainHandler(workdir))
}

// StatusCheckHandler reports one status event describing the node and
// completes.
func StatusCheckHandler(ctx context.Context, job *wire.Job, r *client.Reporter) error {
	host, _ := os.Hostname()
	info := map[string]any{"hostname": host, "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH, "cpus": runtime.NumCPU()}
	if err := r.Status(ctx, "status", "node is healthy", info); err != nil {
		return err
	}
	r.SetOutput("", map[string]any{"healthy": 1}, "status ok")
	return nil
}

// EmbeddingDryRunHandler logs a few lines, as an embedding run would, and
// completes with metrics; it computes nothing.
func EmbeddingDryRunHandler(ctx context.Context, job *wire.Job, r *client.Reporter) error {
	var p struct {
		Documents int `json:"documents"`
	}
	_ = json.Unmarshal(job.Payload, &p) // optional fields
	if p.Documents <= 0 {
		p.Documents = 128
	}
	r.Logf("dry run: would embed %d documents", p.Documents)
	for i, stage := range []string{"tokenize", "batch", "embed", "index"} {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		r.Log("stage "+stage+" ok", map[string]any{"stage": i + 1})
	}
	r.SetOutput("", map[string]any{"documents": p.Documents, "dimensions": 768, "dry_run": 1}, "dry run complete")
	return nil
}

// LoraPayload is lora_train's payload.
type LoraPayload struct {
	// Steps defaults to 20; StepMS (the time a step takes) to 100.
	Steps  int `json:"steps"`
	StepMS int `json:"step_ms"`
}

// LoraTrainHandler returns the simulated lora_train handler: per step it
// reports progress and a log line, and sleeps; then it writes a
// checkpoint file under workdir, reports it as an "adapter" artifact with
// its SHA-256 and size, and completes with the final loss.
func LoraTrainHandler(workdir string) client.HandlerFunc {
	return func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
		p := LoraPayload{Steps: 20, StepMS: 100}
		if len(job.Payload) > 0 && string(job.Payload) != "null" {
			if err := json.Unmarshal(job.Payload, &p); err != nil {
				return client.Permanent(client.WithErrorCode("bad_payload", fmt.Errorf("lora_train payload: %w", err)))
			}
		}
		if p.Steps <= 0 {
			p.Steps = 20
		}
		if p.StepMS < 0 {
			p.StepMS = 0
		}
		if p.Steps > 100000 {
			return client.Permanent(client.WithErrorCode("bad_payload", errors.New("lora_train: at most 100000 steps")))
		}
		loss := 2.0
		for step := 1; step <= p.Steps; step++ {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(time.Duration(p.StepMS) * time.Millisecond):
			}
			loss = 2.0 * math.Exp(-3*float64(step)/float64(p.Steps))
			r.Logf("step %d/%d loss %.4f", step, p.Steps, loss)
			msg := fmt.Sprintf("step %d/%d", step, p.Steps)
			if err := r.Progress(ctx, msg, map[string]any{"step": step, "steps": p.Steps, "loss": loss}); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				// Progress is advisory: a missed event does not fail the job
				// (the heartbeat keeps the lease; a lost lease stops ctx).
				r.Logf("progress not reported: %v", client.ErrorCode(err))
			}
		}
		path, err := writeCheckpoint(workdir, job, p.Steps, loss)
		if err != nil {
			return err
		}
		if _, err := r.Artifact(ctx, client.ArtifactInfo{
			Type: "adapter", Name: filepath.Base(path), URI: fileURI(path), Path: path,
			Metadata: map[string]any{"steps": p.Steps, "format": "simulated"},
		}); err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("reporting the adapter: %w", err)
		}
		r.SetOutput(fileURI(path), map[string]any{"loss": round(loss), "steps": p.Steps}, "training complete")
		return nil
	}
}

func round(f float64) float64 { return math.Round(f*1e6) / 1e6 }

// writeCheckpoint writes a fake adapter file, unique per attempt.
func writeCheckpoint(workdir string, job *wire.Job, steps int, loss float64) (string, error) {
	dir, err := filepath.Abs(workdir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("workdir: %w", err)
	}
	var salt [8]byte
	_, _ = rand.Read(salt[:])
	name := fmt.Sprintf("adapter-%s-a%d.safetensors", safeName(job.ID), job.Attempt)
	body := fmt.Sprintf("simulated LoRA adapter\njob=%s\nattempt=%d\nsteps=%d\nloss=%s\nsalt=%s\n",
		job.ID, job.Attempt, steps, strconv.FormatFloat(loss, 'f', 6, 64), hex.EncodeToString(salt[:]))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return "", fmt.Errorf("writing the checkpoint: %w", err)
	}
	return path, nil
}

// safeName keeps a job id usable as part of a file name.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

func fileURI(path string) string { return "file://" + filepath.ToSlash(path) }

// Registration is what a node running these handlers registers: its GPUs,
// every job type Register handles, and max_jobs.
func Registration(nodeID, name string, gpus []wire.GPU, maxJobs int) *wire.RegisterRequest {
	host, _ := os.Hostname()
	if name == "" {
		name = nodeID
	}
	maxVRAM := 0
	for _, g := range gpus {
		maxVRAM += g.VRAMMB
	}
	return &wire.RegisterRequest{
		NodeID: nodeID, Name: name, Hostname: host, Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: gpus, JobTypes: Types()},
		GovernorLimits: wire.GovernorLimits{MaxJobs: maxJobs, MaxVRAMMB: maxVRAM},
		Tags:           []string{"example"}, Version: "nodelane-example-worker/1",
	}
}

// ParseGPU parses SKU:VRAM_MB, as in "rtx-4090:24576".
func ParseGPU(s string) (wire.GPU, error) {
	sku, mb, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(mb)
	if !ok || sku == "" || err != nil || n <= 0 {
		return wire.GPU{}, fmt.Errorf("GPU %q is not SKU:VRAM_MB", s)
	}
	return wire.GPU{SKU: sku, VRAMMB: n}, nil
}
