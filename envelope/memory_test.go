package envelope_test

import (
	"testing"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/envelope/envelopetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	envelopetest.Run(t, func(t *testing.T) envelope.Store { return envelope.NewMemoryStore() })
}
