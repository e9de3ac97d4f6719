package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
)

// TestInitSecrets checks that init-secrets creates the secrets file 0600,
// prints its public half only, and never overwrites a file.
func TestInitSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "etc", "secrets.json")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"init-secrets", "-secrets-file", path}, &out, &errOut); err != nil {
		t.Fatalf("init-secrets: %v\n%s", err, errOut.String())
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v %v, want mode 0600", fi, err)
	}
	sec, err := controlplane.LoadSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	printed := out.String() + errOut.String()
	if !strings.Contains(printed, "receipt public key: ") || strings.Contains(printed, sec.ReceiptSigner) {
		t.Errorf("init-secrets printed %q: want the public key and no secret", printed)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"init-secrets", "-secrets-file", path}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "never overwritten") {
		t.Errorf("init-secrets over an existing file: %v", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("init-secrets changed an existing secrets file")
	}
	if err := run(context.Background(), []string{"init-secrets", "-secrets-file", filepath.Join(dir, "x.json"), "extra"}, &out, &errOut); err == nil {
		t.Error("init-secrets accepts an extra argument")
	}
}
