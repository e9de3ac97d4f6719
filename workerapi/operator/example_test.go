package operator_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// controlPlane serves a new control plane on a SQLite file over loopback
// for the examples, and returns its URL, its operator handler, the
// bootstrap operator token and a function that shuts it all down.
func controlPlane() (url string, h http.Handler, token string, stop func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nodelane-operator-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := bunstore.Open(ctx, "sqlite:"+filepath.Join(dir, "nodelane.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	pepper := make([]byte, 32)
	if _, err := rand.Read(pepper); err != nil {
		log.Fatal(err)
	}
	signer, _, err := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := workerapi.New(workerapi.Stores{
		Tx: db, Notifier: workerapi.NewLocalNotifier(), Leases: db.LeaseStore(), Credentials: db.CredentialStore(),
		Nonces: db.NonceStore(nil), Envelope: db.EnvelopeStore(), Receipts: db.ReceiptStore(), Fingerprints: db.FingerprintStore(),
	}, workerapi.Config{Peppers: map[int][]byte{1: pepper}, PepperVersion: 1, ReceiptSigner: signer})
	if err != nil {
		log.Fatal(err)
	}
	boot, err := srv.Bootstrap(ctx)
	if err != nil {
		log.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	return hs.URL, srv.OperatorHandler(), boot.OperatorToken, func() {
		hs.Close()
		db.Close()
		os.RemoveAll(dir)
	}
}

// An operator program: dispatch jobs, list them page after page, and
// read an error answer.
func Example() {
	baseURL, _, token, stop := controlPlane()
	defer stop()
	ctx := context.Background()

	// https in production; plain http is accepted to this machine only.
	api, err := operator.New(baseURL, token, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, t := range []string{"status_check", "lora_train", "status_check"} {
		d, err := api.Dispatch(ctx, wire.DispatchRequest{JobType: t, Priority: i})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("dispatched", d.Job.JobType, d.Job.State)
	}

	// The iterator reads page after page (here of 2 jobs) as the loop
	// goes on; an error ends it. Jobs come in id order, which is the
	// order of their creation to the millisecond.
	for j, err := range api.Jobs(ctx, operator.JobQuery{State: "queued", Limit: 2}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("listed", j.JobType, j.Priority)
	}

	// An error answer of the API is a *wire.Error.
	_, err = api.CancelJob(ctx, "job_that_does_not_exist")
	var we *wire.Error
	if errors.As(err, &we) {
		fmt.Println(we.Status, we.Code)
	}
	// Unordered output:
	// dispatched status_check queued
	// dispatched lora_train queued
	// dispatched status_check queued
	// listed status_check 0
	// listed lora_train 1
	// listed status_check 2
	// 404 not_found
}

// A program that serves the operator handler itself (a web console, an
// admin page of the host) calls it in process, with each signed-in
// operator's token.
func ExampleHandlerTransport() {
	_, handler, token, stop := controlPlane()
	defer stop()
	ctx := context.Background()

	api, err := operator.New("http://nodelane.internal", "", &operator.Config{
		HTTPClient: &http.Client{Transport: &operator.HandlerTransport{Handler: handler, RemoteAddr: "console"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	// One cheap copy per request, with the token of the operator it acts
	// for.
	env, err := api.WithToken(token).Envelope(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("runtime active:", env.Active)

	_, err = api.WithToken("nlc_not_a_token").Envelope(ctx)
	fmt.Println(wire.IsCode(err, wire.CodeInvalidToken))
	// Output:
	// runtime active: false
	// true
}
