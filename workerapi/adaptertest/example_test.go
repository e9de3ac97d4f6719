package adaptertest_test

import (
	"path/filepath"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/replay/replaytest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/adaptertest"
)

// An adapter's test gives Run a full Stores set over a new, empty
// database for each case: here bunstore's, on a SQLite file in the case's
// temporary directory, with its Notifier, a nonce quota of
// replaytest.Quota, and the DB as the database clock and schema checker.
// (It runs no suite here: an example cannot run a test.)
func ExampleRun() {
	testStores := func(t *testing.T) {
		adaptertest.Run(t, func(t *testing.T) workerapi.Stores {
			db, err := bunstore.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "nodelane.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			n, err := db.Notifier(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				n.Close()
				db.Close()
			})
			return workerapi.Stores{
				Tx:           db,
				Notifier:     n,
				Leases:       db.LeaseStore(),
				Credentials:  db.CredentialStore(),
				Nonces:       db.NonceStore(&bunstore.NonceConfig{PerNode: replaytest.Quota}),
				Envelope:     db.EnvelopeStore(),
				Receipts:     db.ReceiptStore(),
				Fingerprints: db.FingerprintStore(),
				Clock:        db,
				Schema:       db,
			}
		})
	}
	_ = testStores // in an adapter's package: func TestStores(t *testing.T) { ... }
}
