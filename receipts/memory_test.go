package receipts_test

import (
	"testing"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/receipts/receiptstest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	receiptstest.Run(t, func(t *testing.T) receipts.Store { return receipts.NewMemoryStore() })
}
