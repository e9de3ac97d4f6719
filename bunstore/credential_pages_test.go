package bunstore

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/credential"
)

// A page of credentials, of one principal or of all, is read from an
// index in id order and stops at its limit: the plan sorts nothing, so
// its cost does not grow with the credentials a principal holds.
func TestCredentialPagesUseAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db, err := Open(ctx, d.New(t).DSN, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for _, tc := range []struct {
				name  string
				f     credential.CredentialFilter
				index string
			}{
				{"one principal", credential.CredentialFilter{PrincipalID: "op", After: "0123", Limit: 100}, "nodelane_credentials_principal_id_idx"},
				{"one principal, first page", credential.CredentialFilter{PrincipalID: "op", Limit: 100}, "nodelane_credentials_principal_id_idx"},
				{"all", credential.CredentialFilter{After: "0123", Limit: 100}, ""},
			} {
				var rows []credentialRow
				q := credentialPage(db.Bun(), &rows, tc.f).String()
				plan := explain(t, db, q)
				if strings.Contains(plan, "TEMP B-TREE") || strings.Contains(plan, "Sort") {
					t.Errorf("%s: the plan sorts:\n%s\n%s", tc.name, q, plan)
				}
				if tc.index != "" && !strings.Contains(plan, tc.index) {
					t.Errorf("%s: the plan does not use %s:\n%s\n%s", tc.name, tc.index, q, plan)
				}
			}
		})
	}
}

// explain returns the plan of query, one line a step. On PostgreSQL,
// whose planner prefers a scan and a sort on a small table, sequential
// and bitmap scans and sorts are disabled (made very costly, so chosen
// only when nothing else can answer): a Sort left in the plan means that
// no index gives the order.
func explain(t *testing.T, db *DB, query string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Bun().BeginTx(ctx, &sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	prefix := "EXPLAIN QUERY PLAN "
	if db.postgres() {
		prefix = "EXPLAIN "
		for _, off := range []string{"enable_seqscan", "enable_bitmapscan", "enable_sort"} {
			if _, err := tx.ExecContext(ctx, "SET LOCAL "+off+" = off"); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := tx.QueryContext(ctx, prefix+query)
	if err != nil {
		t.Fatalf("%s%s: %v", prefix, query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		// The step is the last column: SQLite's detail, PostgreSQL's
		// QUERY PLAN line.
		switch v := vals[len(vals)-1].(type) {
		case []byte:
			lines = append(lines, string(v))
		case string:
			lines = append(lines, v)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
