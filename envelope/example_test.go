package envelope_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/envelope"
)

func Example() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	g, _ := envelope.NewGate(envelope.NewMemoryStore(), &envelope.Config{Now: func() time.Time { return now }})

	s, _ := g.Snapshot(ctx)
	fmt.Println("version", s.Version(), "status_check:", s.Allow("status_check"))
	fmt.Println("version", s.Version(), "lora_train:", s.Allow("lora_train"))

	until := now.Add(2 * time.Hour)
	st, _ := g.Activate(ctx, "alice", "nightly LoRA run", &until)
	fmt.Println("activated: version", st.Version, "until", st.Until.Format(time.RFC3339))

	s, _ = g.Snapshot(ctx)
	fmt.Println("version", s.Version(), "lora_train:", s.Allow("lora_train"))

	st, _ = g.Deactivate(ctx, "bob", "run finished")
	fmt.Println("deactivated: version", st.Version)
	fmt.Println("lora_train:", g.Allow(ctx, "lora_train"))
	// Output:
	// version 1 status_check: <nil>
	// version 1 lora_train: envelope: lora_train is blocked: the runtime is not activated
	// activated: version 2 until 2026-11-30T11:00:00Z
	// version 2 lora_train: <nil>
	// deactivated: version 3
	// lora_train: envelope: lora_train is blocked: the runtime is not activated
}

func ExampleGate_ExpireActivation() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	g, _ := envelope.NewGate(envelope.NewMemoryStore(), &envelope.Config{Now: func() time.Time { return now }})
	until := now.Add(time.Hour)
	g.Activate(ctx, "alice", "one hour of training", &until)

	// At the deadline the activation no longer allows anything, even
	// before the maintainer records its end.
	now = until
	fmt.Println(g.Allow(ctx, "lora_train"))

	st, changed, _ := g.ExpireActivation(ctx)
	fmt.Println("recorded:", changed, "version", st.Version)
	_, changed, _ = g.ExpireActivation(ctx)
	fmt.Println("recorded again:", changed)

	history, _ := g.History(ctx, 0, 0)
	for _, r := range history {
		fmt.Println(r)
	}
	// Output:
	// envelope: lora_train is blocked: the activation expired at 2026-11-30T10:00:00Z
	// recorded: true version 3
	// recorded again: false
	// v2 activate by alice until 2026-11-30T10:00:00Z: one hour of training
	// v3 expire until 2026-11-30T10:00:00Z: activation by alice expired
}

func ExampleSnapshot_Allow() {
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	g, _ := envelope.NewGate(envelope.NewMemoryStore(), &envelope.Config{
		ExtraSafe:    []string{"gpu_probe"},
		ExtraBlocked: []string{"gpu_burn_in"},
		Now:          func() time.Time { return now },
	})
	s, _ := g.Snapshot(context.Background())
	for _, typ := range []string{"telemetry_sync", "gpu_probe", "model_file_write", "gpu_burn_in", "mine_crypto"} {
		fmt.Printf("%s (%s): %v\n", typ, g.Policy().Class(typ), s.Allow(typ))
	}
	// Output:
	// telemetry_sync (safe): <nil>
	// gpu_probe (safe): <nil>
	// model_file_write (blocked): envelope: model_file_write is blocked: the runtime is not activated
	// gpu_burn_in (blocked): envelope: gpu_burn_in is blocked: the runtime is not activated
	// mine_crypto (unknown): envelope: unknown job type "mine_crypto" is blocked: the runtime is not activated
}
