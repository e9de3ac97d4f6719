package cmd

// End-to-end tests of cmd/nodelanectl: the command is built and run
// as a process against a real cmd/server on loopback, as an
// operator would run it.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// ctlBinary is cmd/nodelanectl, built with the server and the worker.
func ctlBinary(t *testing.T) string {
	t.Helper()
	binaries(t)
	return filepath.Join(binDir, "nodelanectl")
}

// ctl runs nodelanectl for one cluster, in an environment of its own (no
// NODELANE_ variable, no config file unless a test writes one).
type ctl struct {
	t       *testing.T
	c       *cluster
	bin     string
	home    string
	tokFile string
	// secrets must never appear in any output.
	secrets []string
}

func newCtl(t *testing.T, c *cluster) *ctl {
	t.Helper()
	home := t.TempDir()
	x := &ctl{t: t, c: c, bin: ctlBinary(t), home: home, tokFile: filepath.Join(home, "operator.token"),
		secrets: []string{c.tokens.OperatorToken, c.tokens.ProvisioningToken}}
	if err := os.WriteFile(x.tokFile, []byte(c.tokens.OperatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return x
}

type ctlResult struct {
	stdout, stderr string
	code           int
}

// runEnv runs the command with env added to its environment.
func (x *ctl) runEnv(env []string, args ...string) ctlResult {
	x.t.Helper()
	cmd := exec.Command(x.bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + x.home, "XDG_CONFIG_HOME=" + filepath.Join(x.home, "xdg")}, env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := ctlResult{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		x.t.Fatalf("nodelanectl %v: %v", args, err)
	}
	x.checkNoSecrets(args, r)
	return r
}

func (x *ctl) checkNoSecrets(args []string, r ctlResult) {
	x.t.Helper()
	for _, s := range x.secrets {
		if s != "" && (strings.Contains(r.stdout, s) || strings.Contains(r.stderr, s)) {
			x.t.Errorf("nodelanectl %v printed a token", args)
		}
	}
}

// run runs the command against the cluster with the operator token file,
// and fails the test unless it exits 0.
func (x *ctl) run(args ...string) string {
	x.t.Helper()
	r := x.runEnv(nil, append([]string{"-server", x.c.base(), "-token-file", x.tokFile}, args...)...)
	if r.code != 0 {
		x.t.Fatalf("nodelanectl %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// runJSON runs the command with -o json and decodes its output into out.
func (x *ctl) runJSON(out any, args ...string) {
	x.t.Helper()
	s := x.run(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(s), out); err != nil {
		x.t.Fatalf("nodelanectl %v -o json: %v\n%s", args, err, s)
	}
}

// fail runs the command and fails the test unless it exits code.
func (x *ctl) fail(code int, env []string, args ...string) ctlResult {
	x.t.Helper()
	r := x.runEnv(env, args...)
	if r.code != code {
		x.t.Fatalf("nodelanectl %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, code, r.stdout, r.stderr)
	}
	return r
}

func mustContain(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s does not contain %q:\n%s", what, sub, s)
		}
	}
}

// ctlCase starts the control plane of one case of TestNodelanectlCommands,
// with a worker (node-a) when worker is set, and returns it, the command's
// environment and the worker's id. No process may log a token.
func ctlCase(t *testing.T, worker bool) (c *cluster, x *ctl, wid string) {
	t.Helper()
	c = newCluster(t)
	if worker {
		c.startWorker("node-a")
		wid = c.workerID("node-a")
	}
	t.Cleanup(c.checkNoTokensLogged)
	return c, newCtl(t, c), wid
}

// TestNodelanectlCommands runs each nodelanectl command against a server
// (and a worker, where the command needs one), each case on a control
// plane of its own.
func TestNodelanectlCommands(t *testing.T) {
	t.Parallel()

	t.Run("help", func(t *testing.T) {
		t.Parallel()
		_, x, _ := ctlCase(t, false)
		r := x.fail(0, nil, "help")
		mustContain(t, "help", r.stdout, "jobs submit", "jobs logs", "workers retire", "envelope activate", "credentials mint", "receipts export", "receipts verify", "cost report")
	})

	t.Run("usage errors exit 2", func(t *testing.T) {
		t.Parallel()
		_, x, _ := ctlCase(t, false)
		for _, args := range [][]string{
			{},
			{"bogus"},
			{"jobs"},
			{"jobs", "bogus"},
			{"jobs", "show"},
			{"jobs", "show", "a", "b"},
			{"jobs", "list", "-nosuchflag"},
			{"-o", "xml", "jobs", "list"},
			{"jobs", "list", "-o", "xml"},
			{"jobs", "list", "-order", "newest"},
			{"jobs", "submit", "-type", "x", "-wait", "-timeout", "-1s"},
			{"jobs", "retry"},
			{"receipts", "list", "-kind", "nosuchkind"},
			{"receipts", "list", "-after", "rcp_x"},
			{"envelope", "history", "-limit", "0"},
			{"completion", "fish"},
			{"completion"},
			{"help", "nosuchgroup"},
			{"jobs", "submit"},
			{"jobs", "submit", "-type", "x", "-payload", "{not json"},
			{"jobs", "logs", "-interval", "1ms", "job_x"},
			{"jobs", "logs", "-interval", "2m", "job_x"},
			{"envelope", "activate"},
			{"envelope", "activate", "-reason", "r", "-until", "tomorrow"},
			{"credentials", "mint", "-principal", "operator", "-scope", "operator:jobs"},
			{"receipts", "verify", "-checkpoint", "cp"},
			{"cost", "report", "-by", "gpu"},
			{"cost", "report", "-from", "yesterday"},
			{"-server", "ftp://example", "jobs", "list"},
		} {
			r := x.fail(2, nil, args...)
			if !strings.Contains(r.stderr, "nodelanectl") {
				t.Errorf("%v: stderr %q names no problem", args, r.stderr)
			}
		}
	})

	t.Run("server errors exit by kind", func(t *testing.T) {
		t.Parallel()
		c, x, _ := ctlCase(t, false)
		r := x.fail(4, nil, "-server", c.base(), "-token-file", x.tokFile, "jobs", "show", "job_nosuchjob")
		mustContain(t, "stderr", r.stderr, "404 not_found", "/operator/jobs/job_nosuchjob")
		r = x.fail(3, []string{"NODELANE_TOKEN=nlc_notatoken"}, "-server", c.base(), "workers", "list")
		mustContain(t, "stderr", r.stderr, "401 invalid_token")
		r = x.fail(3, nil, "-server", c.base(), "jobs", "list")
		mustContain(t, "stderr", r.stderr, "no operator token")
		r = x.fail(5, nil, "-server", "http://127.0.0.1:1", "-token-file", x.tokFile, "jobs", "list")
		mustContain(t, "stderr", r.stderr, "127.0.0.1:1")
		// A bad request is 1.
		r = x.fail(1, nil, "-server", c.base(), "-token-file", x.tokFile, "jobs", "list", "-state", "nosuchstate")
		mustContain(t, "stderr", r.stderr, "400 ")
	})

	t.Run("jobs", func(t *testing.T) {
		t.Parallel()
		c, x, wid := ctlCase(t, true)
		var d wire.DispatchResponse
		x.runJSON(&d, "jobs", "submit", "-type", "status_check", "-gpu-sku", "rtx-4090", "-gpu-count", "1", "-payload", `{"n":1}`)
		if d.Job.ID == "" || d.Job.JobType != "status_check" || !d.Leasable {
			t.Fatalf("submit: %+v", d)
		}
		jobID := d.Job.ID
		// -follow returns once the job ends.
		start := time.Now()
		out := x.run("jobs", "logs", "-follow", "-interval", "200ms", jobID)
		if time.Since(start) > jobTimeout {
			t.Errorf("logs -follow took %v", time.Since(start))
		}
		if jd := c.job(jobID); jd.Job.State != "succeeded" {
			t.Fatalf("after logs -follow the job is %s", jd.Job.State)
		}
		if n := len(c.job(jobID).Events); n > 0 && strings.Count(out, "\n") != n {
			t.Errorf("logs printed %d lines for %d events:\n%s", strings.Count(out, "\n"), n, out)
		}
		var events []wire.JobEventView
		for _, line := range strings.Split(strings.TrimSpace(x.run("jobs", "logs", "-o", "json", jobID)), "\n") {
			if line == "" {
				continue
			}
			var e wire.JobEventView
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("logs -o json line %q: %v", line, err)
			}
			events = append(events, e)
		}
		if len(events) != len(c.job(jobID).Events) {
			t.Errorf("logs -o json: %d events, the job has %d", len(events), len(c.job(jobID).Events))
		}

		out = x.run("jobs", "show", jobID)
		mustContain(t, "jobs show", out, jobID, "succeeded", "status_check", wid)
		var jd wire.JobDetailResponse
		x.runJSON(&jd, "jobs", "show", jobID)
		if jd.Job.ID != jobID || jd.Job.State != "succeeded" {
			t.Errorf("jobs show -o json: %+v", jd.Job)
		}
		out = x.run("jobs", "list")
		mustContain(t, "jobs list", out, "ID", "STATE", jobID, "succeeded")
		var l wire.JobListResponse
		x.runJSON(&l, "jobs", "list", "-state", "succeeded", "-type", "status_check")
		if len(l.Jobs) != 1 || l.Jobs[0].ID != jobID {
			t.Errorf("jobs list -o json: %+v", l.Jobs)
		}
		payload := filepath.Join(x.home, "payload.json")
		if err := os.WriteFile(payload, []byte(`{"from_file": true}`), 0o600); err != nil {
			t.Fatal(err)
		}
		x.runJSON(&d, "jobs", "submit", "-type", "embedding_dry_run", "-payload-file", payload, "-gpu-sku", "rtx-4090", "-max-runtime", "5m")
		if !bytes.Contains(d.Job.Payload, []byte(`"from_file":true`)) || d.Job.Requirements.MaxRuntimeSeconds != 300 || d.Job.Requirements.GPUSKU != "rtx-4090" {
			t.Errorf("submit -payload-file: %+v", d.Job)
		}
		c.waitDone(d.Job.ID, "succeeded")
		// A blocked type stays queued; cancel it.
		x.runJSON(&d, "jobs", "submit", "-type", "lora_train", "-tag", "lab-z", "-priority", "3", "-max-attempts", "2")
		if d.Leasable || d.Reason == "" || d.Job.Priority != 3 || d.Job.MaxAttempts != 2 || len(d.Job.Requirements.Tags) != 1 {
			t.Errorf("lora_train submit: %+v", d)
		}
		out = x.run("jobs", "cancel", d.Job.ID)
		mustContain(t, "jobs cancel", out, d.Job.ID, "canceled")
		var jr wire.JobResponse
		x.runJSON(&jr, "jobs", "cancel", d.Job.ID)
		if jr.Job.State != "canceled" {
			t.Errorf("cancel again -o json: %+v", jr.Job)
		}
		r := x.fail(1, nil, "-server", c.base(), "-token-file", x.tokFile, "jobs", "cancel", jobID)
		mustContain(t, "cancel of a succeeded job", r.stderr, "409 invalid_transition")
	})

	t.Run("logs -follow stops on SIGINT", func(t *testing.T) {
		t.Parallel()
		c, x, _ := ctlCase(t, false)
		var d wire.DispatchResponse
		x.runJSON(&d, "jobs", "submit", "-type", "lora_train", "-tag", "nowhere")
		cmd := exec.Command(x.bin, "-server", c.base(), "-token-file", x.tokFile, "jobs", "logs", "-follow", "-interval", "200ms", d.Job.ID)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + x.home}
		var se bytes.Buffer
		cmd.Stderr = &se
		reads := c.jobReads()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Once it has read the job it follows it, its SIGINT handler (set
		// first thing) in place.
		waitfor.Until(t, "logs -follow to read the job", func() bool { return c.jobReads() > reads })
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 130 {
				t.Errorf("logs -follow after SIGINT: %v (stderr %q), want exit 130", err, se.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("logs -follow did not stop on SIGINT")
		}
		x.run("jobs", "cancel", d.Job.ID)
		// -- ends the flags.
		r := x.fail(4, nil, "-server", c.base(), "-token-file", x.tokFile, "jobs", "show", "--", "-o")
		mustContain(t, "show -- -o", r.stderr, "404 not_found")
	})

	t.Run("envelope", func(t *testing.T) {
		t.Parallel()
		_, x, _ := ctlCase(t, false)
		out := x.run("envelope", "status")
		mustContain(t, "envelope status", out, "active", "false", "blocked_types", "lora_train")
		var e wire.EnvelopeResponse
		x.runJSON(&e, "envelope", "activate", "-reason", "ctl e2e", "-for", "1h")
		if !e.Active || e.ReceiptID == "" || e.Until == nil || time.Until(*e.Until) < 50*time.Minute {
			t.Errorf("activate: %+v", e)
		}
		out = x.run("envelope", "deactivate", "-reason", "done")
		mustContain(t, "deactivate", out, "active", "false", "receipt")
		x.runJSON(&e, "envelope", "status")
		if e.Active || e.Reason != "done" {
			t.Errorf("status after deactivate: %+v", e)
		}
	})

	t.Run("workers", func(t *testing.T) {
		t.Parallel()
		c, x, wid := ctlCase(t, true)
		out := x.run("workers", "list")
		mustContain(t, "workers list", out, "ID", "LIVENESS", wid, "node-a", "1×rtx-4090")
		var l wire.WorkerListResponse
		x.runJSON(&l, "workers", "list")
		if len(l.Workers) != 1 || l.Workers[0].WorkerID != wid {
			t.Errorf("workers list -o json: %+v", l.Workers)
		}
		out = x.run("workers", "show", wid)
		mustContain(t, "workers show", out, wid, "node-a", "liveness")
		var wd wire.WorkerDetailResponse
		x.runJSON(&wd, "workers", "show", wid)
		if wd.Worker.WorkerID != wid {
			t.Errorf("workers show -o json: %+v", wd.Worker)
		}
		var wr wire.WorkerResponse
		x.runJSON(&wr, "workers", "ban", wid, "-reason", "ctl e2e")
		if !wr.Worker.Banned || wr.ReceiptID == nil {
			t.Errorf("ban: %+v", wr)
		}
		out = x.run("workers", "unban", wid, "-reason", "ok")
		mustContain(t, "unban", out, wid, "false", "rcp_")
		x.runJSON(&wr, "workers", "approve", wid, "-job-type", "status_check", "-job-type", "lora_train", "-tag", "lab-a", "-reason", "vetted")
		if wr.Worker.Approval != wire.ApprovalApproved || len(wr.Worker.ApprovedJobTypes) != 2 || len(wr.Worker.ApprovedTags) != 1 || wr.ReceiptID == nil {
			t.Errorf("approve: %+v", wr.Worker)
		}
		out = x.run("workers", "approve", wid, "-job-type", "lora_train,status_check", "-tag", "lab-a", "-reason", "vetted")
		mustContain(t, "approve again", out, wid, "approved")
		x.runJSON(&wr, "workers", "drain", wid)
		if !wr.Worker.Drain || wr.Worker.DrainRequestedAt == nil || wr.ReceiptID != nil {
			t.Errorf("drain: %+v", wr)
		}
		mustContain(t, "workers show while draining", x.run("workers", "show", wid), "drain", "true")
		out = x.run("workers", "resume", wid)
		mustContain(t, "resume", out, wid, "DRAIN", "false")
		r0 := x.fail(4, nil, "-server", c.base(), "-token-file", x.tokFile, "workers", "drain", "wrk_nosuchworker")
		mustContain(t, "drain of no worker", r0.stderr, "404 not_found")
		r := x.fail(4, nil, "-server", c.base(), "-token-file", x.tokFile, "workers", "ban", "wrk_nosuchworker")
		mustContain(t, "ban of no worker", r.stderr, "404 not_found")
	})

	t.Run("credentials", func(t *testing.T) {
		t.Parallel()
		c, x, _ := ctlCase(t, true)
		// A job for the minted token to list.
		jobID := c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded").Job.ID
		tokOut := filepath.Join(x.home, "jobs.token")
		var m map[string]any
		x.runJSON(&m, "credentials", "mint", "-principal", "operator", "-scope", "operator:jobs", "-ttl", "1h", "-token-out", tokOut)
		if _, ok := m["token"]; ok || m["token_file"] != tokOut || m["credential_id"] == "" {
			t.Errorf("mint -o json: %v", m)
		}
		b, err := os.ReadFile(tokOut)
		if err != nil {
			t.Fatal(err)
		}
		minted := strings.TrimSpace(string(b))
		x.secrets = append(x.secrets, minted)
		if fi, _ := os.Stat(tokOut); !strings.HasPrefix(minted, "nlc_") || fi.Mode().Perm() != 0o600 {
			t.Errorf("the token file holds %d bytes, mode %v", len(minted), fi.Mode())
		}
		id, _ := m["credential_id"].(string)
		// The minted token works for its scope, and not beyond.
		env := []string{"NODELANE_TOKEN=" + minted}
		if r := x.fail(0, env, "-server", c.base(), "jobs", "list"); !strings.Contains(r.stdout, jobID) {
			t.Errorf("jobs list with the minted token: %s", r.stdout)
		}
		r := x.fail(3, env, "-server", c.base(), "envelope", "status")
		mustContain(t, "envelope status with operator:jobs", r.stderr, "403 insufficient_scope")
		// A second mint to the same file refuses before minting.
		r = x.fail(1, nil, "-server", c.base(), "-token-file", x.tokFile, "credentials", "mint", "-principal", "operator", "-scope", "operator:jobs", "-token-out", tokOut)
		mustContain(t, "mint over a file", r.stderr, "-token-out")
		out := x.run("credentials", "list", "-principal", "operator")
		mustContain(t, "credentials list", out, "ID", "SCOPES", id, "operator:jobs")
		var cl wire.CredentialListResponse
		x.runJSON(&cl, "credentials", "list")
		if len(cl.Credentials) != 4 {
			t.Errorf("credentials list -o json: %d credentials, want 4 (operator, provisioner, the worker's, minted)", len(cl.Credentials))
		}
		out = x.run("credentials", "revoke", id, "-reason", "done")
		mustContain(t, "revoke", out, id, "rcp_")
		var rv wire.RevokeCredentialResponse
		x.runJSON(&rv, "credentials", "revoke", id)
		if rv.CredentialID != id || rv.ReceiptID != nil {
			t.Errorf("revoke again: %+v", rv)
		}
		r = x.fail(3, env, "-server", c.base(), "jobs", "list")
		mustContain(t, "a revoked token", r.stderr, "401 token_revoked")
	})

	t.Run("receipts", func(t *testing.T) {
		t.Parallel()
		c, x, _ := ctlCase(t, true)
		// Receipts to export: each job's completion and charge, beside
		// those of the bootstrap and the registration.
		for range 4 {
			c.checkSucceeded(c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded"))
		}
		if n := len(c.allReceipts()); n < 10 {
			t.Fatalf("%d receipts: too few for the export's checks", n)
		}
		out, cp := filepath.Join(x.home, "receipts.jsonl"), filepath.Join(x.home, "checkpoint")
		x.run("receipts", "export", "-out", out, "-checkpoint", cp)
		r := x.fail(0, nil, "receipts", "verify", "-key", c.tokens.ReceiptPublicKey, "-checkpoint", cp, out)
		mustContain(t, "verify", r.stdout, "ok: ", "verified")
		var v map[string]any
		r = x.fail(0, nil, "receipts", "verify", "-o", "json", "-key", c.tokens.ReceiptPublicKey, "-checkpoint", cp, out)
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v["ok"] != true || v["size"].(float64) < 10 {
			t.Errorf("verify -o json: %v %s", err, r.stdout)
		}
		// The export is the one cmd/verify-receipts reads: the same
		// lines as the server's list, with proofs.
		lines := strings.Split(strings.TrimSpace(readFile(t, out)), "\n")
		if len(lines) != int(v["size"].(float64)) || !strings.Contains(lines[0], `"proof":{"index":0`) {
			t.Errorf("the export has %d lines; first %s", len(lines), lines[0])
		}
		// The verifier key may come from the config file; offline, no
		// server or token needed.
		writeConfig(t, x, fmt.Sprintf("receipt_public_key = %q\n", c.tokens.ReceiptPublicKey), 0o644)
		x.fail(0, nil, "receipts", "verify", "-checkpoint", cp, out)
		// A tampered export fails, naming the receipt.
		lines[3] = strings.Replace(lines[3], `"index":3`, `"index":4`, 1)
		bad := filepath.Join(x.home, "bad.jsonl")
		if err := os.WriteFile(bad, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r = x.fail(1, nil, "receipts", "verify", "-key", c.tokens.ReceiptPublicKey, "-checkpoint", cp, bad)
		mustContain(t, "verify of a tampered export", r.stderr, "does not verify", "receipt 3")
		r = x.fail(1, nil, "receipts", "verify", "-key", c.tokens.ReceiptPublicKey, "-checkpoint", cp, filepath.Join(x.home, "nonexistent"))
		mustContain(t, "verify of no file", r.stderr, "nonexistent")
	})
}

// jobReads is how many GET /operator/jobs/{id} the server has answered,
// as its /metrics counts them.
func (c *cluster) jobReads() int {
	c.t.Helper()
	var b []byte
	c.call("GET", "/metrics", nil, &b)
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "nodelane_http_request_duration_seconds_count{") &&
			strings.Contains(line, `method="GET"`) && strings.Contains(line, `route="/operator/jobs/{id}"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				c.t.Fatalf("/metrics line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeConfig writes the default config file of x's environment.
func writeConfig(t *testing.T, x *ctl, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(x.home, "xdg", "nodelane", "nodelanectl.toml")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNodelanectlConfig checks that the server and the token come from a
// flag, else the environment, else the config file, and that a config
// file that holds a token must be private.
func TestNodelanectlConfig(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	x := newCtl(t, c)
	dead := "http://127.0.0.1:1"
	wrongTok := filepath.Join(x.home, "wrong.token")
	if err := os.WriteFile(wrongTok, []byte("nlc_wrongtoken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func(env []string, args ...string) {
		t.Helper()
		r := x.fail(0, env, append(args, "envelope", "status")...)
		mustContain(t, "envelope status", r.stdout, "policy_version")
	}
	refused := func(want string, env []string, args ...string) {
		t.Helper()
		code := 1
		switch {
		case want == "127.0.0.1:1":
			code = 5 // connection refused
		case strings.HasPrefix(want, "401"):
			code = 3
		}
		r := x.fail(code, env, append(args, "envelope", "status")...)
		mustContain(t, "stderr", r.stderr, want)
	}

	// The config file alone.
	path := writeConfig(t, x, fmt.Sprintf("server = %q\ntoken = %q\n", c.base(), c.tokens.OperatorToken), 0o600)
	ok(nil)
	// Readable by others while it holds a token: refused, without the token.
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	refused("chmod 600", nil)
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// The environment over the file, a flag over the environment.
	refused("127.0.0.1:1", []string{"NODELANE_SERVER=" + dead})
	ok([]string{"NODELANE_SERVER=" + dead}, "-server", c.base())
	refused("401 invalid_token", []string{"NODELANE_TOKEN=nlc_wrongtoken"})
	ok([]string{"NODELANE_TOKEN=nlc_wrongtoken"}, "-token-file", x.tokFile)
	refused("401 invalid_token", []string{"NODELANE_TOKEN=" + c.tokens.OperatorToken}, "-token-file", wrongTok)
	// The common flags work after the verb too.
	r := x.fail(0, []string{"NODELANE_SERVER=" + dead}, "envelope", "status", "-server", c.base(), "-o", "json")
	var e wire.EnvelopeResponse
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || e.PolicyVersion == 0 {
		t.Errorf("envelope status -server … -o json: %v %s", err, r.stdout)
	}

	// A file server under an environment token; token_file relative to the file.
	writeConfig(t, x, fmt.Sprintf("server = %q\ntoken_file = \"../../operator.token\"\n", dead), 0o644)
	refused("127.0.0.1:1", nil)
	ok(nil, "-server", c.base())
	// NODELANE_CONFIG and -config name another file.
	other := filepath.Join(x.home, "other.toml")
	if err := os.WriteFile(other, []byte(fmt.Sprintf("server = %q\ntoken_file = %q\n", c.base(), x.tokFile)), 0o644); err != nil {
		t.Fatal(err)
	}
	ok([]string{"NODELANE_CONFIG=" + other})
	ok(nil, "-config", other)
	refused("no such file", nil, "-config", filepath.Join(x.home, "missing.toml"))
	// A bad file is named, and its content (which may hold a token) is not shown.
	writeConfig(t, x, "token = nlc_unquotedsecret\n", 0o600)
	x.secrets = append(x.secrets, "nlc_unquotedsecret")
	refused("line 1 is not valid TOML", nil)
	writeConfig(t, x, "sever = \"http://x\"\n", 0o600)
	refused(`unknown key "sever"`, nil)
	// An empty token file.
	writeConfig(t, x, "", 0o600)
	empty := filepath.Join(x.home, "empty.token")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refused("is empty", nil, "-server", c.base(), "-token-file", empty)
}
