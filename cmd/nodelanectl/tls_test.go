package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
)

// nodelanectl reaches an https server whose CA it is given, and refuses
// plain http to another machine unless told otherwise.
func TestTLSAndInsecureHTTP(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	srv := httptest.NewTLSServer(env.Server.OperatorHandler())
	defer srv.Close()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(env.OperatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	home := func(k string) string {
		if k == "HOME" {
			return dir
		}
		return ""
	}
	ctl := func(args ...string) (int, string) {
		var so, se bytes.Buffer
		code := run(context.Background(), append([]string{"workers", "list", "-token-file", tokenFile}, args...), &so, &se, home)
		return code, so.String() + se.String()
	}
	if code, out := ctl("-server", srv.URL, "-ca-file", caFile); code != exitOK {
		t.Errorf("with -ca-file: exit %d\n%s", code, out)
	}
	if code, out := ctl("-server", srv.URL); code != exitFail || !strings.Contains(out, "certificate") {
		t.Errorf("without -ca-file: exit %d\n%s", code, out)
	}
	if code, out := ctl("-server", srv.URL, "-ca-file", tokenFile); code != exitFail || !strings.Contains(out, "no PEM certificate") || strings.Contains(out, env.OperatorToken) {
		t.Errorf("a CA file that is not one: exit %d\n%s", code, out)
	}
	if code, out := ctl("-server", "http://cp.example.com"); code != exitUsage || !strings.Contains(out, "-insecure-http") {
		t.Errorf("plain http to another machine: exit %d\n%s", code, out)
	}
}
