package apitest

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// Main runs a package's tests, as its TestMain, with more of them at once
// than go test's default of GOMAXPROCS (see RaiseParallel):
//
//	func TestMain(m *testing.M) { apitest.Main(m) }
func Main(m *testing.M) {
	RaiseParallel()
	os.Exit(m.Run())
}

// RaiseParallel sets -test.parallel to max(8, 4 × GOMAXPROCS) unless the
// command line set it. The tests of a control plane mostly wait, on
// PostgreSQL, on HTTP round trips over loopback, on processes and on real
// timers (long-polls, leases, drains), so that GOMAXPROCS of them at a
// time leave the CPUs idle. A TestMain that does more than Main calls it
// before m.Run.
func RaiseParallel() {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(max(8, 4*runtime.GOMAXPROCS(0)))); err != nil {
			panic("apitest: " + err.Error())
		}
	}
}
