package nodelane_test

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/nodelane/nodelane"

// cores are the core packages of docs/DESIGN.md section 1: the five, and
// fingerprint.
var cores = []string{"lease", "credential", "replay", "envelope", "receipts", "fingerprint"}

// testclock and waitfor are the packages of the module, besides its
// core, that a conformance suite may import: the fake clock the suites
// share, and the wait for a condition. Both are leaves that import only
// the standard library.
const (
	testclock = "internal/testclock"
	waitfor   = "internal/waitfor"
)

// workerapitest is the conformance suite of workerapi's storage contract
// (every store joins the Transactor's transaction). Like a core's suite it
// drives stores through their interfaces only, so it imports workerapi,
// the cores, the standard library and go-cmp, and nothing of an adapter:
// no bunstore, no bun, no driver, no internal helper. golang.org/x and
// the cores' own third-party packages come in with the cores.
const workerapitest = "workerapi/workerapitest"

// artifacttest is the conformance suite of workerapi.ArtifactStore (and
// its memory store for tests). It imports what workerapitest may, and
// internal/waitfor, like a core's suite; nothing of an adapter: no
// blobstore (a module of its own), no gocloud.dev, no bunstore.
const artifacttest = "workerapi/artifacttest"

// pollNotify is the polling Notifier for databases without LISTEN/NOTIFY:
// it works through database/sql and its own small interfaces, and of
// nodelane imports workerapi (whose LocalNotifier holds its subscribers)
// and what that imports, never an adapter or a driver, so that any host
// or adapter may use it.
const pollNotify = "workerapi/pollnotify"

// adaptertest runs every suite on an adapter's full store set: of
// nodelane it imports workerapi, the cores, their conformance suites,
// workerapitest and what those import (workerapi/wire, the test clock,
// waitfor); of the rest, what they import (go-cmp, golang.org/x, the
// cores' own). Nothing of an adapter: no bunstore, no bun, no driver.
const adaptertest = "workerapi/adaptertest"

// allowedThirdParty lists, per core, what beyond the standard library and
// golang.org/x it may import.
var allowedThirdParty = map[string][]string{
	"replay": {"github.com/dunglas/httpsfv"},
}

// workerSide are the packages a worker binary is made of; workerLinks is
// all of nodelane they may link besides each other: no lease,
// credential, envelope, bunstore or bun.
var (
	workerSide  = []string{"workerapi/client", "cmd/worker", "cmd/internal/jobs", "cmd/internal/command", "cmd/internal/gpu"}
	workerLinks = []string{"workerapi/wire", "replay", "receipts"}
)

// operatorClient is the Go client of the operator routes: like a worker,
// an operator tool links no server code, so of nodelane it imports
// workerapi/wire and receipts only, and no storage driver.
const operatorClient = "workerapi/operator"

// adapters are the packages that export a workerapi.Server's metrics and
// traces to a third-party library: only they (and the programs of cmd/, hosts) import
// one, so that workerapi and the cores stay free of them. Of nodelane they
// import workerapi, workerapi/wire and the cores; never bunstore or bun.
var adapters = []string{"workerapi/prommetrics", "workerapi/oteltrace"}

// coreThirdParty reports whether d is a third-party package some core
// may import (allowedThirdParty).
func coreThirdParty(d string) bool {
	for _, ps := range allowedThirdParty {
		if slices.ContainsFunc(ps, func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") }) {
			return true
		}
	}
	return false
}

// storageDriver reports whether d is a database library.
func storageDriver(d string) bool {
	for _, p := range []string{"github.com/uptrace/bun", "github.com/jackc/", "modernc.org/", "github.com/lib/pq"} {
		if strings.HasPrefix(d, p) {
			return true
		}
	}
	return false
}

// violations returns the import rules of docs/DESIGN.md section 1 that package pkg
// (relative to the module, "" for the root) breaks, given all its
// transitive dependencies and which of them are in the standard library.
func violations(pkg string, deps []string, std map[string]bool) []string {
	var out []string
	rel := func(d string) (string, bool) {
		if d == module {
			return "", true
		}
		r, ok := strings.CutPrefix(d, module+"/")
		return r, ok
	}
	isCore := slices.Contains(cores, pkg)
	coreOfTest := ""
	for _, c := range cores {
		if pkg == c+"/"+c[strings.LastIndex(c, "/")+1:]+"test" {
			coreOfTest = c
		}
	}
	for _, d := range deps {
		if std[d] {
			continue
		}
		r, own := rel(d)
		switch {
		case isCore:
			if own || !(strings.HasPrefix(d, "golang.org/x/") || slices.ContainsFunc(allowedThirdParty[pkg], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })) {
				out = append(out, pkg+" imports "+d+": a core imports only the standard library and golang.org/x")
			}
			continue
		case coreOfTest != "":
			thirdOK := strings.HasPrefix(d, "github.com/google/go-cmp/") || strings.HasPrefix(d, "golang.org/x/") ||
				slices.ContainsFunc(allowedThirdParty[coreOfTest], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })
			if (own && r != coreOfTest && r != testclock && r != waitfor) || (!own && !thirdOK) {
				out = append(out, pkg+" imports "+d+": a conformance suite imports only its core, "+testclock+", "+waitfor+", the standard library and go-cmp")
			}
			continue
		case pkg == testclock || pkg == waitfor:
			out = append(out, pkg+" imports "+d+": "+pkg+" imports only the standard library")
			continue
		case pkg == pollNotify:
			ownOK := r == "workerapi" || r == "workerapi/wire" || slices.Contains(cores, r)
			thirdOK := strings.HasPrefix(d, "golang.org/x/") ||
				slices.ContainsFunc(cores, func(c string) bool {
					return slices.ContainsFunc(allowedThirdParty[c], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })
				})
			if (own && !ownOK) || (!own && !thirdOK) {
				out = append(out, pkg+" imports "+d+": "+pkg+" imports only workerapi, workerapi/wire, the cores and what they import: no adapter, no driver")
			}
			continue
		case pkg == workerapitest:
			ownOK := r == "workerapi" || r == "workerapi/wire" || slices.Contains(cores, r)
			thirdOK := strings.HasPrefix(d, "github.com/google/go-cmp/") || strings.HasPrefix(d, "golang.org/x/") ||
				slices.ContainsFunc(cores, func(c string) bool {
					return slices.ContainsFunc(allowedThirdParty[c], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })
				})
			if (own && !ownOK) || (!own && !thirdOK) {
				out = append(out, pkg+" imports "+d+": "+workerapitest+" imports only workerapi, the cores, the standard library and go-cmp")
			}
			continue
		case pkg == adaptertest:
			suite := slices.ContainsFunc(cores, func(c string) bool { return r == c+"/"+c[strings.LastIndex(c, "/")+1:]+"test" })
			ownOK := r == "workerapi" || r == "workerapi/wire" || r == workerapitest || r == testclock || r == waitfor ||
				slices.Contains(cores, r) || suite
			thirdOK := strings.HasPrefix(d, "github.com/google/go-cmp/") || strings.HasPrefix(d, "golang.org/x/") ||
				slices.ContainsFunc(cores, func(c string) bool {
					return slices.ContainsFunc(allowedThirdParty[c], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })
				})
			if (own && !ownOK) || (!own && !thirdOK) {
				out = append(out, pkg+" imports "+d+": "+adaptertest+" imports only workerapi, the cores, their suites, "+workerapitest+", "+testclock+", "+waitfor+", the standard library and go-cmp")
			}
			continue
		case pkg == artifacttest:
			ownOK := r == "workerapi" || r == "workerapi/wire" || r == waitfor || slices.Contains(cores, r)
			thirdOK := strings.HasPrefix(d, "github.com/google/go-cmp/") || strings.HasPrefix(d, "golang.org/x/") ||
				slices.ContainsFunc(cores, func(c string) bool {
					return slices.ContainsFunc(allowedThirdParty[c], func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") })
				})
			if (own && !ownOK) || (!own && !thirdOK) {
				out = append(out, pkg+" imports "+d+": "+artifacttest+" imports only workerapi, the cores, "+waitfor+", the standard library and go-cmp")
			}
			continue
		}
		if own && strings.HasSuffix(r, "test") && (r == workerapitest || r == artifacttest || r == adaptertest || slices.ContainsFunc(cores, func(c string) bool { return strings.HasPrefix(r, c+"/") })) {
			out = append(out, pkg+" imports "+d+": production code never imports a conformance suite")
		}
		if pkg == "bunstore" && own && (r == "workerapi" || strings.HasPrefix(r, "workerapi/")) {
			out = append(out, pkg+" imports "+d+": bunstore never imports workerapi")
		}
		if pkg == "workerapi" && ((own && (r == "bunstore" || strings.HasPrefix(r, "bunstore/"))) || strings.HasPrefix(d, "github.com/uptrace/bun")) {
			out = append(out, pkg+" imports "+d+": workerapi never imports bunstore or bun")
		} else if pkg == "workerapi" && !own && !strings.HasPrefix(d, "golang.org/x/") && !coreThirdParty(d) {
			out = append(out, pkg+" imports "+d+": workerapi imports the cores and the standard library (metrics and traces live in "+strings.Join(adapters, ", ")+")")
		}
		if slices.Contains(adapters, pkg) && ((own && r != "workerapi" && r != "workerapi/wire" && !slices.Contains(cores, r)) || storageDriver(d)) {
			out = append(out, pkg+" imports "+d+": an adapter imports of nodelane only workerapi, workerapi/wire and the cores, and no storage driver")
		}
		if pkg == "workerapi/wire" && ((own && r != "receipts") || (!own && !strings.HasPrefix(d, "golang.org/x/"))) {
			out = append(out, pkg+" imports "+d+": the wire package imports only receipts, the standard library and golang.org/x")
		}
		if pkg == operatorClient && ((own && r != "workerapi/wire" && r != "receipts") || (!own && !strings.HasPrefix(d, "golang.org/x/"))) {
			out = append(out, pkg+" imports "+d+": the operator client imports only workerapi/wire, receipts, the standard library and golang.org/x")
		}
		if pkg == "console" && ((own && r != "workerapi/wire" && r != "receipts" && r != operatorClient) || (!own && !strings.HasPrefix(d, "golang.org/x/"))) {
			out = append(out, pkg+" imports "+d+": the console imports only "+operatorClient+", workerapi/wire, receipts, the standard library and golang.org/x")
		}
		if slices.Contains(workerSide, pkg) && ((own && !slices.Contains(workerLinks, r) && !slices.Contains(workerSide, r)) || storageDriver(d)) {
			out = append(out, pkg+" imports "+d+": a worker links only "+strings.Join(workerLinks, ", ")+" of nodelane, and no storage driver")
		}
	}
	return out
}

// goList runs go list in dir: "." for the library module, "cmd" for the
// programs' module.
func goList(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestImportRules enforces docs/DESIGN.md section 1 on every package of
// the three modules (the library, the programs of cmd/, blobstore), with the
// dependencies that go list -deps reports.
func TestImportRules(t *testing.T) {
	std := map[string]bool{}
	var pkgs []string
	for _, dir := range []string{".", "cmd", "blobstore"} {
		for _, line := range goList(t, dir, "-deps", "-f", "{{.ImportPath}} {{.Standard}}", "./...") {
			path, isStd, _ := strings.Cut(line, " ")
			std[path] = isStd == "true"
		}
		pkgs = append(pkgs, goList(t, dir, "-f", "{{.ImportPath}}|{{join .Deps \" \"}}", "./...")...)
	}
	seen, programs := 0, 0
	for _, line := range pkgs {
		path, deps, _ := strings.Cut(line, "|")
		rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		if slices.Contains(cores, rel) {
			seen++
		}
		if slices.Contains(workerSide, rel) {
			programs++
		}
		for _, v := range violations(rel, strings.Fields(deps), std) {
			t.Error(v)
		}
	}
	if seen == 0 || programs == 0 {
		t.Fatalf("go list found %d core packages and %d worker-side packages of cmd/: the test checked too little", seen, programs)
	}
}

// TestViolations shows that the rules catch what they forbid.
func TestViolations(t *testing.T) {
	std := map[string]bool{"fmt": true}
	tests := []struct {
		pkg  string
		deps []string
		want int
	}{
		{"lease", []string{"fmt", "golang.org/x/crypto/hkdf"}, 0},
		{"lease", []string{module + "/credential"}, 1},
		{"lease", []string{"github.com/uptrace/bun"}, 1},
		{"lease", []string{module + "/bunstore"}, 1},
		{"replay", []string{"github.com/dunglas/httpsfv"}, 0},
		{"credential", []string{"github.com/dunglas/httpsfv"}, 1},
		{"lease/leasetest", []string{module + "/lease", "github.com/google/go-cmp/cmp"}, 0},
		{"lease/leasetest", []string{module + "/credential"}, 1},
		{"lease/leasetest", []string{"github.com/uptrace/bun"}, 1},
		{"lease/leasetest", []string{module + "/lease", module + "/internal/testclock"}, 0},
		{"credential/credentialtest", []string{module + "/credential", module + "/internal/testclock", "fmt"}, 0},
		{"lease/leasetest", []string{module + "/internal/testclock", module + "/internal/testdb"}, 1},
		{"envelope/envelopetest", []string{module + "/internal/apitest"}, 1},
		{"internal/testclock", []string{"fmt"}, 0},
		{"internal/testclock", []string{module + "/lease"}, 1},
		{"internal/testclock", []string{"github.com/google/go-cmp/cmp"}, 1},
		{"receipts/receiptstest", []string{module + "/receipts", module + "/internal/waitfor"}, 0},
		{"internal/waitfor", []string{"fmt"}, 0},
		{"internal/waitfor", []string{module + "/internal/testclock"}, 1},
		{"bunstore", []string{module + "/lease", "github.com/uptrace/bun"}, 0},
		{"bunstore", []string{module + "/workerapi"}, 1},
		{"bunstore", []string{module + "/lease/leasetest"}, 1},
		{"workerapi", []string{module + "/lease", module + "/receipts"}, 0},
		{"workerapi", []string{module + "/bunstore", "github.com/uptrace/bun"}, 2},
		{"cmd/server", []string{module + "/bunstore", module + "/workerapi"}, 0},
		{"workerapi/wire", []string{module + "/receipts", "golang.org/x/mod/sumdb/tlog"}, 0},
		{"workerapi/wire", []string{module + "/lease"}, 1},
		{"workerapi/wire", []string{"github.com/google/uuid"}, 1},
		{"workerapi/client", []string{module + "/workerapi/wire", module + "/replay", module + "/receipts", "github.com/dunglas/httpsfv"}, 0},
		{"workerapi/client", []string{module + "/lease", module + "/credential", module + "/envelope"}, 3},
		{"workerapi/client", []string{module + "/workerapi", module + "/bunstore"}, 2},
		{"workerapi/client", []string{"github.com/uptrace/bun", "modernc.org/sqlite", "github.com/jackc/pgx/v5"}, 3},
		{"cmd/worker", []string{module + "/workerapi/client", module + "/cmd/internal/jobs"}, 0},
		{"cmd/worker", []string{module + "/lease"}, 1},
		{workerapitest, []string{"fmt", module + "/workerapi", module + "/workerapi/wire", module + "/lease", module + "/credential",
			module + "/replay", module + "/envelope", module + "/receipts", "golang.org/x/mod/sumdb/tlog", "github.com/dunglas/httpsfv",
			"github.com/google/go-cmp/cmp"}, 0},
		{workerapitest, []string{module + "/bunstore"}, 1},
		{workerapitest, []string{"github.com/uptrace/bun", "modernc.org/sqlite", "github.com/jackc/pgx/v5"}, 3},
		{workerapitest, []string{module + "/internal/testdb", module + "/internal/apitest", module + "/internal/testclock"}, 3},
		{workerapitest, []string{module + "/workerapi/client", module + "/lease/leasetest"}, 2},
		{workerapitest, []string{"github.com/google/uuid"}, 1},
		{"cmd/server", []string{module + "/" + workerapitest}, 1},
		{artifacttest, []string{"fmt", module + "/workerapi", module + "/workerapi/wire", module + "/lease", module + "/internal/waitfor",
			"github.com/dunglas/httpsfv", "golang.org/x/mod/sumdb/tlog", "github.com/google/go-cmp/cmp"}, 0},
		{artifacttest, []string{module + "/bunstore", module + "/internal/testclock", module + "/internal/apitest"}, 3},
		{artifacttest, []string{"gocloud.dev/blob", "github.com/aws/aws-sdk-go-v2/service/s3"}, 2},
		{"cmd/server", []string{module + "/" + artifacttest}, 1},
		{adaptertest, []string{"fmt", module + "/workerapi", module + "/workerapi/wire", module + "/lease", module + "/lease/leasetest",
			module + "/credential/credentialtest", module + "/replay/replaytest", module + "/envelope/envelopetest",
			module + "/receipts/receiptstest", module + "/fingerprint/fingerprinttest", module + "/" + workerapitest,
			module + "/internal/testclock", module + "/internal/waitfor", "github.com/dunglas/httpsfv", "golang.org/x/mod/sumdb/tlog",
			"github.com/google/go-cmp/cmp"}, 0},
		{adaptertest, []string{module + "/bunstore", module + "/internal/testdb", module + "/" + artifacttest}, 3},
		{adaptertest, []string{"github.com/uptrace/bun", "modernc.org/sqlite", "github.com/google/uuid"}, 3},
		{"cmd/server", []string{module + "/" + adaptertest}, 1},
		{"bunstore", []string{module + "/" + adaptertest}, 2},
		{"blobstore", []string{module + "/" + artifacttest}, 1},
		{operatorClient, []string{module + "/workerapi/wire", module + "/receipts", "golang.org/x/mod/sumdb/tlog", "fmt"}, 0},
		{operatorClient, []string{module + "/workerapi", module + "/lease", module + "/credential", module + "/bunstore"}, 4},
		{operatorClient, []string{module + "/replay", module + "/workerapi/client", module + "/internal/apitest"}, 3},
		{operatorClient, []string{"github.com/uptrace/bun", "modernc.org/sqlite", "github.com/jackc/pgx/v5"}, 3},
		{operatorClient, []string{"github.com/google/uuid"}, 1},
		{"console", []string{module + "/workerapi/wire", module + "/receipts", "golang.org/x/mod/sumdb/tlog"}, 0},
		{"console", []string{module + "/" + operatorClient, module + "/workerapi/wire", module + "/receipts"}, 0},
		{"console", []string{module + "/workerapi/client"}, 1},
		{"console", []string{module + "/workerapi", module + "/lease", module + "/credential", module + "/bunstore"}, 4},
		{"console", []string{"github.com/uptrace/bun"}, 1},
		{"workerapi", []string{module + "/" + workerapitest}, 1},
		{"workerapi", []string{"github.com/prometheus/client_golang/prometheus"}, 1},
		{"workerapi", []string{"go.opentelemetry.io/otel/trace", "golang.org/x/mod/sumdb/note", "github.com/dunglas/httpsfv"}, 1},
		{"workerapi/prommetrics", []string{module + "/workerapi", module + "/lease", "github.com/prometheus/client_golang/prometheus"}, 0},
		{"workerapi/prommetrics", []string{module + "/bunstore", "github.com/uptrace/bun"}, 2},
		{"workerapi/oteltrace", []string{module + "/workerapi", "go.opentelemetry.io/otel/trace"}, 0},
		{"workerapi/oteltrace", []string{module + "/internal/apitest"}, 1},
		{pollNotify, []string{"fmt"}, 0},
		{pollNotify, []string{module + "/workerapi", module + "/lease"}, 0},
		{pollNotify, []string{module + "/bunstore"}, 1},
		{pollNotify, []string{"github.com/uptrace/bun", "modernc.org/sqlite", "golang.org/x/sync/errgroup"}, 2},
	}
	for _, tc := range tests {
		if got := violations(tc.pkg, tc.deps, std); len(got) != tc.want {
			t.Errorf("violations(%s, %v) = %v, want %d", tc.pkg, tc.deps, got, tc.want)
		}
	}
}
