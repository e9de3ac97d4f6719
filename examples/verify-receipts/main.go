// Command verify-receipts checks an export of a nodelane receipt log
// offline, with nothing but the log's verifier key: the signed checkpoint,
// the canonical form of every receipt, that the receipts are the log's
// indices 0 to size-1 in order, that each receipt's inclusion proof (when
// the export carries one) holds against the checkpoint, and that the
// receipts, hashed into an RFC 6962 tree recomputed here, give the
// checkpoint's size and root.
//
// Usage:
//
//	verify-receipts -key VERIFIER_KEY [-origin ORIGIN] -checkpoint FILE [RECEIPTS]
//
// RECEIPTS (standard input if absent or "-") holds one JSON receipt per
// line, {"id", "kind", "index", "body", "proof"}, as receipts.Log.Export
// writes it; FILE is the signed checkpoint note Export returned.
// VERIFIER_KEY is the note verifier key (the control plane's
// receipt_public_key) and ORIGIN the log's checkpoint origin.
//
// The exit status is 0 if the export verifies, 1 if it does not (the
// message names the checkpoint or the first bad receipt), and 2 for a
// usage or I/O error.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK      = 0
	exitInvalid = 1
	exitUsage   = 2
)

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify-receipts", flag.ContinueOnError)
	fs.SetOutput(stderr)
	key := fs.String("key", "", "the log's note verifier key (receipt_public_key)")
	origin := fs.String("origin", receipts.DefaultOrigin, "the log's checkpoint origin")
	checkpoint := fs.String("checkpoint", "", "the signed checkpoint `file`")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: verify-receipts -key VERIFIER_KEY [-origin ORIGIN] -checkpoint FILE [RECEIPTS]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *key == "" || *checkpoint == "" || fs.NArg() > 1 {
		fs.Usage()
		return exitUsage
	}
	signed, err := os.ReadFile(*checkpoint)
	if err != nil {
		fmt.Fprintln(stderr, "verify-receipts:", err)
		return exitUsage
	}
	in := stdin
	if name := fs.Arg(0); name != "" && name != "-" {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(stderr, "verify-receipts:", err)
			return exitUsage
		}
		defer f.Close()
		in = f
	}
	cp, err := verify(in, signed, *key, *origin)
	var ioErr *readError
	switch {
	case errors.As(err, &ioErr):
		fmt.Fprintln(stderr, "verify-receipts:", err)
		return exitUsage
	case err != nil:
		fmt.Fprintln(stderr, "verify-receipts: FAIL:", err)
		return exitInvalid
	}
	fmt.Fprintf(stdout, "ok: %d receipts of %s verified against the checkpoint of %d, root %s\n", cp.Size, cp.Origin, cp.Size, cp.Root)
	return exitOK
}

// readError is a failure to read the export, as opposed to an export that
// does not verify.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// badReceipt names the first receipt that does not verify.
type badReceipt struct {
	index int64 // the position in the log the line should hold
	line  int
	id    string
	err   error
}

func (e *badReceipt) Error() string {
	id := ""
	if e.id != "" {
		id = " " + e.id
	}
	return fmt.Sprintf("receipt %d (line %d%s): %v", e.index, e.line, id, e.err)
}

func (e *badReceipt) Unwrap() error { return e.err }

// exportLine is receipts.ExportLine, read strictly.
type exportLine struct {
	ID    *string         `json:"id"`
	Kind  *receipts.Kind  `json:"kind"`
	Index *int64          `json:"index"`
	Body  []byte          `json:"body"`
	Proof *receipts.Proof `json:"proof"`
}

// maxLine bounds one line: a body of at most 64 KiB in base64 and a proof.
const maxLine = 1 << 20

// verify checks the export read from r against the signed checkpoint and
// returns the checkpoint.
func verify(r io.Reader, signed []byte, key, origin string) (*receipts.Checkpoint, error) {
	cp, err := receipts.OpenCheckpoint(signed, key, origin)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var hashes memHashes // the stored hashes of the tree recomputed here
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	n := int64(0) // receipts read, and the index the next must have
	proofs := true
	for line := 1; sc.Scan(); line++ {
		bad := func(id string, format string, args ...any) error {
			return &badReceipt{index: n, line: line, id: id, err: fmt.Errorf(format, args...)}
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
			return nil, &badReceipt{index: n, line: int(n) + 1, err: fmt.Errorf("line longer than %d bytes", maxLine)}
		}
		return nil, &readError{err}
	}
	if n < cp.Size {
		return nil, &badReceipt{index: n, line: int(n) + 1, err: fmt.Errorf("missing: the export ends after %d receipts, the checkpoint has %d", n, cp.Size)}
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
