package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/receipts"
)

// initSecrets is the init-secrets subcommand: it creates the secrets
// file (0600, never overwriting one) and prints its path and the receipt
// log's public key, never a secret. A deployment that hands the file to
// the server read-only (systemd's LoadCredential, cmd/deploy) makes
// it with this before the first start.
func initSecrets(args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("server init-secrets", flag.ContinueOnError)
	flags.SetOutput(stderr)
	secretsFile := flags.String("secrets-file", "nodelane-secrets.json", "the secrets file to create (0600); an existing one is never overwritten")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: server init-secrets -secrets-file PATH\n\n"+
			"Creates the pepper and receipt signing key the servers of one database share, and prints the receipt public key.")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("init-secrets: unexpected argument %q", flags.Arg(0))
	}
	if _, err := os.Lstat(*secretsFile); !errors.Is(err, fs.ErrNotExist) {
		if err == nil {
			return fmt.Errorf("init-secrets: %s exists: it is never overwritten (its database needs those very secrets)", *secretsFile)
		}
		return fmt.Errorf("init-secrets: %w", err)
	}
	sec, err := controlplane.LoadOrCreateSecrets(*secretsFile, receipts.DefaultOrigin)
	if err != nil {
		return fmt.Errorf("init-secrets: %w", err)
	}
	key, err := receipts.VerifierKey(sec.ReceiptSigner)
	if err != nil {
		return fmt.Errorf("init-secrets: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "secrets file:       %s\nreceipt public key: %s\n", *secretsFile, key)
	return err
}
