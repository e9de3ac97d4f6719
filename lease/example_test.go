package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/lease"
)

func Example() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	m := lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: func() time.Time { return now }})

	w, _ := m.RegisterWorker(ctx, &lease.Worker{
		NodeID:       "studio-gpu-1",
		Capabilities: lease.Capabilities{GPUs: []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"lora_train"}},
		Governor:     lease.Governor{MaxJobs: 1},
	})
	job, _ := m.Enqueue(ctx, lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "rtx-4090", MinVRAMMB: 16000}})

	grants, _ := m.Lease(ctx, lease.LeaseRequest{WorkerID: w.ID})
	ref := lease.Ref{JobID: job.ID, WorkerID: w.ID, Token: grants[0].Token}
	fmt.Println("leased:", grants[0].Job.State, "epoch", grants[0].Job.Lease.Epoch)

	running, _ := m.Accept(ctx, ref)
	fmt.Println("accepted:", running.State)

	done, _, _ := m.Complete(ctx, ref, lease.Result{FinalMessage: "done"})
	fmt.Println("completed:", done.State)

	// The same token cannot act on the job again, except to repeat the
	// completion, which returns the first result.
	_, repeated, _ := m.Complete(ctx, ref, lease.Result{})
	fmt.Println("repeated:", repeated)
	// Output:
	// leased: leased epoch 1
	// accepted: running
	// completed: succeeded
	// repeated: true
}

func ExampleManager_Lease_fencing() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	m := lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: func() time.Time { return now }})
	a, _ := m.RegisterWorker(ctx, &lease.Worker{NodeID: "a", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}})
	b, _ := m.RegisterWorker(ctx, &lease.Worker{NodeID: "b", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}})
	job, _ := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})

	first, _ := m.Lease(ctx, lease.LeaseRequest{WorkerID: a.ID})
	old := lease.Ref{JobID: job.ID, WorkerID: a.ID, Token: first[0].Token}
	m.Release(ctx, old, "spot preemption")

	second, _ := m.Lease(ctx, lease.LeaseRequest{WorkerID: b.ID})
	fmt.Println("epoch:", second[0].Job.Lease.Epoch, "attempt:", second[0].Job.Attempt)

	_, err := m.Accept(ctx, old)
	fmt.Println("old token:", err)
	// Output:
	// epoch: 2 attempt: 1
	// old token: lease: lease lost
}
