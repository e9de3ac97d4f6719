package credential_test

import (
	"testing"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/credential/credentialtest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	credentialtest.Run(t, func(t *testing.T) credential.Store { return credential.NewMemoryStore() })
}
