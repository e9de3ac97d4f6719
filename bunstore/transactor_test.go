package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// TestTransactor runs the transaction conformance suite on each dialect:
// DB.InTx carries one transaction, and every store joins it.
func TestTransactor(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
				db := open(t, d.New(t))
				return workerapi.Stores{
					Tx:          db,
					Leases:      db.LeaseStore(),
					Credentials: db.CredentialStore(),
					Nonces:      db.NonceStore(nil),
					Envelope:    db.EnvelopeStore(),
					Receipts:    db.ReceiptStore(),
				}
			})
		})
	}
}
