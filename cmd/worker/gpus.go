package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nodelane/nodelane/cmd/internal/gpu"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// smiOff is the -nvidia-smi value that turns discovery and GPU metrics
// off.
const smiOff = "off"

// simulatedGPU is what a worker registers with -simulate-gpu: a
// simulated RTX 4090, so that the example jobs (which only simulate GPU
// work) run, and are priced, on any machine. It is never a fallback: a
// box that finds no GPU and was given neither -gpu nor -simulate-gpu
// refuses to start (errNoGPU), so a real box is never billed as a fake
// GPU by accident.
var simulatedGPU = wire.GPU{SKU: "rtx-4090", VRAMMB: 24576}

// errNoGPU: there is no nvidia-smi and neither -gpu nor -simulate-gpu.
var errNoGPU = errors.New("no GPU: no nvidia-smi to discover them and no -gpu; name the GPUs with -gpu SKU:VRAM_MB (repeatable), or give -simulate-gpu to register one simulated rtx-4090:24576 (tests and demos only)")

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
// the GPUs registered, without discovery. simulate is -simulate-gpu: the
// worker registers simulatedGPU and runs no nvidia-smi (it cannot be
// combined with -gpu or a named -nvidia-smi). Otherwise the GPUs are
// those nvidia-smi lists (possibly none: a CPU-only worker). Without an
// nvidia-smi on PATH, or with -nvidia-smi off, and without -gpu, it is
// errNoGPU; an nvidia-smi that was named but is absent, or that fails,
// is an error rather than a guess. Whenever there is an nvidia-smi, the
// sampler feeds the heartbeats' metrics, -gpu or not.
func setupGPUs(ctx context.Context, log *slog.Logger, smi string, flagged []wire.GPU, simulate bool) (*gpuSetup, error) {
	s := &gpuSetup{gpus: flagged}
	if simulate {
		switch {
		case len(flagged) > 0:
			return nil, errors.New("-simulate-gpu and -gpu are exclusive: -gpu names real GPUs")
		case smi != "" && smi != smiOff:
			return nil, errors.New("-simulate-gpu and -nvidia-smi are exclusive: a simulated GPU is not sampled")
		}
		s.gpus = []wire.GPU{simulatedGPU}
		log.Warn("-simulate-gpu: registering a simulated GPU, priced as a real one; a real box names its GPUs with -gpu or lets nvidia-smi find them",
			"gpu", fmt.Sprintf("%s:%d", simulatedGPU.SKU, simulatedGPU.VRAMMB))
		return s, nil
	}
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
		return nil, errNoGPU
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
