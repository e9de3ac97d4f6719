package workerapi_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// Embedding nodelane in a Go service: open a database, build a Server on
// its stores, mount the handlers under any prefix, and start the
// background work. Keep the pepper and the receipt signer key in your
// secret store: every replica needs the same ones. The README shows this
// function's body.
func Example_embed() {
	dir, err := os.MkdirTemp("", "nodelane-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := embed(context.Background(), filepath.Join(dir, "nodelane.db")); err != nil {
		log.Fatal(err)
	}
	// Output:
	// bootstrapped: true
	// queued false lora_train is blocked: the runtime is not activated
}

// embed is what a host's startup does.
func embed(ctx context.Context, path string) error {
	// begin embed
	db, err := bunstore.Open(ctx, "sqlite:"+path, nil) // or "postgres://..."
	if err != nil {
		return err
	}
	defer db.Close()
	notifier, err := db.Notifier(ctx, nil)
	if err != nil {
		return err
	}
	defer notifier.Close()

	// From your secret store in production; generated here.
	pepper := make([]byte, 32)
	if _, err := rand.Read(pepper); err != nil {
		return err
	}
	signer, _, err := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	if err != nil {
		return err
	}

	srv, err := workerapi.New(workerapi.Stores{
		Tx:          db,
		Notifier:    notifier,
		Leases:      db.LeaseStore(),
		Credentials: db.CredentialStore(),
		Nonces:      db.NonceStore(nil),
		Envelope:    db.EnvelopeStore(),
		Receipts:    db.ReceiptStore(),
		// Replicas refuse to start on secrets other than the database's.
		Fingerprints: db.FingerprintStore(),
	}, workerapi.Config{
		Peppers:       map[int][]byte{1: pepper},
		PepperVersion: 1,
		ReceiptSigner: signer,
		Prices:        receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}}, // $1.80 per GPU-hour
	})
	if err != nil {
		return err // names the missing or invalid setting
	}
	// The maintainer and hook delivery run until Stop.
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer srv.Stop(context.Background())

	// Mount under any prefix: signatures cover the path as the worker sent it.
	mux := http.NewServeMux()
	mux.Handle("/nodelane/", http.StripPrefix("/nodelane", srv.Handler()))

	// First start: an operator token and a provisioning token for nodes.
	boot, err := srv.Bootstrap(ctx)
	if err != nil {
		return err
	}
	fmt.Println("bootstrapped:", boot.Created)

	// Jobs can be dispatched from Go as well as through the operator route.
	job, leasable, reason, err := srv.Dispatch(ctx, lease.NewJob{Type: "lora_train"})
	if err != nil {
		return err
	}
	fmt.Println(job.State, leasable, reason)
	// end embed
	return nil
}
