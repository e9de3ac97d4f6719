package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
)

func TestFingerprintStore(t *testing.T) {
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			fingerprinttest.Run(t, func(t *testing.T) fingerprint.Store {
				return open(t, d.New(t)).FingerprintStore()
			})
		})
	}
}
