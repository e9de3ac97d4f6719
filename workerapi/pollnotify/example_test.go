package pollnotify_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/nodelane/nodelane/workerapi/pollnotify"
)

// exampleTx carries a *sql.Tx in a context: the host's Transactor puts
// its transaction there, and the SQLCounter finds it.
type exampleTx struct{}

// Two processes share a SQLite file; each opens its own *sql.DB and its
// own Notifier, here in one process for the example. A Notify in a
// transaction of one wakes the other's subscribers once the transaction
// commits.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "pollnotify-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	txOf := func(ctx context.Context) (pollnotify.Execer, bool) {
		tx, ok := ctx.Value(exampleTx{}).(*sql.Tx)
		return tx, ok
	}
	ctx := context.Background()

	var notifiers [2]*pollnotify.Notifier
	var dbs [2]*sql.DB
	for i := range 2 {
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer db.Close()
		c, err := pollnotify.NewSQLCounter(db, "", txOf)
		if err != nil {
			log.Fatal(err)
		}
		// Once, before any Notifier starts: the table and its row.
		for _, q := range c.DDL() {
			if _, err := db.ExecContext(ctx, q); err != nil {
				log.Fatal(err)
			}
		}
		n, err := pollnotify.New(ctx, c, nil) // reads every 250 ms
		if err != nil {
			log.Fatal(err)
		}
		defer n.Close()
		dbs[i], notifiers[i] = db, n
	}
	// workerapi.Stores{Notifier: notifiers[i], ...} on each replica.

	wake, cancel := notifiers[1].Subscribe()
	defer cancel()

	tx, err := dbs[0].BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	// ... enqueue a job in tx ...
	if err := notifiers[0].Notify(context.WithValue(ctx, exampleTx{}, tx)); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	<-wake
	fmt.Println("the other replica's long-polls look again")
	// Output: the other replica's long-polls look again
}
