package receipts_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
)

// TestWake checks that a Run that would wait an hour sequences at once when woken,
// and announces the checkpoint on Published.
func TestWake(t *testing.T) {
	t.Parallel()
	skey, _, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	store := receipts.NewMemoryStore()
	cfg := &receipts.Config{Origin: origin, Interval: time.Hour}
	seq, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := receipts.NewLog(store, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); seq.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for i := range 3 {
		published := seq.Published()
		s, err := log.Mint(ctx, receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: "wrk_wake", Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		seq.Wake()
		// The first Run publishes the empty log before it sleeps; wait
		// for each checkpoint until one covers the receipt.
		for {
			if _, _, cp, err := log.Prove(ctx, s.ID); err == nil {
				if cp.Size != int64(i+1) {
					t.Fatalf("checkpoint of %d, want %d", cp.Size, i+1)
				}
				break
			}
			waitfor.Receive(t, fmt.Sprintf("a checkpoint after Wake for receipt %d", i), published)
			published = seq.Published()
		}
	}
}
