package workerapi_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
)

// unsignedStore is a receipts.Store whose checkpoints are never stored, so
// that a Sequencer on it leaves its batches sequenced and unsigned, as a
// sequencer caught between its batch's commit and its checkpoint does.
type unsignedStore struct{ receipts.Store }

func (unsignedStore) AddCheckpoint(context.Context, *receipts.Checkpoint) error {
	return errors.New("unsignedStore: no checkpoint is stored")
}

// TestReceiptRouteWaitsForTheCheckpoint: a receipt already sequenced whose
// checkpoint is not signed yet is answered with its proof and a checkpoint
// that covers it, as for one not sequenced at all, rather than with a
// null proof (a Python SDK test met one, fetching the receipt of a start
// just after the background sequencer had committed its batch).
func TestReceiptRouteWaitsForTheCheckpoint(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	id := activateEnvelope(t, env)["receipt_id"].(string)

	skey, _, err := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := receipts.NewSequencer(unsignedStore{env.DB.ReceiptStore()}, signer, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := seq.Sequence(t.Context()); n != 1 || err == nil {
		t.Fatalf("Sequence on a store that keeps no checkpoint: %d, %v; want 1 and the publication's error", n, err)
	}

	m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+id, nil)
	if m["proof"] == nil || m["checkpoint"] == nil {
		t.Fatalf("a sequenced receipt whose checkpoint was not signed yet: answered %v, want its proof and a checkpoint", m)
	}
	if r := decodeReceipt(t, m["receipt"]); r.ID != id {
		t.Fatalf("answered receipt %s, want %s", r.ID, id)
	}
}
