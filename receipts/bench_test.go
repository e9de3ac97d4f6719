package receipts_test

import (
	"context"
	"testing"

	"github.com/nodelane/nodelane/receipts"
)

// BenchmarkInclusionProof measures Log.InclusionProof on a MemoryStore
// log of 16,384 receipts: the reads of the audit path and ProveRecord.
func BenchmarkInclusionProof(b *testing.B) {
	l := newTestLog(b, 1<<14)
	ctx := context.Background()
	size := int64(len(l.ss))
	i := int64(0)
	for b.Loop() {
		if _, err := l.log.InclusionProof(ctx, i%size, size); err != nil {
			b.Fatal(err)
		}
		i += 7919
	}
}

// BenchmarkConsistencyProof measures Log.ConsistencyProof between two
// sizes of a log of 16,384 receipts.
func BenchmarkConsistencyProof(b *testing.B) {
	l := newTestLog(b, 1<<14)
	ctx := context.Background()
	size := int64(len(l.ss))
	i := int64(1)
	for b.Loop() {
		if _, err := l.log.ConsistencyProof(ctx, 1+i%(size-1), size); err != nil {
			b.Fatal(err)
		}
		i += 7919
	}
}

// BenchmarkVerify measures offline verification of one receipt: opening
// the signed checkpoint, checking the inclusion proof in a tree of
// 16,384 and decoding the body canonically.
func BenchmarkVerify(b *testing.B) {
	l := newTestLog(b, 1<<14)
	cp := l.checkpoint(b)
	s := l.ss[12345]
	p := l.proof(b, 12345, cp.Size) // l.ss holds the receipts as minted, without index
	for b.Loop() {
		if _, err := receipts.Verify(l.vkey, origin, s.Body, p, cp.Note); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckInclusion is Verify without the signature and decoding:
// the Merkle path alone.
func BenchmarkCheckInclusion(b *testing.B) {
	l := newTestLog(b, 1<<14)
	cp := l.checkpoint(b)
	s := l.ss[12345]
	p := l.proof(b, 12345, cp.Size) // l.ss holds the receipts as minted, without index
	for b.Loop() {
		if err := receipts.CheckInclusion(cp, s.Body, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	r := golden()[receipts.KindJobCharged]
	for b.Loop() {
		if _, err := r.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	r := golden()[receipts.KindJobCharged]
	body, _ := r.Encode()
	for b.Loop() {
		if _, err := receipts.Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}
