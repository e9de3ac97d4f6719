package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/gpu"
	"github.com/nodelane/nodelane/cmd/internal/gpu/gputest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func TestSetupGPUs(t *testing.T) {
	rtx := wire.GPU{SKU: "rtx-4090", VRAMMB: 24564}
	flagged := []wire.GPU{{SKU: "a100", VRAMMB: 81920}}
	for _, tc := range []struct {
		name    string
		answers map[string]string // a fake nvidia-smi on PATH, or none
		smi     string            // the -nvidia-smi flag; "FAKE" is the fake's path
		flagged []wire.GPU
		sim     bool // -simulate-gpu
		want    []wire.GPU
		devices int
		sampler bool
		err     string
	}{
		{name: "discovered", answers: gputest.TwoGPUs, want: []wire.GPU{rtx, rtx}, devices: 2, sampler: true},
		{name: "discovered by path", answers: gputest.TwoGPUs, smi: "FAKE", want: []wire.GPU{rtx, rtx}, devices: 2, sampler: true},
		{name: "-gpu over discovery", answers: gputest.TwoGPUs, flagged: flagged, want: flagged, sampler: true},
		{name: "none on PATH", err: "-simulate-gpu"},
		{name: "none on PATH, -gpu", flagged: flagged, want: flagged},
		{name: "none on PATH, -simulate-gpu", sim: true, want: []wire.GPU{simulatedGPU}},
		{name: "off", answers: gputest.TwoGPUs, smi: "off", err: "-gpu SKU:VRAM_MB"},
		{name: "off, -simulate-gpu", answers: gputest.TwoGPUs, smi: "off", sim: true, want: []wire.GPU{simulatedGPU}},
		{name: "-simulate-gpu over discovery", answers: gputest.TwoGPUs, sim: true, want: []wire.GPU{simulatedGPU}},
		{name: "-simulate-gpu, -gpu", flagged: flagged, sim: true, err: "exclusive"},
		{name: "-simulate-gpu, -nvidia-smi", answers: gputest.TwoGPUs, smi: "FAKE", sim: true, err: "exclusive"},
		{name: "off, -gpu", answers: gputest.TwoGPUs, smi: "off", flagged: flagged, want: flagged},
		{name: "no GPU", answers: map[string]string{gputest.DiscoverQuery: "", gputest.SampleQuery: ""}, want: []wire.GPU{}, sampler: true},
		{name: "named but absent", smi: "/nonexistent/nvidia-smi", err: "-nvidia-smi /nonexistent/nvidia-smi: no nvidia-smi"},
		{name: "named but absent, -gpu", smi: "/nonexistent/nvidia-smi", flagged: flagged, err: "no nvidia-smi"},
		{name: "fails", answers: map[string]string{gputest.DiscoverQuery: "#!echo 'No devices were found'; exit 6"}, err: "GPU discovery: "},
		{name: "malformed", answers: map[string]string{gputest.DiscoverQuery: "0, GPU-0\n"}, err: "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", t.TempDir())
			smi := tc.smi
			if tc.answers != nil {
				dir, path := gputest.Write(t, tc.answers)
				t.Setenv("PATH", dir+string(os.PathListSeparator)+"/usr/bin:/bin")
				if smi == "FAKE" {
					smi = path
					t.Setenv("PATH", filepath.Dir(path)+"-not")
				}
			}
			var logs bytes.Buffer
			s, err := setupGPUs(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)), smi, tc.flagged, tc.sim)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("setupGPUs = %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.gpus, tc.want) || len(s.devices) != tc.devices || (s.sampler != nil) != tc.sampler {
				t.Errorf("setupGPUs = gpus %+v, %d devices, sampler %v; want %+v, %d, %v", s.gpus, len(s.devices), s.sampler != nil, tc.want, tc.devices, tc.sampler)
			}
			if tc.devices > 0 && strings.Count(logs.String(), `msg="GPU found"`) != tc.devices {
				t.Errorf("the GPUs found are not logged:\n%s", logs.String())
			}
		})
	}
	// Named but absent is ErrNoNvidiaSMI too.
	t.Setenv("PATH", t.TempDir())
	if _, err := setupGPUs(context.Background(), slog.New(slog.DiscardHandler), "/nonexistent/nvidia-smi", nil, false); !errors.Is(err, gpu.ErrNoNvidiaSMI) {
		t.Errorf("setupGPUs = %v, want ErrNoNvidiaSMI", err)
	}
	// No GPU at all is errNoGPU, and its message names both ways out.
	_, err := setupGPUs(context.Background(), slog.New(slog.DiscardHandler), "", nil, false)
	if !errors.Is(err, errNoGPU) || !strings.Contains(err.Error(), "-gpu") || !strings.Contains(err.Error(), "-simulate-gpu") {
		t.Errorf("setupGPUs without a GPU = %v, want errNoGPU naming -gpu and -simulate-gpu", err)
	}
}
