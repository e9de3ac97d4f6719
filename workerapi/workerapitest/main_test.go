package workerapitest_test

import (
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
)

// TestMain runs more tests at once than there are CPUs: they mostly wait
// (apitest.Main).
func TestMain(m *testing.M) { apitest.Main(m) }
