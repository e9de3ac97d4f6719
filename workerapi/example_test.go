package workerapi_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// Embedding nodelane in a Go service: open a database, build a Server on
// its stores, mount the handlers under any prefix, and run the
// maintainer. Keep the pepper and the receipt signer key in your secret
// store: every replica needs the same ones.
func Example_embed() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, _ := os.MkdirTemp("", "nodelane-example")
	defer os.RemoveAll(dir)

	db, err := bunstore.Open(ctx, "sqlite:"+filepath.Join(dir, "nodelane.db"), nil) // or postgres://...
	if err != nil {
		panic(err)
	}
	defer db.Close()
	notifier, err := db.Notifier(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer notifier.Close()

	pepper := make([]byte, 32)
	rand.Read(pepper)
	signer, _, _ := receipts.GenerateKey(rand.Reader, "example-receipts")

	srv, err := workerapi.New(workerapi.Stores{
		Tx:          db,
		Notifier:    notifier,
		Leases:      db.LeaseStore(),
		Credentials: db.CredentialStore(),
		Nonces:      db.NonceStore(nil),
		Envelope:    db.EnvelopeStore(),
		Receipts:    db.ReceiptsStore(),
	}, workerapi.Config{
		Peppers:       map[int][]byte{1: pepper},
		PepperVersion: 1,
		ReceiptSigner: signer,
		Prices:        receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}}, // $1.80 per GPU-hour
	})
	if err != nil {
		panic(err)
	}

	// Mount under any prefix: signatures cover the path as the worker sent it.
	mux := http.NewServeMux()
	mux.Handle("/nodelane/", http.StripPrefix("/nodelane", srv.Handler()))
	go srv.Maintain(ctx, time.Second)

	// First start: an operator token and a provisioning token for nodes.
	boot, err := srv.Bootstrap(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("bootstrapped:", boot.Created)

	// Jobs can be dispatched from Go as well as through the operator route.
	job, leasable, reason, err := srv.Dispatch(ctx, lease.NewJob{Type: "lora_train"})
	if err != nil {
		panic(err)
	}
	fmt.Println(job.State, leasable, reason)
	// Output:
	// bootstrapped: true
	// queued false lora_train is blocked: the runtime is not activated
}
