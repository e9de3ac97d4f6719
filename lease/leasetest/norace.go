//go:build !race

package leasetest

// raceEnabled reports whether the race detector is on (see race.go).
const raceEnabled = false
