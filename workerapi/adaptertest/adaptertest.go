// Package adaptertest runs every conformance suite of nodelane on an
// adapter's full set of stores in one call: the cores' suites (leasetest,
// credentialtest, replaytest, envelopetest, receiptstest,
// fingerprinttest) on each store of workerapi.Stores, and workerapitest
// on the set, whose stores must join the transactions of Stores.Tx. An
// adapter's test calls Run with a function that returns its Stores over a
// new, empty, migrated database, every field set; with bunstore (the
// example of this package shows it whole):
//
//	func TestStores(t *testing.T) {
//		adaptertest.Run(t, func(t *testing.T) workerapi.Stores {
//			db := openEmptyDatabase(t) // a *bunstore.DB, closed in t.Cleanup
//			n, err := db.Notifier(t.Context(), nil)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { n.Close() })
//			return workerapi.Stores{
//				Tx:           db,
//				Notifier:     n,
//				Leases:       db.LeaseStore(),
//				Credentials:  db.CredentialStore(),
//				Nonces:       db.NonceStore(&bunstore.NonceConfig{PerNode: replaytest.Quota}),
//				Envelope:     db.EnvelopeStore(),
//				Receipts:     db.ReceiptStore(),
//				Fingerprints: db.FingerprintStore(),
//				Clock:        db,
//				Schema:       db,
//			}
//		})
//	}
//
// Run does not run envelopetest.RunShared, whose cases need two store
// sets over one database, as two replicas' would be: an adapter whose
// replicas hold stores of their own (bunstore's handles, each with its
// cache) runs it itself, beside Run.
//
// Run's subtest Optional logs which optional interfaces the stores
// implement, and what a workerapi.Server does without each; see Run.
package adaptertest

import (
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/credential/credentialtest"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/envelope/envelopetest"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/lease/leasetest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/receipts/receiptstest"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/replay/replaytest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// Run runs every suite on stores made by newStores, each suite as a
// subtest named after the store it checks:
//
//   - Leases: leasetest.Run on Stores.Leases;
//   - Credentials: credentialtest.Run on Stores.Credentials;
//   - Nonces: replaytest.Run on Stores.Nonces, whose per-node quota must
//     be replaytest.Quota (the other suites do not mind it);
//   - Envelope: envelopetest.Run on Stores.Envelope;
//   - Receipts: receiptstest.Run on Stores.Receipts;
//   - Fingerprints: fingerprinttest.Run on Stores.Fingerprints;
//   - Transactions: workerapitest.Run on the set;
//   - Optional: the optional interfaces the stores implement, logged
//     with what a Server loses without each, and a check of those that
//     no suite exercises (Stores.Clock, Stores.Schema, a SignalNotifier).
//
// Every case of every suite calls newStores for stores of its own, and
// the cases run in parallel, so newStores is called concurrently and must
// return, each time, a full set over a new database that no other call
// reads or writes. Stores.Notifier and Stores.Fingerprints must be set,
// as workerapi.New requires; Clock and Schema may be nil.
func Run(t *testing.T, newStores func(t *testing.T) workerapi.Stores) {
	newStores = complete(newStores)
	suite(t, "Leases", newStores, leasetest.Run, func(st workerapi.Stores) lease.Store { return st.Leases })
	suite(t, "Credentials", newStores, credentialtest.Run, func(st workerapi.Stores) credential.Store { return st.Credentials })
	suite(t, "Nonces", newStores, replaytest.Run, func(st workerapi.Stores) replay.Store { return st.Nonces })
	suite(t, "Envelope", newStores, envelopetest.Run, func(st workerapi.Stores) envelope.Store { return st.Envelope })
	suite(t, "Receipts", newStores, receiptstest.Run, func(st workerapi.Stores) receipts.Store { return st.Receipts })
	suite(t, "Fingerprints", newStores, fingerprinttest.Run, func(st workerapi.Stores) fingerprint.Store { return st.Fingerprints })
	t.Run("Transactions", func(t *testing.T) {
		t.Parallel()
		workerapitest.Run(t, newStores)
	})
	t.Run("Optional", func(t *testing.T) {
		t.Parallel()
		testOptional(t, newStores(t))
	})
}

// suite runs, in parallel subtest name, a core's suite run on the store
// that pick takes from each new Stores.
func suite[S any](t *testing.T, name string, newStores func(t *testing.T) workerapi.Stores, run func(*testing.T, func(*testing.T) S), pick func(workerapi.Stores) S) {
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		run(t, func(t *testing.T) S { return pick(newStores(t)) })
	})
}

// complete wraps newStores to fail the test, rather than let a suite
// panic, when a Stores set lacks a store that workerapi.New requires.
func complete(newStores func(t *testing.T) workerapi.Stores) func(t *testing.T) workerapi.Stores {
	return func(t *testing.T) workerapi.Stores {
		t.Helper()
		st := newStores(t)
		if err := st.Validate(); err != nil {
			t.Fatalf("newStores returned incomplete Stores: %v", err)
		}
		return st
	}
}

// optional is one optional interface of the stores: whether st
// implements it, and what a Server does without it.
type optional struct {
	name    string
	has     bool
	without string
}

func optionals(st workerapi.Stores) []optional {
	return []optional{
		{"workerapi.SharedTransactor (Stores.Tx)", implements[workerapi.SharedTransactor](st.Tx),
			"each signed request but an upload runs in a transaction of its own (InTx): concurrent requests share no commit"},
		{"workerapi.SignalNotifier (Stores.Notifier)", implements[workerapi.SignalNotifier](st.Notifier),
			"a signal for one worker (a cancel, a ban or retirement, a drain, a lost job) calls Notify, which wakes every signals long-poll to read again, and so does every job dispatched"},
		{"lease.DrainStore (Stores.Leases)", implements[lease.DrainStore](st.Leases),
			"Manager.SetDrain fails with lease.ErrInvalidArgument: the operator's drain and resume answer 400 invalid_request"},
		{"lease.HeartbeatStore (Stores.Leases)", implements[lease.HeartbeatStore](st.Leases),
			"a heartbeat reads the worker and writes all of it back (GetWorker, PutWorker) rather than one write of what it changes"},
		{"lease.LeaseCounter (Stores.Leases)", implements[lease.LeaseCounter](st.Leases),
			"Explain reads the jobs of each matching worker rather than counting their leases in one call"},
		{"lease.StatsCounter (Stores.Leases)", implements[lease.StatsCounter](st.Leases),
			"Server.Stats and Server.Gauges fail with lease.ErrNoStats: no queue depth or worker liveness for metrics"},
		{"receipts.BatchAdder (Stores.Receipts)", implements[receipts.BatchAdder](st.Receipts),
			"Log.MintAll adds a request's receipts with one AddReceipt each"},
		{"workerapi.DatabaseClock (Stores.Clock)", st.Clock != nil,
			"the Server trusts Config.Now: replicas decide lease expiries and signature windows each by its own clock, and Ready reports nothing of the skew"},
		{"workerapi.SchemaChecker (Stores.Schema)", st.Schema != nil,
			"CheckReady does not check that the database's schema has every migration this build needs"},
	}
}

// deliver bounds how long a notification may take to arrive; a passing
// test never waits for it.
const deliver = 10 * time.Second

// testOptional logs what st implements, and checks what the suites do
// not: the database clock, the schema check and a SignalNotifier's
// per-worker wake-up.
func testOptional(t *testing.T, st workerapi.Stores) {
	for _, o := range optionals(st) {
		if o.has {
			t.Logf("implements %s", o.name)
		} else {
			t.Logf("does not implement %s: %s", o.name, o.without)
		}
	}
	ctx := t.Context()
	if st.Clock != nil {
		t.Run("Clock", func(t *testing.T) {
			// The database's clock reads without error, and not backwards.
			a, err := st.Clock.DatabaseTime(ctx)
			if err != nil {
				t.Fatalf("DatabaseTime: %v", err)
			}
			b, err := st.Clock.DatabaseTime(ctx)
			if err != nil {
				t.Fatalf("DatabaseTime, again: %v", err)
			}
			if a.IsZero() || b.Before(a) {
				t.Fatalf("DatabaseTime read %v, then %v: want a time, then none earlier", a, b)
			}
		})
	}
	if st.Schema != nil {
		t.Run("Schema", func(t *testing.T) {
			// newStores returns a migrated database.
			if err := st.Schema.CheckMigrations(ctx); err != nil {
				t.Fatalf("CheckMigrations of the database newStores returned: %v", err)
			}
		})
	}
	if sn, ok := st.Notifier.(workerapi.SignalNotifier); ok {
		t.Run("SignalNotifier", func(t *testing.T) {
			// NotifyWorker wakes that worker's subscription (workerapitest's
			// Notifier cases check Notify and Subscribe).
			ch, cancel := sn.SubscribeWorker("adaptertest-worker")
			defer cancel()
			if err := sn.NotifyWorker(ctx, "adaptertest-worker"); err != nil {
				t.Fatalf("NotifyWorker: %v", err)
			}
			receive(t, ch, "SubscribeWorker's channel after NotifyWorker of its worker")
		})
	}
}

// receive fails t unless ch receives within deliver.
func receive(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(deliver)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("%s received nothing in %v", what, deliver)
	}
}

// implements reports whether v implements T.
func implements[T any](v any) bool {
	_, ok := v.(T)
	return ok
}
