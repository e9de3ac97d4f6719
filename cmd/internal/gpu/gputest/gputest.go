// Package gputest writes fake nvidia-smi programs for tests: /bin/sh
// scripts that check their arguments as package gpu passes them and
// answer each query with a given text.
package gputest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DiscoverQuery and SampleQuery are the --query-gpu values package gpu
// asks for: Discover's, and a Sampler's.
const (
	DiscoverQuery = "index,uuid,name,memory.total"
	SampleQuery   = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu"
)

// TwoGPUs answers both queries for two RTX 4090s.
var TwoGPUs = map[string]string{
	DiscoverQuery: "0, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, NVIDIA GeForce RTX 4090, 24564\n" +
		"1, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, NVIDIA GeForce RTX 4090, 24564\n",
	SampleQuery: "0, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, 37, 1234, 24564, 55\n" +
		"1, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, 0, 3, 24564, 31\n",
}

// Write writes an executable fake nvidia-smi into a new directory and
// returns the directory (to put on PATH) and the program's path. The
// fake exits 2, saying why on its standard error, unless it is called
// with exactly --query-gpu=Q and --format=csv,noheader,nounits for a Q
// of answers; then it prints answers[Q] and exits 0. An answer that
// starts with "#!" is run as a shell command instead (to hang, or to
// write without end).
func Write(t testing.TB, answers map[string]string) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "nvidia-smi")
	if err := Rewrite(path, answers); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// Rewrite replaces the fake at path with one that gives answers, at
// once (by a rename): a run under way ends with the old answers.
func Rewrite(path string, answers map[string]string) error {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
[ $# -eq 2 ] || { echo "want 2 arguments, got $#: $*" >&2; exit 2; }
[ "$2" = "--format=csv,noheader,nounits" ] || { echo "unexpected argument $2" >&2; exit 2; }
case "$1" in
`)
	for q, a := range answers {
		b.WriteString("--query-gpu=" + q + ")\n")
		if cmd, ok := strings.CutPrefix(a, "#!"); ok {
			b.WriteString(cmd + "\n")
		} else {
			b.WriteString("printf '%s' '" + strings.ReplaceAll(a, "'", `'\''`) + "'\n")
		}
		b.WriteString(";;\n")
	}
	b.WriteString(`*) echo "unexpected argument $1" >&2; exit 2;;
esac
`)
	tmp := path + ".new"
	if err := WriteExecutable(tmp, b.String()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// WriteExecutable writes an executable file (mode 0755) through a child
// process, so that this process never holds it open for writing. A file
// this process wrote itself could not be run at once when tests run in
// parallel: a child forked meanwhile by another test inherits the
// writing descriptor until it execs, and running the file fails with
// "text file busy" (ETXTBSY) until then.
func WriteExecutable(path, content string) error {
	cmd := exec.Command("/bin/sh", "-c", `cat > "$1" && chmod 755 "$1"`, "sh", path)
	cmd.Env = []string{"PATH=/usr/bin:/bin"} // whatever the test made of PATH
	cmd.Stdin = strings.NewReader(content)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("writing %s: %v: %s", path, err, out)
	}
	return nil
}
