package receiptexport

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/receipts"
)

const origin = "receiptexport.test/log"

// logOf returns a log of n sequenced receipts, its export by
// receipts.Log.Export, and its receipts as the operator list gives them.
func logOf(t *testing.T, n int) (export []byte, cp *receipts.Checkpoint, vkey string, listed []receipts.WireReceipt) {
	t.Helper()
	ctx := context.Background()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	store := receipts.NewMemoryStore()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	cfg := &receipts.Config{Origin: origin, BatchSize: 4, Now: func() time.Time { return now }}
	log := receipts.NewLog(store, cfg)
	seq, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		r := receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: fmt.Sprintf("wrk_%d", i), Actor: "operator", PolicyVersion: 1}
		if _, err := log.Mint(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for {
		k, err := seq.Sequence(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
	}
	var buf bytes.Buffer
	if cp, err = log.Export(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	stored, err := log.List(ctx, 0, n+10)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stored {
		listed = append(listed, s.Wire())
	}
	return buf.Bytes(), cp, vkey, listed
}

// Write gives, from the listed receipts, the bytes of the log's own
// export, proofs included; and Verify accepts them.
func TestWriteIsExport(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 7, 16, 33} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			want, cp, vkey, listed := logOf(t, n)
			var got bytes.Buffer
			if err := Write(&got, listed, cp.Size); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("Write:\n%s\nreceipts.Log.Export:\n%s", got.Bytes(), want)
			}
			if _, err := Verify(&got, cp.Note, vkey, origin); err != nil {
				t.Errorf("Verify: %v", err)
			}
			// An export of a smaller tree does not verify against the
			// checkpoint.
			if n > 1 {
				got.Reset()
				if err := Write(&got, listed, cp.Size-1); err != nil {
					t.Fatal(err)
				}
				var be *BadReceipt
				if _, err := Verify(&got, cp.Note, vkey, origin); !errors.As(err, &be) {
					t.Errorf("Verify of a short export: %v", err)
				}
			}
		})
	}
}

func TestWriteRefusesAListingOutOfOrder(t *testing.T) {
	t.Parallel()
	_, cp, _, listed := logOf(t, 5)
	// A listing longer than the checkpoint is cut at its size.
	var buf bytes.Buffer
	if err := Write(&buf, listed, cp.Size-2); err != nil || strings.Count(buf.String(), "\n") != 3 {
		t.Errorf("Write of 3 of 5: %v, %d lines", err, strings.Count(buf.String(), "\n"))
	}
	if err := Write(new(bytes.Buffer), listed[:4], cp.Size); err == nil {
		t.Error("a listing shorter than the checkpoint was written")
	}
	listed[1], listed[2] = listed[2], listed[1]
	if err := Write(new(bytes.Buffer), listed, cp.Size); err == nil || !strings.Contains(err.Error(), "not the log in order") {
		t.Errorf("a listing out of order: %v", err)
	}
}
