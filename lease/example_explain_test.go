package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/lease"
)

func ExampleManager_Explain() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	m := lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: func() time.Time { return now }})
	m.RegisterWorker(ctx, &lease.Worker{
		NodeID:       "studio-gpu-1",
		Capabilities: lease.Capabilities{GPUs: []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"lora_train"}},
		Governor:     lease.Governor{MaxJobs: 1, MaxVRAMMB: 20000},
	})
	job, _ := m.Enqueue(ctx, lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "rtx-4090", MinVRAMMB: 22000}})

	ex, _ := m.Explain(ctx, job.ID, nil)
	fmt.Println("leasable:", ex.Leasable)
	for _, r := range ex.Reasons {
		fmt.Printf("%s: %s\n", r.Code, r.Message)
	}
	for _, v := range ex.Workers {
		fmt.Printf("%s: %s: %s\n", v.NodeID, v.Reasons[0].Code, v.Reasons[0].Message)
	}
	// Output:
	// leasable: false
	// max_vram: no registered worker that supports lora_train has 1 GPUs of SKU "rtx-4090" with 22000 MiB of VRAM each, within its governor max_vram_mb (the most is 20000 MiB)
	// studio-gpu-1: max_vram: the job needs 22000 MiB of VRAM on each GPU; the worker's governor max_vram_mb caps it at 20000 MiB
}

func ExampleManager_ExplainLease() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	m := lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: func() time.Time { return now }})
	w, _ := m.RegisterWorker(ctx, &lease.Worker{
		NodeID:       "studio-gpu-1",
		Capabilities: lease.Capabilities{GPUs: []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "lora_train", "raw_training"}},
	})
	m.Enqueue(ctx, lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "h100"}})

	// The same request that leased nothing.
	req := lease.LeaseRequest{WorkerID: w.ID, Allow: func(t string) bool { return t != "raw_training" },
		JobTypes: []string{"status_check", "lora_train", "raw_training", "telemetry_sync"}}
	grants, _ := m.Lease(ctx, req)
	fmt.Println("granted:", len(grants))
	ex, _ := m.ExplainLease(ctx, req, nil)
	for _, r := range ex.Reasons {
		fmt.Printf("%s (%s): %s\n", r.Code, r.JobType, r.Message)
	}
	// Output:
	// granted: 0
	// no_queued_job (status_check): no status_check job is queued
	// no_fitting_job (lora_train): no queued lora_train job fits the worker (1 needs a GPU SKU it does not have)
	// type_not_allowed (raw_training): job type "raw_training" is not allowed
	// type_not_registered (telemetry_sync): job type "telemetry_sync" is not among the worker's registered types: ignored
}
