package main

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestDropTokenFile checks what a registration does to the token file:
// removed, kept with -keep-token-file, and a file gone already is no
// error; the token never reaches the log.
func TestDropTokenFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		keep, gone bool
		wantLog    string
	}{
		{"removed", false, false, "removed the provisioning token file"},
		{"kept", true, false, "keeping the provisioning token file"},
		{"gone already", false, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "provisioning-token")
			if !tc.gone {
				if err := os.WriteFile(path, []byte(testToken+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			dropTokenFile(slog.New(slog.NewTextHandler(&logs, nil)), path, tc.keep)(wire.RegisterResponse{WorkerID: "wrk_1"})
			_, err := os.Stat(path)
			if tc.keep != (err == nil) || !tc.keep && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("keep %t: the token file: %v", tc.keep, err)
			}
			if !strings.Contains(logs.String(), tc.wantLog) || tc.wantLog == "" && logs.Len() > 0 || strings.Contains(logs.String(), testToken) {
				t.Errorf("log %q, want %q and no token", logs.String(), tc.wantLog)
			}
		})
	}
}
