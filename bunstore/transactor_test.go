package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// TestTransactor runs the transaction conformance suite on each dialect:
// DB.InTx carries one transaction, every store joins it, the Notifier
// wakes only once it has committed, and nothing of it commits after the
// database aborted it (on PostgreSQL, whose deadlock the suite provokes).
func TestTransactor(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
				db := open(t, d.New(t))
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
		})
	}
}
