package lease_test

import (
	"testing"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/lease/leasetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	leasetest.Run(t, func(t *testing.T) lease.Store { return lease.NewMemoryStore() })
}
