package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

const origin = "verify-receipts.test/log"

// export is a log exported by receipts.Log.Export: its lines and its
// signed checkpoint, and what the test needs to forge variants.
type export struct {
	lines  []string
	cp     []byte
	vkey   string
	signer note.Signer
	older  []byte // the checkpoint of an earlier, smaller tree
}

func newExport(t *testing.T) *export {
	t.Helper()
	ctx := context.Background()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	store := receipts.NewMemoryStore()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	cfg := &receipts.Config{Origin: origin, BatchSize: 4, Now: func() time.Time { return now }}
	log := receipts.NewLog(store, cfg)
	seq, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &export{vkey: vkey, signer: signer}
	for i := range 10 {
		var r receipts.Receipt
		if i%3 == 1 {
			c, err := receipts.NewCharge(now, now.Add(time.Duration(i)*time.Minute), 1, 1_800_000)
			if err != nil {
				t.Fatal(err)
			}
			r = c.Receipt(fmt.Sprintf("job_%d", i), fmt.Sprintf("wrk_%d", i), "rtx-4090")
		} else {
			r = receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: fmt.Sprintf("wrk_%d", i), Actor: "operator-1", Reason: "test"}
		}
		r.PolicyVersion = 1
		if _, err := log.Mint(ctx, r); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			seq.Sequence(ctx)
			seq.Sequence(ctx)
			cp, err := log.Checkpoint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			e.older = cp.Note
		}
	}
	for {
		n, err := seq.Sequence(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	var buf bytes.Buffer
	cp, err := log.Export(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Size != 10 {
		t.Fatalf("exported a tree of %d, want 10", cp.Size)
	}
	e.cp = cp.Note
	e.lines = strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	return e
}

// write puts lines and checkpoint in files and returns their paths.
func write(t *testing.T, lines []string, cp []byte) (receiptsPath, cpPath string) {
	t.Helper()
	dir := t.TempDir()
	receiptsPath, cpPath = filepath.Join(dir, "receipts.jsonl"), filepath.Join(dir, "checkpoint")
	body := strings.Join(lines, "\n")
	if len(lines) > 0 {
		body += "\n"
	}
	if err := os.WriteFile(receiptsPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cpPath, cp, 0o644); err != nil {
		t.Fatal(err)
	}
	return receiptsPath, cpPath
}

// editLine decodes line i, lets f change it, and encodes it back.
func editLine(t *testing.T, lines []string, i int, f func(m map[string]any)) []string {
	t.Helper()
	out := append([]string{}, lines...)
	var m map[string]any
	if err := json.Unmarshal([]byte(out[i]), &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out[i] = string(b)
	return out
}

// editBody replaces old with new in the canonical body of line i.
func editBody(t *testing.T, lines []string, i int, old, new string) []string {
	t.Helper()
	return editLine(t, lines, i, func(m map[string]any) {
		body, err := base64Decode(m["body"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(body, []byte(old)) {
			t.Fatalf("body of line %d has no %q: %s", i, old, body)
		}
		m["body"] = bytes.Replace(body, []byte(old), []byte(new), 1)
	})
}

func base64Decode(s string) ([]byte, error) {
	var b []byte
	err := json.Unmarshal([]byte(`"`+s+`"`), &b)
	return b, err
}

func without(lines []string, i int) []string {
	return append(append([]string{}, lines[:i]...), lines[i+1:]...)
}

func TestVerifyExport(t *testing.T) {
	t.Parallel()
	e := newExport(t)
	otherSigner, _ := func() (note.Signer, string) {
		skey, vkey, _ := note.GenerateKey(rand.Reader, origin)
		s, _ := note.NewSigner(skey)
		return s, vkey
	}()
	resign := func(body string, s note.Signer) []byte {
		msg, err := note.Sign(&note.Note{Text: body}, s)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	cpBody, _, _ := strings.Cut(string(e.cp), "\n\n")
	cpBody += "\n"
	noProofs := make([]string, len(e.lines))
	for i := range e.lines {
		noProofs[i] = editLine(t, e.lines, i, func(m map[string]any) { delete(m, "proof") })[i]
	}

	tests := []struct {
		name  string
		lines []string
		cp    []byte
		key   string
		// want is what the failure message must contain; "" means the
		// export verifies.
		want string
	}{
		{name: "untouched", want: ""},
		{name: "untouched without proofs", lines: noProofs, want: ""},
		{name: "one flipped byte in a worker id", lines: editBody(t, e.lines, 3, `"wrk_3"`, `"wrk_X"`), want: "receipt 3 "},
		{name: "one flipped byte in a cost", lines: editBody(t, e.lines, 4, `"actual_cost_usd":"0.120000"`, `"actual_cost_usd":"0.120001"`), want: "receipt 4 "},
		{name: "one flipped byte that breaks the form", lines: editBody(t, e.lines, 6, `"policy_version":1`, `"policy_version":I`), want: "receipt 6 "},
		{name: "a consistent edit of a charge", lines: editBody(t, editBody(t, e.lines, 7, `"rate_usd_per_gpu_hour":"1.800000"`, `"rate_usd_per_gpu_hour":"0.900000"`),
			7, `"actual_cost_usd":"0.210000"`, `"actual_cost_usd":"0.105000"`), want: "receipt 7 "},
		{name: "a body swapped for another", lines: editLine(t, e.lines, 2, func(m map[string]any) {
			var other map[string]any
			json.Unmarshal([]byte(e.lines[5]), &other)
			m["body"], m["id"], m["kind"] = other["body"], other["id"], other["kind"]
		}), want: "receipt 2 "},
		{name: "two receipts swapped", lines: func() []string {
			l := append([]string{}, e.lines...)
			l[3], l[5] = l[5], l[3]
			return l
		}(), want: "receipt 3 "},
		{name: "a receipt removed", lines: without(e.lines, 4), want: "receipt 4 "},
		{name: "a receipt repeated", lines: append(append(append([]string{}, e.lines[:5]...), e.lines[4]), e.lines[5:]...), want: "receipt 5 "},
		{name: "the last receipt removed", lines: e.lines[:9], want: "receipt 9 "},
		{name: "a receipt appended", lines: append(append([]string{}, e.lines...), editLine(t, e.lines, 9, func(m map[string]any) { m["index"] = 10 })[9]), want: "receipt 10 "},
		{name: "an index changed", lines: editLine(t, e.lines, 2, func(m map[string]any) { m["index"] = 7 }), want: "receipt 2 "},
		{name: "an id changed outside the body", lines: editLine(t, e.lines, 8, func(m map[string]any) { m["id"] = "rcp_forged" }), want: "receipt 8 "},
		{name: "a kind changed outside the body", lines: editLine(t, e.lines, 1, func(m map[string]any) { m["kind"] = "job_completed" }), want: "receipt 1 "},
		{name: "a proof hash changed", lines: editLine(t, e.lines, 5, func(m map[string]any) {
			p := m["proof"].(map[string]any)
			hs := p["hashes"].([]any)
			hs[0] = tlog.Hash{1}.String()
		}), want: "receipt 5 "},
		{name: "a proof hash removed", lines: editLine(t, e.lines, 0, func(m map[string]any) {
			p := m["proof"].(map[string]any)
			p["hashes"] = p["hashes"].([]any)[1:]
		}), want: "receipt 0 "},
		{name: "an unknown field", lines: editLine(t, e.lines, 3, func(m map[string]any) { m["note"] = "x" }), want: "receipt 3 "},
		{name: "a line that is not JSON", lines: append(append([]string{}, e.lines[:2]...), append([]string{"{"}, e.lines[3:]...)...), want: "receipt 2 "},
		{name: "a tampered receipt without proofs", lines: editBody(t, noProofs, 3, `"wrk_3"`, `"wrk_X"`), want: "do not hash to the checkpoint's root"},
		{name: "a receipt removed without proofs", lines: without(noProofs, 9), want: "receipt 9 "},
		{name: "the checkpoint's signature changed", cp: bytes.Replace(e.cp, []byte("\n— "+origin+" "), []byte("\n— "+origin+" A"), 1), want: "checkpoint"},
		{name: "the checkpoint's size changed", cp: bytes.Replace(e.cp, []byte("\n10\n"), []byte("\n11\n"), 1), want: "bad checkpoint signature"},
		{name: "a checkpoint by another key", cp: resign(cpBody, otherSigner), want: "not signed by the known key"},
		{name: "a checkpoint with an extra line", cp: resign(cpBody+"extra\n", e.signer), want: "bad checkpoint"},
		{name: "an older checkpoint", cp: e.older, want: "receipt 0 "},
		{name: "an older checkpoint without proofs", lines: noProofs, cp: e.older, want: "receipt 6 "},
		{name: "another origin", key: "", cp: resign(strings.Replace(cpBody, origin, "other.example/log", 1), e.signer), want: "origin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lines, cp := e.lines, e.cp
			if tc.lines != nil {
				lines = tc.lines
			}
			if tc.cp != nil {
				cp = tc.cp
			}
			rp, cpp := write(t, lines, cp)
			var stdout, stderr bytes.Buffer
			code := run([]string{"-key", e.vkey, "-origin", origin, "-checkpoint", cpp, rp}, nil, &stdout, &stderr)
			if tc.want == "" {
				if code != exitOK || !strings.HasPrefix(stdout.String(), "ok: 10 receipts") {
					t.Fatalf("exit %d, stdout %q, stderr %q; want success", code, stdout.String(), stderr.String())
				}
				return
			}
			if code != exitInvalid {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d", code, stdout.String(), stderr.String(), exitInvalid)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not name %q", stderr.String(), tc.want)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	e := newExport(t)
	rp, cpp := write(t, e.lines, e.cp)
	for _, args := range [][]string{
		nil,
		{"-checkpoint", cpp, rp},
		{"-key", e.vkey, rp},
		{"-key", e.vkey, "-checkpoint", cpp, rp, rp},
		{"-key", e.vkey, "-checkpoint", filepath.Join(t.TempDir(), "missing"), rp},
		{"-key", e.vkey, "-origin", origin, "-checkpoint", cpp, filepath.Join(t.TempDir(), "missing")},
		{"-bogus"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, nil, &stdout, &stderr); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d (stderr %q)", args, code, exitUsage, stderr.String())
		}
	}
	// The receipts may come on standard input.
	var stdout, stderr bytes.Buffer
	in := strings.NewReader(strings.Join(e.lines, "\n") + "\n")
	if code := run([]string{"-key", e.vkey, "-origin", origin, "-checkpoint", cpp}, in, &stdout, &stderr); code != exitOK {
		t.Errorf("from stdin: exit %d, stderr %q", code, stderr.String())
	}
}

// The real binary, built and run, exits 0 on the export and 1, naming
// the receipt, on a tampered one.
func TestBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the command")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	bin := filepath.Join(t.TempDir(), "verify-receipts")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	e := newExport(t)
	rp, cpp := write(t, e.lines, e.cp)
	cmd := exec.Command(bin, "-key", e.vkey, "-origin", origin, "-checkpoint", cpp, rp)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok: 10 receipts of "+origin) {
		t.Fatalf("untouched export: %v\n%s", err, out)
	}

	rp, cpp = write(t, editBody(t, e.lines, 6, `"wrk_6"`, `"wrk_7"`), e.cp)
	cmd = exec.Command(bin, "-key", e.vkey, "-origin", origin, "-checkpoint", cpp, rp)
	out, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInvalid || !strings.Contains(string(out), "receipt 6 (line 7 ") {
		t.Fatalf("tampered export: %v, want exit status %d naming receipt 6\n%s", err, exitInvalid, out)
	}
}
