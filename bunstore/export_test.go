package bunstore

import (
	"context"
	"time"
)

// SetObserver sets the function that sees every statement bunstore runs
// past bun (the bound hot statements), which bun's query hooks miss.
func SetObserver(db *DB, f func(ctx context.Context, query string)) { db.observer = f }

// SetCacheClock sets the clock the DB's read cache ages its entries by.
func SetCacheClock(db *DB, now func() time.Time) { db.cache.now = now }
