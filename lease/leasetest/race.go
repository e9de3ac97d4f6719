//go:build race

package leasetest

// raceEnabled reports whether the race detector is on. Under it every
// memory access is checked, and a SQLite store, whose engine is Go
// translated from C, runs about ten times slower: the tests that burn down
// a queue size it down so that they still race many claimers on one
// queue without taking minutes.
const raceEnabled = true
