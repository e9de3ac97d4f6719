package nodelane_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
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
		if end && from[s] != 1 {
			t.Errorf("%s is an end: it must lead only to [*], has %d transitions out", s, from[s])
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
