package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/replay/replaytest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/adaptertest"
)

// TestAdapter runs every conformance suite (adaptertest.Run: the cores'
// suites on each store, workerapitest on the set) on each dialect, over a
// full set of bunstore's stores on a database of their own for each case.
// Only envelopetest.RunShared, which needs two handles on one database,
// runs apart (TestEnvelopeStoreReplicas).
func TestAdapter(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			adaptertest.Run(t, func(t *testing.T) workerapi.Stores { return fullStores(t, open(t, d.New(t))) })
		})
	}
}

// fullStores is every store of db, with a Notifier closed when the test
// ends (before db, whose cleanup was registered earlier), and a nonce
// quota of replaytest.Quota, which replaytest needs.
func fullStores(t *testing.T, db *bunstore.DB) workerapi.Stores {
	t.Helper()
	n, err := db.Notifier(t.Context(), nil)
	if err != nil {
		t.Fatalf("Notifier: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Notifier.Close: %v", err)
		}
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
}
