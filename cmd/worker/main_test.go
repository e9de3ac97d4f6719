package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/command"
)

const testToken = "nlc_000RxY9kz6ouWMJLgFtBDiYDMREKtrwCJfLBML0eaQHzOzSDhgW39sPXcZ1SIERix0BQRXB"

// tokenFile writes testToken to a file of its own and returns the flag
// that gives it: a test that needs a token but does not test where it
// comes from leaves the environment alone, and can run in parallel.
func tokenFile(t *testing.T) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "provisioning-token")
	if err := os.WriteFile(path, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"-provisioning-token-file", path}
}

// TestProvisioningToken checks that the provisioning token comes from a
// file or the environment, never from the command line. The cases that
// set the environment run one at a time; those of bad files, which do
// not read it, in parallel.
func TestProvisioningToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  "+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("file", func(t *testing.T) {
		t.Setenv(provisioningEnv, "nlc_from_the_environment")
		got, err := provisioningToken(file)
		if err != nil || got != testToken {
			t.Fatalf("provisioningToken(file) = %q, %v; want the file's token", got, err)
		}
		if v, ok := os.LookupEnv(provisioningEnv); ok {
			t.Errorf("%s is still set (%q): processes the worker starts would inherit it", provisioningEnv, v)
		}
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv(provisioningEnv, testToken)
		got, err := provisioningToken("")
		if err != nil || got != testToken {
			t.Fatalf("provisioningToken(\"\") = %q, %v; want the environment's token", got, err)
		}
		if _, ok := os.LookupEnv(provisioningEnv); ok {
			t.Errorf("%s is still set after it was read", provisioningEnv)
		}
	})
	t.Run("neither", func(t *testing.T) {
		t.Setenv(provisioningEnv, "")
		if got, err := provisioningToken(""); err != nil || got != "" {
			t.Fatalf("provisioningToken(\"\") = %q, %v; want none", got, err)
		}
	})
	for name, content := range map[string]string{"empty": " \n", "two words": testToken + " " + testToken, "huge": strings.Repeat("a", maxTokenFile+1)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bad := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(bad, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := provisioningToken(bad); err == nil {
				t.Fatalf("a token file that is %s is accepted", name)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		if _, err := provisioningToken(filepath.Join(dir, "nothing")); err == nil {
			t.Fatal("a missing token file is accepted")
		}
	})
}

// TestNoTokenOnCommandLine checks that the flag that put the token on the command
// line is gone, and without a token a new worker says where to give one.
func TestNoTokenOnCommandLine(t *testing.T) {
	t.Setenv(provisioningEnv, "")
	dir := t.TempDir()
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-identity", filepath.Join(dir, "id.json"), "-provisioning-token", testToken}, &stderr)
	if err == nil {
		t.Fatal("-provisioning-token is accepted")
	}
	if !strings.Contains(stderr.String(), "-provisioning-token-file") {
		t.Errorf("the usage does not name -provisioning-token-file:\n%s", stderr.String())
	}
	stderr.Reset()
	err = run(context.Background(), []string{"-identity", filepath.Join(dir, "id.json"), "-node-id", "n1", "-simulate-gpu"}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "-provisioning-token-file") || !strings.Contains(err.Error(), provisioningEnv) {
		t.Errorf("run without a token = %v, want an error naming -provisioning-token-file and %s", err, provisioningEnv)
	}
}

// TestConfigFlag checks that a -config file that is not valid, or that asks for more
// GPUs than the -gpu flags give, stops the worker before it creates its
// identity or calls the server; so does a bad -tag.
func TestConfigFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		want error
	}{
		{"unknown key", []string{"-config", write("unknown.toml", "[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\nshell = true\n")}, command.ErrConfig},
		{"missing file", []string{"-config", filepath.Join(dir, "none.toml")}, os.ErrNotExist},
		{"unknown user", []string{"-config", write("user.toml", "user = \"no-such-user-nodelane\"\n[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\n")}, command.ErrConfig},
		{"too many GPUs", []string{"-config", write("gpus.toml", "[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\ngpus = 2\n"), "-gpu", "rtx-4090:24576"}, command.ErrNotEnoughGPUs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := filepath.Join(dir, tc.name+".json")
			args := append(append([]string{"-identity", id, "-server", "http://127.0.0.1:1"}, tokenFile(t)...), tc.args...)
			err := run(context.Background(), args, io.Discard)
			if !errors.Is(err, tc.want) {
				t.Errorf("run = %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(id); !os.IsNotExist(err) {
				t.Errorf("the identity was created: %v", err)
			}
		})
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-tag", ""}, &stderr); err == nil || !strings.Contains(stderr.String(), "tag") {
		t.Errorf("an empty -tag: %v %s", err, stderr.String())
	}
	// The server's rule (wire.CheckTag): it would refuse the registration.
	stderr.Reset()
	if err := run(context.Background(), []string{"-tag", "gpu pool"}, &stderr); err == nil || !strings.Contains(stderr.String(), "whitespace") {
		t.Errorf("a -tag with a space: %v %s", err, stderr.String())
	}
}

// TestNoGPURefused checks that with no nvidia-smi and no -gpu the worker stops
// before it creates its identity or calls the server, naming -gpu and
// -simulate-gpu; with -simulate-gpu it goes on (here to the identity).
func TestNoGPURefused(t *testing.T) {
	t.Setenv(provisioningEnv, testToken)
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	for _, args := range [][]string{nil, {"-nvidia-smi", "off"}} {
		id := filepath.Join(dir, "id.json")
		err := run(context.Background(), append([]string{"-identity", id, "-server", "http://127.0.0.1:1"}, args...), io.Discard)
		if !errors.Is(err, errNoGPU) || !strings.Contains(err.Error(), "-gpu SKU:VRAM_MB") || !strings.Contains(err.Error(), "-simulate-gpu") {
			t.Errorf("run %q = %v, want errNoGPU naming -gpu and -simulate-gpu", args, err)
		}
		if _, err := os.Stat(id); !os.IsNotExist(err) {
			t.Errorf("the identity was created: %v", err)
		}
	}
	// -simulate-gpu passes the GPU check: the run gets as far as the
	// control plane (which is not there).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	id := filepath.Join(dir, "sim.json")
	err := run(ctx, []string{"-identity", id, "-server", "http://127.0.0.1:1", "-simulate-gpu", "-node-id", "n1"}, io.Discard)
	if errors.Is(err, errNoGPU) {
		t.Errorf("run -simulate-gpu = %v", err)
	}
	if _, err := os.Stat(id); err != nil {
		t.Errorf("with -simulate-gpu the worker did not get to its identity: %v", err)
	}
}
