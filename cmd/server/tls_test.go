package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/cmd/internal/tlsserve"
	"github.com/nodelane/nodelane/internal/testdb"
)

// TestTLSFlagErrors checks that bad TLS flags and files stop the server
// before it binds or bootstraps, with an error naming the flag or the
// file.
func TestTLSFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
		is    error
	}{
		{"http-addr without TLS", []string{"-http-addr", "127.0.0.1:0"}, "-http-addr needs TLS", tlsserve.ErrFlags},
		{"cert without key", []string{"-tls-cert", garbage}, "-tls-key", tlsserve.ErrFlags},
		{"files and ACME", []string{"-tls-cert", garbage, "-tls-key", garbage, "-acme-domain", "cp.example.com"}, "exclusive", tlsserve.ErrFlags},
		{"acme flag without a domain", []string{"-acme-email", "ops@example.com"}, "-acme-email needs -acme-domain", tlsserve.ErrFlags},
		{"bad domain", []string{"-acme-domain", "localhost"}, "-acme-domain", tlsserve.ErrFlags},
		{"missing certificate", []string{"-tls-cert", missing, "-tls-key", garbage}, missing, fs.ErrNotExist},
		{"garbage certificate", []string{"-tls-cert", garbage, "-tls-key", garbage}, garbage, tlsserve.ErrNoCertificate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, testdb.Dialects()[0])
			var stdout, stderr syncbuf.Buffer
			err := run(context.Background(), append(f.args("127.0.0.1:0"), tc.flags...), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Fatalf("error %v, want one saying %q (%v)", err, tc.want, tc.is)
			}
			if stdout.String() != "" {
				t.Fatalf("printed %q", stdout.String())
			}
			for _, p := range []string{f.tokens, f.secrets} {
				if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("%s exists after a bad start: %v", p, err)
				}
			}
		})
	}
}
