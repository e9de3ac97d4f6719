package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
	"github.com/nodelane/nodelane/internal/testdb"
)

func TestFingerprintStore(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			fingerprinttest.Run(t, func(t *testing.T) fingerprint.Store {
				return open(t, d.New(t)).FingerprintStore()
			})
		})
	}
}
