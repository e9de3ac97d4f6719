package main

import (
	"io"
	"net/http"
	"regexp"
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
			code, b := fetch(t, "http://"+s.addr+"/metrics", operatorToken(t, s.stdout.String()))
			if code != http.StatusOK {
				t.Fatalf("GET /metrics: %d %s", code, b)
			}
			for _, want := range []string{
				`go_sql_max_open_connections{db_name="nodelane"} 7`,
				`go_sql_wait_count_total{db_name="nodelane"} `,
				`go_sql_wait_duration_seconds_total{db_name="nodelane"} `,
			} {
				if !strings.Contains(b, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}

// -pprof-addr serves Go's profiles on an address of its own, and never on
// the API's.
func TestPprofAddr(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialects()[0])
	s := serve(t, append(f.args("127.0.0.1:0"), "-pprof-addr", "127.0.0.1:0")...)
	m := regexp.MustCompile(`msg="serving profiles" pprof_addr=(\S+)`).FindStringSubmatch(s.stderr.String())
	if m == nil {
		t.Fatalf("the server did not log where it serves profiles:\n%s", s.stderr.String())
	}
	for _, c := range []struct {
		url  string
		want int
	}{
		{"http://" + m[1] + "/debug/pprof/goroutine?debug=1", http.StatusOK},
		{"http://" + s.addr + "/debug/pprof/goroutine?debug=1", http.StatusNotFound},
	} {
		resp, err := http.Get(c.url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s: %d, want %d", c.url, resp.StatusCode, c.want)
		}
		if c.want == http.StatusOK && !strings.Contains(string(b), "goroutine profile:") {
			t.Errorf("GET %s: not a goroutine profile:\n%.200s", c.url, b)
		}
	}
}
