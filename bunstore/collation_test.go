package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/internal/testdb"
)

// TestPostgresKeysCollateAsBytes: on PostgreSQL, every text column of a
// primary key of nodelane's tables collates as "C", so that the stores
// order and page by bytes, as their contracts say, in a database whose
// default collation is a language's (en_US.UTF-8 orders "b" before "C").
// Equality needs nothing: PostgreSQL's deterministic collations compare
// equal only what is equal byte for byte.
func TestPostgresKeysCollateAsBytes(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.Postgres(t))
	rows, err := db.Bun().QueryContext(t.Context(), `
		SELECT c.table_name, c.column_name, COALESCE(c.collation_name, '')
		FROM information_schema.table_constraints tc
		JOIN information_schema.key_column_usage k
			ON k.constraint_schema = tc.constraint_schema AND k.constraint_name = tc.constraint_name
		JOIN information_schema.columns c
			ON c.table_schema = k.table_schema AND c.table_name = k.table_name AND c.column_name = k.column_name
		WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = current_schema()
			AND tc.table_name LIKE 'nodelane%' AND c.data_type = 'text'
		ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var table, col, coll string
		if err := rows.Scan(&table, &col, &coll); err != nil {
			t.Fatal(err)
		}
		n++
		if coll != "C" {
			t.Errorf("%s.%s, a primary key column, collates as %q, want \"C\"", table, col, coll)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("found no text primary key column: the query reads the wrong schema")
	}
}
