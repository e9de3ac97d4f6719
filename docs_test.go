package nodelane_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// trackerCite is a citation of the issue tracker ("(issue 12)", "issues 11
// and 28"): the docs cite a topic or a section, never a tracker number,
// which means nothing to a reader of a clone.
var trackerCite = regexp.MustCompile(`(?i)\bissues? #?[0-9]+`)

// TestDocsCiteNoTrackerNumbers: the architecture and operator docs read
// without the tracker (the CHANGELOG, a history, may cite it).
func TestDocsCiteNoTrackerNumbers(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"docs/DESIGN.md", "docs/CONCEPTS.md", "docs/OPERATIONS.md", "README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := trackerCite.FindString(line); m != "" {
				t.Errorf("%s:%d cites the tracker (%q): cite the topic or the section instead", f, i+1, m)
			}
		}
	}
}

// TestConceptsLeaseDiagram keeps docs/CONCEPTS.md's lease lifecycle true to
// package lease: its Mermaid state diagram names exactly the states
// lease/job.go declares, every state is reached and every live state is
// left, and the three ends lead nowhere but out.
func TestConceptsLeaseDiagram(t *testing.T) {
	t.Parallel()
	want := leaseStates(t)
	b, err := os.ReadFile("docs/CONCEPTS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```mermaid\nstateDiagram-v2\n")
	diagram, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/CONCEPTS.md: no mermaid stateDiagram-v2 block")
	}
	arrow := regexp.MustCompile(`^\s*(\[\*\]|[a-z_]+) --> (\[\*\]|[a-z_]+)(?: : (.+))?$`)
	named := map[string]bool{}
	from, to := map[string]int{}, map[string]int{}
	for _, line := range strings.Split(diagram, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		m := arrow.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("diagram line %q is not a transition `a --> b : label`", line)
			continue
		}
		for _, s := range m[1:3] {
			if s != "[*]" {
				named[s] = true
			}
		}
		if m[1] != "[*]" && m[2] != "[*]" && m[3] == "" {
			t.Errorf("transition %s --> %s has no label saying what causes it", m[1], m[2])
		}
		from[m[1]]++
		to[m[2]]++
	}
	var got []string
	for s := range named {
		got = append(got, s)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the diagram names the states %v; package lease declares %v", got, want)
	}
	for _, s := range want {
		if to[s] == 0 {
			t.Errorf("no transition into %s", s)
		}
		end := s == "succeeded" || s == "failed" || s == "canceled"
		// An end leads to [*]; failed and canceled also back to queued,
		// by an operator's retry (lease.Manager.Retry), and nothing else.
		wantOut := 1
		if s == "failed" || s == "canceled" {
			wantOut = 2
		}
		if end && from[s] != wantOut {
			t.Errorf("%s is an end: it must lead to [*] (and, failed or canceled, to queued by a retry), has %d transitions out", s, from[s])
		}
		if !end && from[s] < 2 {
			t.Errorf("%s has %d transitions out; a live or queued job can always end more than one way", s, from[s])
		}
	}
}

// leaseStates returns the values of lease/job.go's State constants, sorted.
func leaseStates(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "lease/job.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "State" {
				continue
			}
			for _, val := range v.Values {
				if lit, ok := val.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					states = append(states, s)
				}
			}
		}
	}
	if len(states) == 0 {
		t.Fatal("lease/job.go declares no State constants")
	}
	slices.Sort(states)
	return states
}

// TestReadmeStepsMarkers reads the README's sh blocks and their markers as
// .ci/readme-steps does at the end of CI (which runs them): a marker it
// does not know, or a skip without a reason, fails here first. The demo
// is the interrupted step, and the server's steps run.
func TestReadmeStepsMarkers(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is missing: .ci/run needs it")
		}
		t.Skip("no python3")
	}
	out, err := exec.Command(py, ".ci/readme-steps", "-check", "README.md").CombinedOutput()
	if err != nil {
		t.Fatalf(".ci/readme-steps -check README.md: %v\n%s", err, out)
	}
	plan := string(out)
	if !strings.Contains(plan, "interrupt (The web console stays open)") {
		t.Errorf("the demo is not the interrupted step:\n%s", plan)
	}
	if n := strings.Count(plan, " run\n"); n < 5 {
		t.Errorf("%d blocks run; the server, curl, export and nodelanectl steps should:\n%s", n, plan)
	}

	bad := filepath.Join(t.TempDir(), "README.md")
	for _, md := range []string{
		"<!-- steps: skip: -->\n```sh\necho\n```\n",
		"<!-- steps: skipp: typo -->\n```sh\necho\n```\n",
		"<!-- steps: skip: not above a fence -->\n\n```sh\necho\n```\n",
		"<!-- steps: skip: a go block -->\n```go\nx := 1\n```\n",
		"```sh\necho never closed\n",
	} {
		if err := os.WriteFile(bad, []byte(md), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(py, ".ci/readme-steps", "-check", bad).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "README.md:") {
			t.Errorf("-check of %q: %v, want exit 2 naming the line\n%s", md, err, out)
		}
	}
}

// storeDocs are the docs an adapter author reads for the collation of id
// columns: every Store's godoc that keeps ids, and the README's adapter
// section.
var storeDocs = []string{
	"lease/store.go", "credential/store.go", "replay/store.go", "receipts/store.go",
	"fingerprint/fingerprint.go", "README.md",
}

// TestCollationRecommendations keeps one correct recommendation per
// database family in every Store doc that keeps ids: PostgreSQL's "C",
// MySQL's and MariaDB's VARBINARY or NO PAD binary collations, SQLite's
// default; and utf8mb4_bin, which pads ('a' = 'a '), only ever named as
// what not to use.
func TestCollationRecommendations(t *testing.T) {
	t.Parallel()
	want := []string{`COLLATE "C"`, "VARBINARY", "utf8mb4_0900_bin", "utf8mb4_nopad_bin", "BINARY"}
	// A sentence that names utf8mb4_bin must warn against it.
	warning := regexp.MustCompile(`(?i)(never|not)\W+utf8mb4_bin\W[^.]*(pad|trailing spaces)`)
	for _, f := range storeDocs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Join comment lines into one text, so that a phrase may wrap.
		text := regexp.MustCompile(`\n\s*(//)?\s*`).ReplaceAllString(string(b), " ")
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not recommend %s", f, w)
			}
		}
		named := strings.Count(text, "utf8mb4_bin")
		if warned := len(warning.FindAllString(text, -1)); warned != named {
			t.Errorf("%s names utf8mb4_bin %d times, %d of them as what not to use: each must warn that it pads", f, named, warned)
		}
	}
}
