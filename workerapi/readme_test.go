package workerapi_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeEmbedSnippet keeps the README's embedding snippet the compiled
// one: the body of embed in example_test.go, between its begin and end
// markers, must stand in README.md as it is (one tab less).
func TestReadmeEmbedSnippet(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "\t// begin embed\n")
	body, _, ok2 := strings.Cut(rest, "\t// end embed\n")
	if !ok || !ok2 || strings.TrimSpace(body) == "" {
		t.Fatal("example_test.go: no embed body between the markers")
	}
	var want strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	if !strings.Contains(string(readme), "```go\n"+want.String()+"```\n") {
		t.Errorf("README.md does not hold the embed snippet of example_test.go as a go block; it should read:\n%s", want.String())
	}
}
