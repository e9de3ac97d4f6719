package credential

import (
	"context"
	"errors"
)

// ErrNotInMemory is what a Store that keeps what it read in memory
// (bunstore's) answers, under a context of MemoryOnly, for a read it
// would have to make from its database. Verify wraps it.
var ErrNotInMemory = errors.New("credential: not in memory")

type memoryOnlyKey struct{}

// MemoryOnly returns a context under which a Store that keeps what it
// read in memory answers its reads from memory only, and ErrNotInMemory
// for the others, so that a caller can verify a credential without
// taking its turn for the database when it need not (workerapi does). A
// Store without such a memory ignores it.
func MemoryOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, memoryOnlyKey{}, true)
}

// IsMemoryOnly reports whether ctx asks for reads from memory only
// (MemoryOnly).
func IsMemoryOnly(ctx context.Context) bool {
	v, _ := ctx.Value(memoryOnlyKey{}).(bool)
	return v
}
