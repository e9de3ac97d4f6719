package bunstore

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// isUniqueViolation reports whether err is a driver's unique or primary
// key violation.
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505" // unique_violation
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return true
		case sqlite3.SQLITE_CONSTRAINT:
			// Without extended result codes only the message tells.
			return strings.Contains(se.Error(), "UNIQUE constraint failed")
		}
	}
	return false
}

// isBusy reports whether err is SQLite's SQLITE_BUSY, in any variant.
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// affected returns how many rows a statement affected, given what its
// Exec returned.
func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
