package nodelane_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// programOnly are modules that only the programs of cmd/ (their own
// module), the blobstore module or their tests use: an embedder of the
// library never gets them in its module graph.
var programOnly = []string{
	"github.com/chromedp/chromedp",
	"github.com/chromedp/cdproto",
	"github.com/letsencrypt/pebble/v2",
	"github.com/miekg/dns",
	"github.com/getkin/kin-openapi",
	"github.com/BurntSushi/toml",
	"golang.org/x/crypto", // acme/autocert, in cmd/server only
	"gocloud.dev",         // the blobstore module's, and cmd/server's through it
}

// libraryRequires are the modules the library's go.mod may require
// directly: what its packages import (bun and its dialects, pgx, the
// pure-Go SQLite, httpsfv, x/mod, x/sync, x/time, and the metrics and tracing adapters'
// libraries) and what its tests import (go-cmp, goleak, jsonschema).
var libraryRequires = []string{
	"github.com/uptrace/bun",
	"github.com/uptrace/bun/dialect/pgdialect",
	"github.com/uptrace/bun/dialect/sqlitedialect",
	"github.com/jackc/pgx/v5",
	"modernc.org/sqlite",
	"github.com/dunglas/httpsfv",
	"golang.org/x/mod",
	"golang.org/x/sync", // workerapi's body budget (semaphore)
	"golang.org/x/time", // the console's sign-in limiter
	"golang.org/x/sys",
	"github.com/prometheus/client_golang",
	"go.opentelemetry.io/otel",
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/trace",
	"github.com/google/go-cmp",
	"go.uber.org/goleak",
	"github.com/santhosh-tekuri/jsonschema/v6",
}

// TestLibraryRequires checks that the library's go.mod requires
// directly nothing but libraryRequires, and no program-only module even
// indirectly.
func TestLibraryRequires(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax("go.mod", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Require) == 0 {
		t.Fatal("go.mod requires nothing: the test checked nothing")
	}
	for _, r := range f.Require {
		if slices.Contains(programOnly, r.Mod.Path) {
			t.Errorf("go.mod requires %s, which only the programs of cmd/ use", r.Mod.Path)
		}
		if !r.Indirect && !slices.Contains(libraryRequires, r.Mod.Path) {
			t.Errorf("go.mod requires %s directly: the library module requires only what its packages and tests import (libraryRequires)", r.Mod.Path)
		}
	}
}

// TestEmbedderModuleGraph builds the module graph of a fresh module that
// imports only workerapi and bunstore, as a host service does, and checks
// that no program-only module is in it (go list -m all).
func TestEmbedderModuleGraph(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/host\n\ngo 1.26.0\n\nrequire "+module+" v0.0.0-00010101000000-000000000000\n\nreplace "+module+" => "+root+"\n")
	write("main.go", `package main

import (
	_ "`+module+`/bunstore"
	_ "`+module+`/workerapi"
)

func main() {}
`)
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("mod", "tidy")
	all := strings.Fields(gocmd("list", "-m", "all"))
	if !slices.Contains(all, "github.com/uptrace/bun") {
		t.Fatalf("go list -m all lacks bun: the graph was not built\n%s", strings.Join(all, "\n"))
	}
	for _, m := range all {
		if slices.Contains(programOnly, m) {
			t.Errorf("a module that imports workerapi and bunstore has %s in its graph", m)
		}
	}
}
