package apitest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
)

// stateTables are the tables whose rows make up the control plane's
// state: everything but the nonces (signed requests consume them
// whatever their outcome) and the migration bookkeeping.
var stateTables = []string{
	"nodelane_principals", "nodelane_credentials", "nodelane_envelope", "nodelane_envelope_history",
	"nodelane_jobs", "nodelane_job_events", "nodelane_artifacts", "nodelane_workers",
	"nodelane_receipts", "nodelane_receipt_hashes", "nodelane_receipt_tree", "nodelane_receipt_checkpoints",
	"nodelane_quotas",
}

// Dump returns every row of every state table, each table's rows as
// strings in a stable order, so that a test can check that a refused
// request changed nothing: compare a Dump before with one after. It first
// sequences the receipts minted so far, as the server's sequencer would
// in the background at any moment: a receipt a request minted still
// shows as a row, but the sequencer catching up between two Dumps does
// not show as a change.
func (e *Env) Dump(t testing.TB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	ctx := context.Background()
	if _, err := e.Server.Sequence(ctx); err != nil {
		t.Fatalf("apitest: dump: sequencing the receipts minted so far: %v", err)
	}
	for _, table := range stateTables {
		rows, err := e.DB.Bun().QueryContext(ctx, "SELECT * FROM "+table)
		if err != nil {
			t.Fatalf("apitest: dump %s: %v", table, err)
		}
		cols, err := rows.Columns()
		if err != nil {
			t.Fatalf("apitest: dump %s: %v", table, err)
		}
		var ss []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatalf("apitest: dump %s: %v", table, err)
			}
			var b strings.Builder
			for i, v := range vals {
				if raw, ok := v.([]byte); ok {
					v = fmt.Sprintf("%x", raw)
				}
				fmt.Fprintf(&b, "%s=%v ", cols[i], v)
			}
			ss = append(ss, b.String())
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatalf("apitest: dump %s: %v", table, err)
		}
		slices.Sort(ss)
		out[table] = ss
	}
	return out
}

// Credential mints a credential with scopes for an existing principal,
// living 24 h, and returns its token and id.
func (e *Env) Credential(t testing.TB, principal string, scopes ...credential.Scope) (token, id string) {
	t.Helper()
	tok, c, err := e.Server.Issuer().Mint(context.Background(), principal, scopes, 24*time.Hour)
	if err != nil {
		t.Fatalf("apitest: credential for %s: %v", principal, err)
	}
	return tok, c.ID
}
