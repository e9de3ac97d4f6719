package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/testdb"
)

// -db-max-conns sizes the database pool, and /metrics shows the pool:
// its size and its waits, on every dialect.
func TestDBMaxConns(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, d)
			s := serve(t, append(f.args("127.0.0.1:0"), "-db-max-conns", "7")...)
			resp, err := http.Get("http://" + s.addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				`go_sql_max_open_connections{db_name="nodelane"} 7`,
				`go_sql_wait_count_total{db_name="nodelane"} `,
				`go_sql_wait_duration_seconds_total{db_name="nodelane"} `,
			} {
				if !strings.Contains(string(b), want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}
