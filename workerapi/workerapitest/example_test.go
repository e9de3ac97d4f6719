package workerapitest_test

import (
	"path/filepath"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// An adapter's test gives Run its Stores over a new, empty database for
// each case: here bunstore's, on a SQLite file in the case's temporary
// directory, with a Notifier of its own. An adapter of one's own returns its Transactor and its
// stores the same way, and runs the cores' suites (leasetest.Run,
// credentialtest.Run, ...) beside this one.
func ExampleRun() {
	testTransactions := func(t *testing.T) {
		workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
			db, err := bunstore.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "nodelane.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			n, err := db.Notifier(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			return workerapi.Stores{
				Tx:           db,
				Notifier:     n,
				Leases:       db.LeaseStore(),
				Credentials:  db.CredentialStore(),
				Nonces:       db.NonceStore(nil),
				Envelope:     db.EnvelopeStore(),
				Receipts:     db.ReceiptStore(),
				Fingerprints: db.FingerprintStore(),
			}
		})
	}
	_ = testTransactions // in an adapter's package: func TestTransactions(t *testing.T) { ... }
}
