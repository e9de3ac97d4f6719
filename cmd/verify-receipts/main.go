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
// The checks are package cmd/internal/receiptexport's, which
// cmd/nodelanectl shares. The exit status is 0 if the export verifies, 1 if it does not (the
// message names the checkpoint or the first bad receipt), and 2 for a
// usage or I/O error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nodelane/nodelane/cmd/internal/receiptexport"
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
	cp, err := receiptexport.Verify(in, signed, *key, *origin)
	var ioErr *receiptexport.ReadError
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
