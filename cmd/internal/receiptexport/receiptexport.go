// Package receiptexport writes and checks exports of a nodelane receipt
// log: one JSON receipts.ExportLine per receipt in index order, and the
// signed checkpoint note they hash to. cmd/verify-receipts and
// cmd/nodelanectl share it.
package receiptexport

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

// ReadError is a failure to read the export, as opposed to an export that
// does not verify.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// BadReceipt names the first receipt that does not verify.
type BadReceipt struct {
	Index int64 // the position in the log the line should hold
	Line  int
	ID    string
	Err   error
}

func (e *BadReceipt) Error() string {
	id := ""
	if e.ID != "" {
		id = " " + e.ID
	}
	return fmt.Sprintf("receipt %d (line %d%s): %v", e.Index, e.Line, id, e.Err)
}

func (e *BadReceipt) Unwrap() error { return e.Err }

// exportLine is receipts.ExportLine, read strictly.
type exportLine struct {
	ID    *string         `json:"id"`
	Kind  *receipts.Kind  `json:"kind"`
	Index *int64          `json:"index"`
	Body  []byte          `json:"body"`
	Proof *receipts.Proof `json:"proof"`
}

// MaxLine bounds one line: a body of at most 64 KiB in base64 and a proof.
const MaxLine = 1 << 20

// Verify checks the export read from r against the signed checkpoint,
// with nothing but the log's note verifier key and origin: the
// checkpoint's signature, the canonical form of every receipt, that the
// receipts are the log's indices 0 to size-1 in order, each inclusion
// proof the export carries, and that the receipts hash to the
// checkpoint's root. It returns the checkpoint. A failure to read r is a
// *ReadError; a receipt that does not verify, a *BadReceipt.
func Verify(r io.Reader, signed []byte, key, origin string) (*receipts.Checkpoint, error) {
	cp, err := receipts.OpenCheckpoint(signed, key, origin)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var hashes memHashes // the stored hashes of the tree recomputed here
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	n := int64(0) // receipts read, and the index the next must have
	proofs := true
	for line := 1; sc.Scan(); line++ {
		bad := func(id string, format string, args ...any) error {
			return &BadReceipt{Index: n, Line: line, ID: id, Err: fmt.Errorf(format, args...)}
		}
		var l exportLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil || dec.More() {
			return nil, bad("", "not a receipt line: %v", err)
		}
		if l.ID == nil || l.Kind == nil || l.Body == nil {
			return nil, bad("", "id, kind or body is missing")
		}
		if l.Index == nil {
			return nil, bad(*l.ID, "it has no index")
		}
		if *l.Index != n {
			return nil, bad(*l.ID, "it has index %d: a receipt is missing, repeated or out of order", *l.Index)
		}
		if n >= cp.Size {
			return nil, bad(*l.ID, "the checkpoint's tree has only %d receipts", cp.Size)
		}
		rec, err := receipts.Decode(l.Body)
		if err != nil {
			return nil, bad(*l.ID, "body: %w", err)
		}
		if rec.ID != *l.ID || rec.Kind != *l.Kind {
			return nil, bad(*l.ID, "the line says %s %s, the body %s %s", *l.Kind, *l.ID, rec.Kind, rec.ID)
		}
		if l.Proof == nil {
			proofs = false
		} else {
			if l.Proof.Index != n {
				return nil, bad(*l.ID, "its proof is for index %d", l.Proof.Index)
			}
			if err := receipts.CheckInclusion(cp, l.Body, *l.Proof); err != nil {
				return nil, bad(*l.ID, "not in the checkpoint's tree: %w", err)
			}
		}
		hs, err := tlog.StoredHashesForRecordHash(n, tlog.RecordHash(l.Body), hashes)
		if err != nil {
			return nil, err
		}
		hashes = append(hashes, hs...)
		n++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &BadReceipt{Index: n, Line: int(n) + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLine)}
		}
		return nil, &ReadError{err}
	}
	if n < cp.Size {
		return nil, &BadReceipt{Index: n, Line: int(n) + 1, Err: fmt.Errorf("missing: the export ends after %d receipts, the checkpoint has %d", n, cp.Size)}
	}
	root, err := tlog.TreeHash(n, hashes)
	if err != nil {
		return nil, err
	}
	if root != cp.Root {
		// With proofs, a receipt that does not belong fails its own; only
		// an export without them gets here.
		what := "the receipts do not hash to the checkpoint's root"
		if !proofs {
			what += " (the export has no proofs to tell which receipt is bad)"
		}
		return nil, errors.New(what)
	}
	return cp, nil
}

// Write writes the export of the log's first size receipts, given in
// index order (recs may hold more; those after size are left out), to w:
// one receipts.ExportLine per receipt, with its inclusion proof in the
// tree of size receipts, computed here from the receipts themselves. It
// fails if recs are not the indices 0 to size-1 in order. Write checks
// nothing against a checkpoint: Verify does.
func Write(w io.Writer, recs []receipts.WireReceipt, size int64) error {
	if int64(len(recs)) < size {
		return fmt.Errorf("the log lists %d receipts, the checkpoint has %d", len(recs), size)
	}
	var hashes memHashes
	for i := range size {
		r := recs[i]
		if r.Index == nil || *r.Index != i {
			return fmt.Errorf("receipt %s is listed at position %d with index %v: the listing is not the log in order", r.ID, i, r.Index)
		}
		hs, err := tlog.StoredHashesForRecordHash(i, tlog.RecordHash(r.Body), hashes)
		if err != nil {
			return err
		}
		hashes = append(hashes, hs...)
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range size {
		p, err := tlog.ProveRecord(size, i, hashes)
		if err != nil {
			return err
		}
		if p == nil {
			p = []tlog.Hash{}
		}
		if err := enc.Encode(receipts.ExportLine{WireReceipt: recs[i], Proof: &receipts.Proof{Index: i, TreeSize: size, Hashes: p}}); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// memHashes holds stored hashes by stored-hash index.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("stored hash %d is not computed yet", x)
		}
		out[i] = m[x]
	}
	return out, nil
}
