package bunstore_test

import (
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
)

func TestFingerprintStore(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			fingerprinttest.Run(t, func(t *testing.T) fingerprint.Store {
				return open(t, d.New(t)).FingerprintStore()
			})
		})
	}
}
