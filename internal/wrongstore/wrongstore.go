// Package wrongstore runs a conformance suite on deliberately wrong stores
// and checks that it refuses each one where it should. A suite's own tests
// cannot watch a failing subtest from inside one test binary, so the
// parent re-executes the test binary once per wrong store, with an
// environment variable naming it, and reads the child's verbose output.
package wrongstore

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Check is the body of a test named TestWrongStores. In the child (env
// set), it calls suite with the named wrong store's name; in the parent,
// for each name in fails it re-executes the test binary and checks that the
// run failed, that subtest TestWrongStores/fails[name] failed, and that
// nothing else failed but that subtest's parents.
func Check(t *testing.T, env string, fails map[string]string, suite func(t *testing.T, name string)) {
	t.Helper()
	if name := os.Getenv(env); name != "" {
		if _, ok := fails[name]; !ok {
			t.Fatalf("%s=%s names no wrong store", env, name)
		}
		suite(t, name)
		return
	}
	for name, want := range fails {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestWrongStores$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), env+"="+name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the suite on %s: err = %v, want a failure exit; output:\n%s", name, err, out)
			}
			checkFailures(t, string(out), "TestWrongStores/"+want)
		})
	}
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// checkFailures checks that out, the verbose output of a test binary,
// reports want failed and nothing else but its parents.
func checkFailures(t *testing.T, out, want string) {
	t.Helper()
	var failed []string
	found := false
	for _, m := range failLine.FindAllStringSubmatch(out, -1) {
		name := m[1]
		failed = append(failed, name)
		switch {
		case name == want:
			found = true
		case strings.HasPrefix(want, name+"/"):
		default:
			t.Errorf("subtest %s failed too; only %s should", name, want)
		}
	}
	if !found {
		t.Errorf("failed subtests %v, want %s among them; output:\n%s", failed, want, out)
	}
}
