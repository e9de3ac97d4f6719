package receipts_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/receipts"
)

func Example() {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	// The host keeps the signer key secret and publishes the verifier key
	// (PROTOCOL's receipt_public_key).
	skey, vkey, _ := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	signer, _ := note.NewSigner(skey)

	store := receipts.NewMemoryStore()
	cfg := &receipts.Config{Now: func() time.Time { return now }}
	log := receipts.NewLog(store, cfg)
	seq, _ := receipts.NewSequencer(store, signer, cfg)

	// The job ran 1234 ms on one GPU priced 1.802 USD per GPU-hour.
	charge, _ := receipts.NewCharge(now.Add(-1234*time.Millisecond), now, 1, 1_802_000)
	fmt.Println("charge:", charge.ActualMS, "ms,", charge.ActualHours, "h,", charge.ActualCostUSD, "USD")
	r := charge.Receipt("job_1", "wrk_1", "rtx-4090")
	r.PolicyVersion = 3
	minted, _ := log.Mint(ctx, r) // in the request's transaction
	_, _, _, err := log.Prove(ctx, minted.ID)
	fmt.Println("before sequencing:", errors.Is(err, receipts.ErrNotSequenced))

	n, _ := seq.Sequence(ctx) // the maintainer's job, on any replica
	fmt.Println("sequenced:", n)

	// A third party needs nothing but the verifier key, the origin and
	// what the control plane handed out.
	s, proof, cp, _ := log.Prove(ctx, minted.ID)
	got, err := receipts.Verify(vkey, receipts.DefaultOrigin, s.Body, proof, cp.Note)
	fmt.Println("verified:", got.Kind, got.JobID, receipts.FormatMicros(got.CostMicros), err)

	cheaper := bytes.Replace(s.Body, []byte(`"0.000618"`), []byte(`"0.000001"`), 1)
	_, err = receipts.Verify(vkey, receipts.DefaultOrigin, cheaper, proof, cp.Note)
	fmt.Println("tampered:", errors.Is(err, receipts.ErrBadProof))
	// Output:
	// charge: 1234 ms, 0.000343 h, 0.000618 USD
	// before sequencing: true
	// sequenced: 1
	// verified: job_charged job_1 0.000618 <nil>
	// tampered: true
}

func ExampleCost() {
	cost, _ := receipts.Cost(1234, 1, 1_802_000) // 617.69 micro-USD, rounded up
	fmt.Println(receipts.FormatMicros(cost))
	cost, _ = receipts.Cost(1, 1, 1) // a millisecond at the lowest rate
	fmt.Println(receipts.FormatMicros(cost))
	_, err := receipts.Cost(1<<62, 1<<20, 1<<40)
	fmt.Println(err != nil, errors.Is(err, receipts.ErrOverflow))
	fmt.Println(receipts.Hours(1234))
	// Output:
	// 0.000618
	// 0.000001
	// true true
	// 0.000343
}

func ExampleDecode() {
	body := []byte(`{"actor":"op","id":"rcp_1","kind":"envelope_deactivated","policy_version":5,"reason":"done","server_time":"2026-11-30T09:00:00.000000Z","v":1}`)
	r, err := receipts.Decode(body)
	fmt.Println(r.Kind, r.PolicyVersion, err)

	_, err = receipts.Decode(bytes.Replace(body, []byte(`"policy_version":5`), []byte(`"policy_version":5.0`), 1))
	fmt.Println(err)
	_, err = receipts.Decode(bytes.Replace(body, []byte(`"v":1`), []byte(`"v": 1`), 1))
	fmt.Println(errors.Is(err, receipts.ErrNotCanonical))
	// Output:
	// envelope_deactivated 5 <nil>
	// receipts: not canonical: at byte 75: "policy_version" is not an integer
	// true
}

func ExampleWitness() {
	ctx := context.Background()
	skey, vkey, _ := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	signer, _ := note.NewSigner(skey)
	store := receipts.NewMemoryStore()
	log := receipts.NewLog(store, nil)
	seq, _ := receipts.NewSequencer(store, signer, nil)
	w, _ := receipts.NewWitness(vkey, receipts.DefaultOrigin, nil)

	mint := func(n int) *receipts.Checkpoint {
		for i := range n {
			log.Mint(ctx, receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: fmt.Sprint("wrk_", i), Actor: "op"})
		}
		seq.Sequence(ctx)
		cp, _ := log.Checkpoint(ctx)
		return cp
	}
	first := mint(3)
	_, err := w.Update(first.Note, nil)
	fmt.Println("first:", first.Size, err)

	second := mint(2)
	proof, _ := log.ConsistencyProof(ctx, first.Size, second.Size)
	_, err = w.Update(second.Note, proof)
	fmt.Println("second:", second.Size, err)

	_, err = w.Update(first.Note, nil) // a log that went back in time
	fmt.Println("replayed first:", errors.Is(err, receipts.ErrRollback), w.Latest().Size)
	// Output:
	// first: 3 <nil>
	// second: 5 <nil>
	// replayed first: true 5
}
