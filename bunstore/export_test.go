package bunstore

import "context"

// SetObserver sets the function that sees every statement bunstore runs
// past bun (the bound hot statements), which bun's query hooks miss.
func SetObserver(db *DB, f func(ctx context.Context, query string)) { db.observer = f }
