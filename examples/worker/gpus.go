package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nodelane/nodelane/examples/internal/gpu"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// smiOff is the -nvidia-smi value that turns discovery and GPU metrics
// off.
const smiOff = "off"

// defaultGPU is what a worker registers with neither -gpu nor an
// nvidia-smi: a simulated RTX 4090, so that the example jobs (which only
// simulate GPU work) run, and are priced, on any machine.
var defaultGPU = wire.GPU{SKU: "rtx-4090", VRAMMB: 24576}

// gpuSetup is what the worker found of its GPUs.
type gpuSetup struct {
	// gpus are the registration's capabilities.gpus.
	gpus []wire.GPU
	// devices are the GPUs nvidia-smi listed: none with -gpu, with
	// -nvidia-smi off or without an nvidia-smi.
	devices []gpu.Device
	// sampler samples the GPUs for heartbeats; nil without an
	// nvidia-smi.
	sampler *gpu.Sampler
}

// setupGPUs decides the worker's GPUs. smi is the -nvidia-smi flag: ""
// looks nvidia-smi up on PATH, smiOff turns it off, anything else is the
// program to run. flagged are the -gpu flags, which, when given, are
// the GPUs registered, without discovery. Otherwise the GPUs are those
// nvidia-smi lists (possibly none: a CPU-only worker). Without an
// nvidia-smi on PATH, or with -nvidia-smi off, the worker registers
// defaultGPU; an nvidia-smi that was named but is absent, or that fails,
// is an error rather than a guess. Whenever there is an nvidia-smi, the
// sampler feeds the heartbeats' metrics, -gpu or not.
func setupGPUs(ctx context.Context, log *slog.Logger, smi string, flagged []wire.GPU) (*gpuSetup, error) {
	s := &gpuSetup{gpus: flagged}
	bin := ""
	if smi != smiOff {
		var err error
		bin, err = gpu.LookPath(smi)
		switch {
		case err != nil && (smi != "" || !errors.Is(err, gpu.ErrNoNvidiaSMI)):
			return nil, fmt.Errorf("-nvidia-smi %s: %w", smi, err)
		case err != nil:
			log.Debug("no nvidia-smi on PATH", "err", err)
		}
	}
	if bin != "" {
		s.sampler = gpu.NewSampler(&gpu.SamplerConfig{Path: bin, Logger: log})
	}
	switch {
	case len(flagged) > 0:
		return s, nil
	case bin == "":
		s.gpus = []wire.GPU{defaultGPU}
		log.Warn("no nvidia-smi: registering a simulated GPU; name the GPUs with -gpu SKU:VRAM_MB",
			"gpu", fmt.Sprintf("%s:%d", defaultGPU.SKU, defaultGPU.VRAMMB), "nvidia_smi", smi)
		return s, nil
	}
	devices, err := gpu.Discover(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("GPU discovery: %w (name the GPUs with -gpu SKU:VRAM_MB, or turn discovery off with -nvidia-smi off)", err)
	}
	s.devices, s.gpus = devices, gpu.GPUs(devices)
	for _, d := range devices {
		g := d.GPU()
		log.Info("GPU found", "index", d.Index, "uuid", d.UUID, "name", d.Name, "sku", g.SKU, "vram_mb", g.VRAMMB)
	}
	if len(devices) == 0 {
		log.Warn("nvidia-smi lists no GPU: registering none (a CPU-only worker)", "nvidia_smi", bin)
	}
	return s, nil
}
