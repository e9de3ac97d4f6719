package bunstore_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
)

// fileMode is the permission bits of path.
func fileMode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestSQLiteFileMode checks that Open creates a new SQLite database, and SQLite its
// -wal and -shm files, readable by their owner only, whatever the
// process's umask would give; an existing file keeps its mode.
func TestSQLiteFileMode(t *testing.T) {
	// The usual umask, under which SQLite alone would create 0644.
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	ctx := context.Background()

	for _, tc := range []struct {
		name string
		dsn  func(path string) string
	}{
		{"sqlite:PATH", func(p string) string { return "sqlite:" + p }},
		{"file:PATH?query", func(p string) string { return "file:" + p + "?_pragma=foreign_keys(1)" }},
		{"file:///PATH", func(p string) string { return "file://" + p }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "nodelane.db")
			db, err := bunstore.Open(ctx, tc.dsn(path), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			// Migrations wrote to the database: the WAL exists.
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				if m := fileMode(t, p); m != 0o600 {
					t.Errorf("%s has mode %v, want 0600", filepath.Base(p), m)
				}
			}
		})
	}

	t.Run("an existing file keeps its mode", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nodelane.db")
		if err := os.WriteFile(path, nil, 0o640); err != nil {
			t.Fatal(err)
		}
		db, err := bunstore.Open(ctx, "sqlite:"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if m := fileMode(t, path); m != 0o640 {
			t.Errorf("mode %v, want the 0640 it had", m)
		}
	})

	t.Run("in memory creates no file", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		db, err := bunstore.Open(ctx, "file:mem.db?mode=memory&cache=shared&_pragma=journal_mode(memory)", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("files created: %v", ents)
		}
	})
}
