package nodelane_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// storeAPIFile records the interfaces a storage adapter implements, as
// their declarations read, under the release whose CHANGELOG section must
// list every change of them for adapter authors.
const storeAPIFile = "testdata/store_api.txt"

// storeAPIPackages are the packages that declare what an adapter
// implements: every Store, its optional interfaces, and workerapi's
// Transactor, Notifier and Stores.
var storeAPIPackages = []string{"lease", "credential", "replay", "envelope", "receipts", "fingerprint", "workerapi"}

// storeAPITypes are the declarations recorded besides every interface of
// the cores: of workerapi, only these; of the cores, the structs a Store
// method takes whose fields a store must honour.
var storeAPITypes = map[string][]string{
	"workerapi":  {"Transactor", "SharedTransactor", "Notifier", "SignalNotifier", "DatabaseClock", "SchemaChecker", "Stores"},
	"lease":      {"JobFilter", "ArtifactFilter", "WorkerFilter", "ClaimQuery", "LeaseClaim", "AcceptWrite", "CompleteWrite"},
	"credential": {"CredentialFilter", "QuotaCharge"},
}

// TestStoreAPIChangelog keeps the CHANGELOG's promise to adapter authors:
// a release that changes a Store interface (or an optional one, or
// workerapi's Transactor, Notifier or Stores) lists the change in its
// "### Store adapters" section. The declarations, comments aside, are
// recorded in testdata/store_api.txt with the release they last changed
// in; when they change, the test fails until the record is rewritten
// (UPDATE_STORE_API=1 go test -run TestStoreAPIChangelog .), which records
// the newest CHANGELOG release, and that release must have the section.
func TestStoreAPIChangelog(t *testing.T) {
	t.Parallel()
	changelog, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	release, section := newestRelease(string(changelog))
	if release == "" {
		t.Fatal("CHANGELOG.md has no release heading (## vX.Y.Z)")
	}
	api := storeAPI(t)

	if os.Getenv("UPDATE_STORE_API") == "1" {
		if err := os.WriteFile(storeAPIFile, []byte("release "+release+"\n\n"+api), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	recorded, err := os.ReadFile(storeAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(string(recorded), "\n\n")
	if body != api {
		t.Fatalf("the interfaces a storage adapter implements changed since %s records them: list the change in CHANGELOG.md's \"### Store adapters\" section of the newest release, then rewrite the record with UPDATE_STORE_API=1 go test -run TestStoreAPIChangelog .", storeAPIFile)
	}
	if strings.TrimPrefix(head, "release ") == release && !strings.Contains(section, "\n### Store adapters\n") {
		t.Errorf("the store interfaces changed in %s (%s), whose CHANGELOG section has no \"### Store adapters\" heading", release, storeAPIFile)
	}
}

// newestRelease returns the first "## v…" heading's version and its
// section's text.
func newestRelease(changelog string) (release, section string) {
	heading := regexp.MustCompile(`(?m)^## (v[0-9][^ \n]*)`)
	locs := heading.FindAllStringSubmatchIndex(changelog, 2)
	if len(locs) == 0 {
		return "", ""
	}
	end := len(changelog)
	if len(locs) > 1 {
		end = locs[1][0]
	}
	return changelog[locs[0][2]:locs[0][3]], changelog[locs[0][0]:end]
}

// storeAPI prints the recorded declarations, without comments, sorted by
// package and name.
func storeAPI(t *testing.T) string {
	t.Helper()
	var decls []string
	for _, pkg := range storeAPIPackages {
		files, err := filepath.Glob(filepath.Join(pkg, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.TYPE {
					continue
				}
				for _, s := range g.Specs {
					ts := s.(*ast.TypeSpec)
					_, isIface := ts.Type.(*ast.InterfaceType)
					if !ts.Name.IsExported() {
						continue
					}
					named := slices.Contains(storeAPITypes[pkg], ts.Name.Name)
					if !named && (pkg == "workerapi" || !isIface) {
						continue
					}
					var b bytes.Buffer
					cfg := printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
					if err := cfg.Fprint(&b, token.NewFileSet(), &ast.GenDecl{Tok: token.TYPE, Specs: []ast.Spec{stripComments(ts)}}); err != nil {
						t.Fatal(err)
					}
					decls = append(decls, fmt.Sprintf("// %s\n%s\n", pkg, b.String()))
				}
			}
		}
	}
	slices.Sort(decls)
	return strings.Join(decls, "\n")
}

// stripComments returns ts without its comments, so that the record
// changes with the declarations only.
func stripComments(ts *ast.TypeSpec) *ast.TypeSpec {
	ast.Inspect(ts, func(n ast.Node) bool {
		if f, ok := n.(*ast.Field); ok {
			f.Doc, f.Comment = nil, nil
		}
		return true
	})
	c := *ts
	c.Doc, c.Comment = nil, nil
	return &c
}
