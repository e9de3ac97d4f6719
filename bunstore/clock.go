package bunstore

import (
	"context"
	"fmt"
	"time"
)

// DatabaseTime reads the database server's clock: clock_timestamp() on
// PostgreSQL (microseconds), julianday('now') on SQLite (milliseconds;
// the database's clock is then this host's, read through the same path).
// Replicas measure their own clock's skew against it, so that they share
// one clock (workerapi.DatabaseClock). It runs outside any transaction
// the context carries: a PostgreSQL transaction's now() stands still.
func (db *DB) DatabaseTime(ctx context.Context) (time.Time, error) {
	q := "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000"
	if db.postgres() {
		q = "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
	}
	var us int64
	if err := db.bun.QueryRowContext(ctx, q).Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("bunstore: read the database's clock: %w", err)
	}
	return time.UnixMicro(us).UTC(), nil
}
