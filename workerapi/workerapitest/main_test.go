package workerapitest_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
)

// TestMain runs more tests at once than there are CPUs: they mostly wait
// (apitest.RaiseParallel). It drops migratedPostgres's schemas once every
// test ended.
func TestMain(m *testing.M) {
	apitest.RaiseParallel()
	code := m.Run()
	if err := migratedPostgres.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "workerapitest: dropping the test schemas:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}
