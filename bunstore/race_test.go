//go:build race

package bunstore_test

// raceEnabled reports whether the race detector is on. Under it the
// tests that push thousands of writes through the stores push fewer, so
// that they still race many writers without taking minutes.
const raceEnabled = true
