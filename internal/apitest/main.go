package apitest

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// Main runs a package's tests, as its TestMain, with more of them at once
// than go test's default of GOMAXPROCS: 4 × GOMAXPROCS, unless the command
// line sets -test.parallel. The tests of a control plane mostly wait, on
// PostgreSQL, on HTTP round trips over loopback and on real timers
// (long-polls, leases, drains), so that GOMAXPROCS of them at a time
// leave the CPUs idle:
//
//	func TestMain(m *testing.M) { apitest.Main(m) }
func Main(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0))); err != nil {
			panic("apitest: " + err.Error())
		}
	}
	os.Exit(m.Run())
}
