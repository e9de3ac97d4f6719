package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDemo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	// -addr: a port that was free a moment ago (the demo binds it first).
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	var out bytes.Buffer
	start := time.Now()
	if err := run(ctx, []string{"-addr", addr, "-dir", dir, "-timeout", "80s", "-serve=false"}, &out); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("demo took %v:\n%s", time.Since(start), out.String())
	got := out.String()
	for _, want := range []string{
		"Starting the control plane",
		"registered node demo-gpu-1 as worker wrk_",
		"Dispatching a safe job (status_check)",
		"status_check succeeded",
		"Dispatching lora_train",
		"leasable=false, reason: ",
		"held by the envelope",
		"runtime active=true",
		"lora_train succeeded",
		"artifact adapter file://",
		"actual_ms=",
		"actual_hours=",
		"actual_cost_usd=",
		"web console: http://" + addr + "/console/",
		"Done:",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output does not mention %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^\s+[1-9][0-9]* receipts verified`).MatchString(got) {
		t.Errorf("the output does not say N receipts verified")
	}
	for _, secret := range []string{"nlc_", "nll_"} {
		if strings.Contains(got, secret) {
			t.Errorf("the output shows a token (%s...)", secret)
		}
	}
	for _, f := range []string{"nodelane.db", "nodelane-secrets.json", "nodelane-tokens.json", "nodelane-worker.json", "receipts.jsonl", "checkpoint.note"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestDemoTempDirRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo")
	}
	t.Setenv("TMPDIR", t.TempDir())
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-serve=false"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	left, _ := filepath.Glob(filepath.Join(os.Getenv("TMPDIR"), "nodelane-demo-*"))
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestDemoAddrRefused: an -addr that is not a loopback address, is not an
// address, or is taken stops the demo before it creates anything.
func TestDemoAddrRefused(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	for _, c := range []struct{ addr, want string }{
		{"0.0.0.0:0", "loopback address only"},
		{"192.0.2.1:8080", "loopback address only"},
		{"example.com:8080", "loopback address only"},
		{":0", "loopback address only"},
		{"127.0.0.1", "missing port"},
		{busy.Addr().String(), "address already in use"},
	} {
		t.Run(c.addr, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "demo")
			var out bytes.Buffer
			err := run(t.Context(), []string{"-addr", c.addr, "-dir", dir, "-serve=false"}, &out)
			if err == nil || !strings.Contains(err.Error(), "-addr") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run -addr %s: %v, want an error naming -addr and %q\n%s", c.addr, err, c.want, out.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "nodelane.db")); err == nil {
				t.Errorf("the demo created its database before refusing -addr %s", c.addr)
			}
		})
	}
}
