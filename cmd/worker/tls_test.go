package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/workerapi/client"
)

// TestTransportFlags checks the transport flags: plain http to another
// machine needs -insecure-http, and a bad -ca-file, -connect or
// -pin-sha256 stops the worker before it calls anything.
func TestTransportFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"plain http to another machine", []string{"-server", "http://cp.example.com:8080"}, "-insecure-http"},
		{"missing CA file", []string{"-server", "https://cp.example.com", "-ca-file", filepath.Join(dir, "none.pem")}, "-ca-file"},
		{"CA file without a certificate", []string{"-server", "https://cp.example.com", "-ca-file", notPEM}, "no PEM certificate"},
		{"connect without a port", []string{"-server", "https://cp.example.com", "-connect", "127.0.0.1"}, "-connect"},
		{"pin that is no hash", []string{"-server", "https://cp.example.com", "-pin-sha256", "abc"}, "PinnedPublicKeys[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(append([]string{"-identity", filepath.Join(t.TempDir(), "id.json"), "-nvidia-smi", "off", "-simulate-gpu"}, tokenFile(t)...), tc.args...)
			err := run(context.Background(), args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	// The pin's error is the client's configuration error.
	args := append([]string{"-identity", filepath.Join(dir, "id.json"), "-nvidia-smi", "off", "-simulate-gpu", "-server", "https://cp.example.com", "-pin-sha256", "abc"}, tokenFile(t)...)
	err := run(context.Background(), args, io.Discard)
	if !errors.Is(err, client.ErrConfig) {
		t.Errorf("a bad pin: %v, want client.ErrConfig", err)
	}
}
