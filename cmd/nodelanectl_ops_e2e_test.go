package cmd

// End-to-end tests of nodelanectl's daily commands (issue 31): submit
// -wait and its exit status, newest-first lists, -o yaml, -q and
// -no-headers, receipts and envelope history, version and completion,
// against a real cmd/server and a real cmd/worker on loopback.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// ctlJobs starts a control plane, its envelope active, and a worker
// whose job types run scripts: ctl_ok logs a line holding terminal
// escape sequences (OSC 52, which writes the clipboard, and a CSI that
// clears the screen) and succeeds; ctl_fail exits 3.
func ctlJobs(t *testing.T) (*cluster, *ctl) {
	t.Helper()
	c := newCluster(t)
	c.activate()
	t.Cleanup(c.checkNoTokensLogged)
	dir := t.TempDir()
	ok := script(t, dir, "ok.sh", `printf 'hello \033]52;c;cHduZWQ=\007 \033[2J \302\233 done\n'
exit 0
`)
	fail := script(t, dir, "fail.sh", "echo about to fail\necho bad input >&2\nexit 3\n")
	c.startCommandWorker("ctl-node", fmt.Sprintf(`
[[job]]
type = "ctl_ok"
command = [%q]
gpus = 0

[[job]]
type = "ctl_fail"
command = [%q]
gpus = 0
`, ok, fail), "-gpu", "rtx-4090:24576")
	c.workerID("ctl-node")
	return c, newCtl(t, c)
}

// noRawControls fails the test when s holds an escape character, a BEL or
// a C1 CSI as such.
func noRawControls(t *testing.T, what, s string) {
	t.Helper()
	if i := strings.IndexAny(s, "\x1b\x07\u009b"); i >= 0 {
		t.Errorf("%s holds a raw control character at %d: %q", what, i, s)
	}
}

// TestNodelanectlDaily runs the commands an operator uses every day.
func TestNodelanectlDaily(t *testing.T) {
	t.Parallel()
	c, x := ctlJobs(t)
	base := []string{"-server", c.base(), "-token-file", x.tokFile}

	// submit -wait: exit 0 once the job succeeded, with its end.
	r := x.fail(0, nil, append(base, "jobs", "submit", "-type", "ctl_ok", "-wait", "-interval", "100ms")...)
	mustContain(t, "submit -wait", r.stdout, "ctl_ok", "succeeded after attempt 1 of")
	okID := strings.Fields(strings.Split(r.stdout, "\n")[1])[0]
	if jd := c.job(okID); jd.Job.State != "succeeded" {
		t.Fatalf("after submit -wait the job is %s", jd.Job.State)
	}

	// A failure: exit 6, the error on standard error.
	r = x.fail(6, nil, append(base, "jobs", "submit", "-type", "ctl_fail", "-max-attempts", "1", "-exit-status", "-interval", "100ms")...)
	mustContain(t, "submit -exit-status of a failing job", r.stdout, "failed after attempt 1 of 1", "exit_3")
	mustContain(t, "its stderr", r.stderr, "ended failed")

	// -o yaml -wait: the job as it ended, as YAML a YAML library reads.
	r = x.fail(6, nil, append(base, "jobs", "submit", "-type", "ctl_fail", "-max-attempts", "1", "-wait", "-interval", "100ms", "-o", "yaml")...)
	var ended struct {
		Job struct {
			ID        string `yaml:"id"`
			State     string `yaml:"state"`
			LastError struct {
				Code string `yaml:"code"`
			} `yaml:"last_error"`
		} `yaml:"job"`
	}
	if err := yaml.Unmarshal([]byte(r.stdout), &ended); err != nil || ended.Job.State != "failed" || ended.Job.LastError.Code != "exit_3" {
		t.Fatalf("submit -wait -o yaml: %v %+v\n%s", err, ended, r.stdout)
	}
	failID := ended.Job.ID

	// -q prints the id only, at once.
	r = x.fail(0, nil, append(base, "jobs", "submit", "-type", "ctl_ok", "-q")...)
	lastID := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(lastID, "job_") || strings.Contains(lastID, "\n") {
		t.Fatalf("submit -q: %q", r.stdout)
	}
	c.waitDone(lastID, "succeeded")

	// Lists are newest first; -order asc is oldest first.
	ids := strings.Fields(x.run("jobs", "list", "-q"))
	want := []string{lastID, failID, "", okID}
	if len(ids) != 4 || ids[0] != lastID || ids[1] != failID || ids[3] != okID {
		t.Errorf("jobs list -q: %v, want newest first %v", ids, want)
	}
	asc := strings.Fields(x.run("jobs", "list", "-q", "-order", "asc"))
	slices.Reverse(asc)
	if !slices.Equal(asc, ids) {
		t.Errorf("jobs list -order asc: %v, not the reverse of %v", asc, ids)
	}
	// One a page: the next page is older.
	r = x.fail(0, nil, append(base, "jobs", "list", "-limit", "1", "-q")...)
	if strings.TrimSpace(r.stdout) != lastID || !strings.Contains(r.stderr, "more: -after "+lastID) {
		t.Errorf("jobs list -limit 1 -q: %q, stderr %q", r.stdout, r.stderr)
	}
	if got := strings.TrimSpace(x.run("jobs", "list", "-limit", "1", "-q", "-after", lastID)); got != failID {
		t.Errorf("the page after %s: %q, want %s", lastID, got, failID)
	}
	// -no-headers: rows only; -o wide: more columns.
	out := x.run("jobs", "list", "-no-headers", "-state", "failed")
	if strings.Contains(out, "STATE") || strings.Count(out, "\n") != 2 {
		t.Errorf("jobs list -no-headers:\n%s", out)
	}
	out = x.run("jobs", "list", "-o", "wide")
	mustContain(t, "jobs list -o wide", out, "PRIORITY", "LAST_ERROR", "exit_3")
	// -o yaml of a list.
	var l struct {
		Jobs []struct {
			ID string `yaml:"id"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal([]byte(x.run("jobs", "list", "-o", "yaml")), &l); err != nil || len(l.Jobs) != 4 || l.Jobs[0].ID != lastID {
		t.Errorf("jobs list -o yaml: %v %+v", err, l)
	}

	// Control characters stay escaped in every format.
	for _, o := range []string{"table", "wide", "json", "yaml"} {
		out := x.run("jobs", "logs", "-o", o, okID)
		noRawControls(t, "jobs logs -o "+o, out)
		if !strings.Contains(out, "hello ") || !strings.Contains(out, "52;c;cHduZWQ=") {
			t.Errorf("jobs logs -o %s does not show the line:\n%s", o, out)
		}
	}
	mustContain(t, "jobs logs", x.run("jobs", "logs", okID), `\x1b]52;c;cHduZWQ=\x07`, `\x1b[2J`, `\u009b`)
	// logs -f prints the job's end; with -exit-status its exit is the job's.
	r = x.fail(0, nil, append(base, "jobs", "logs", "-f", failID)...)
	mustContain(t, "logs -f of a failed job", r.stderr, "job "+failID+" failed after attempt 1 of 1")
	r = x.fail(6, nil, append(base, "jobs", "logs", "-exit-status", failID)...)
	mustContain(t, "logs -exit-status", r.stdout, "about to fail")

	// Receipts: newest first, by kind, one shown. A receipt is listed
	// once it is sequenced.
	var rid []string
	waitfor.Until(t, "the two job_failed receipts to be sequenced", func() bool {
		rid = strings.Fields(x.run("receipts", "list", "-kind", "job_failed", "-q"))
		return len(rid) == 2
	})
	out = x.run("receipts", "show", rid[0])
	mustContain(t, "receipts show", out, rid[0], "job_failed", "exit_3", "proof")
	out = x.run("receipts", "list", "-limit", "3")
	mustContain(t, "receipts list", out, "INDEX", "KIND", "more: -after ")
	var rl wire.ReceiptListResponse
	x.runJSON(&rl, "receipts", "list", "-limit", "1000")
	for i := 1; i < len(rl.Receipts); i++ {
		if *rl.Receipts[i].Index >= *rl.Receipts[i-1].Index {
			t.Fatalf("receipts list is not newest first: index %d after %d", *rl.Receipts[i].Index, *rl.Receipts[i-1].Index)
		}
	}

	// retry: a failed job runs again (and fails again: exit 6), its
	// retry receipted; a job that succeeded cannot be retried (409: exit
	// 1), nor one that does not exist (exit 4).
	r = x.fail(6, nil, append(base, "jobs", "retry", "-reason", "once more", "-wait", "-interval", "100ms", failID)...)
	mustContain(t, "jobs retry -wait", r.stdout, failID, "rcp_", "failed after attempt")
	var jr wire.OperatorJobResponse
	r = x.fail(1, nil, append(base, "jobs", "retry", okID)...)
	mustContain(t, "retry of a job that succeeded", r.stderr, "409 invalid_transition")
	x.fail(4, nil, append(base, "jobs", "retry", "job_nosuchjob")...)
	x.runJSON(&jr, "jobs", "retry", failID)
	if jr.Job.ID != failID || jr.Job.State != "queued" || jr.ReceiptID == nil {
		t.Errorf("jobs retry -o json: %+v", jr)
	}
	c.waitDone(failID, "failed")

	// With the runtime inactive, ctl_ok is blocked until made safe; a
	// canonical blocked type cannot be (400: exit 1).
	x.run("envelope", "deactivate", "-reason", "ctl history")
	r = x.fail(1, nil, append(base, "envelope", "safe-types", "-add", "raw_training", "-reason", "no")...)
	mustContain(t, "safe-types -add raw_training", r.stderr, "400 invalid_request", "raw_training")
	x.fail(2, nil, append(base, "envelope", "safe-types", "-add", "ctl_ok")...)
	out = x.run("envelope", "safe-types", "-add", "ctl_ok", "-reason", "ctl safe")
	mustContain(t, "envelope safe-types", out, "runtime_safe_types", "ctl_ok", "rcp_")
	x.fail(0, nil, append(base, "jobs", "submit", "-type", "ctl_ok", "-wait", "-interval", "100ms")...)

	// Envelope history, newest first: the safe types, the deactivation,
	// the activation.
	waitfor.Until(t, "the safe-types change's receipt to be sequenced", func() bool {
		out = x.run("envelope", "history")
		return strings.Contains(out, "envelope_safe_types_changed")
	})
	mustContain(t, "envelope history", out, "ctl history", "ctl safe", "ctl_ok")
	a, d, sc := strings.Index(out, "envelope_activated"), strings.Index(out, "envelope_deactivated"), strings.Index(out, "envelope_safe_types_changed")
	if !(sc < d && d < a) {
		t.Errorf("envelope history is not newest first:\n%s", out)
	}
	var eh struct {
		Receipts []struct {
			Kind string `yaml:"kind"`
		} `yaml:"receipts"`
	}
	if err := yaml.Unmarshal([]byte(x.run("envelope", "history", "-o", "yaml")), &eh); err != nil || len(eh.Receipts) != 3 || eh.Receipts[0].Kind != "envelope_safe_types_changed" {
		t.Errorf("envelope history -o yaml: %v %+v", err, eh)
	}
	if got := strings.Fields(x.run("envelope", "history", "-limit", "1", "-q")); len(got) != 1 {
		t.Errorf("envelope history -limit 1 -q: %v", got)
	}
}

// TestNodelanectlHelpVersionCompletion checks the help of every command
// (a description and an example), version, and that bash reads the
// completion script and completes with it.
func TestNodelanectlHelpVersionCompletion(t *testing.T) {
	t.Parallel()
	bin := ctlBinary(t)
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return so.String(), se.String(), code
	}
	out, _, code := run("help")
	mustContain(t, "help", out, "jobs retry", "receipts list", "envelope history", "Exit status:", "4    not found", "version", "completion bash|zsh")
	if code != 0 {
		t.Errorf("help: exit %d", code)
	}
	_, errOut, code := run("jobs", "submit", "-h")
	mustContain(t, "jobs submit -h", errOut, "Queue a job", "Examples:", "-wait", "-exit-status")
	if code != 0 {
		t.Errorf("jobs submit -h: exit %d", code)
	}
	out, _, _ = run("help", "receipts", "list")
	mustContain(t, "help receipts list", out, "newest first", "Examples:", "-kind")

	out, _, code = run("version")
	mustContain(t, "version", out, "version", "go", "revision")
	if code != 0 {
		t.Errorf("version: exit %d", code)
	}
	out, _, _ = run("version", "-o", "json")
	mustContain(t, "version -o json", out, `"go_version":"go1.`)

	script, _, code := run("completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: exit %d", code)
	}
	path := filepath.Join(t.TempDir(), "nodelanectl.bash")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = fmt.Sprintf("%q", w)
		}
		cmd := exec.Command("bash", "-c", fmt.Sprintf(`source %q; COMP_WORDS=(%s); COMP_CWORD=%d; _nodelanectl; printf '%%s\n' "${COMPREPLY[@]}"`,
			path, strings.Join(quoted, " "), len(words)-1))
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash completion of %q: %v\n%s", words, err, b)
		}
		return strings.Fields(string(b))
	}
	cases := []struct {
		words []string
		want  []string
	}{
		{[]string{"nodelanectl", "j"}, []string{"jobs"}},
		{[]string{"nodelanectl", "jobs", "re"}, []string{"retry"}},
		{[]string{"nodelanectl", "-o", "json", "receipts", "l"}, []string{"list"}},
		{[]string{"nodelanectl", "jobs", "submit", "-wa"}, []string{"-wait"}},
		{[]string{"nodelanectl", "jobs", "list", "-o", "y"}, []string{"yaml"}},
		{[]string{"nodelanectl", "jobs", "list", "-state", "fa"}, []string{"failed"}},
		{[]string{"nodelanectl", "jobs", "list", "-type", ""}, nil},
		{[]string{"nodelanectl", "completion", ""}, []string{"bash", "zsh"}},
	}
	for _, c := range cases {
		if got := complete(c.words...); !slices.Equal(got, c.want) {
			t.Errorf("completion of %q: %q, want %q", c.words, got, c.want)
		}
	}

	// zsh: the same cases, the script run by a real zsh, with stand-ins for
	// compinit's compdef, compadd (which prints the words that match) and
	// _files. CI installs zsh (.ci/run).
	if _, err := exec.LookPath("zsh"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no zsh: .ci/run installs it, for the zsh completion test")
		}
		t.Log("no zsh: the zsh completion is not checked")
		return
	}
	zscript, _, code := run("completion", "zsh")
	if code != 0 {
		t.Fatalf("completion zsh: exit %d", code)
	}
	zpath := filepath.Join(t.TempDir(), "_nodelanectl")
	if err := os.WriteFile(zpath, []byte(zscript), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		quoted := make([]string, len(c.words))
		for i, w := range c.words {
			quoted[i] = fmt.Sprintf("%q", w)
		}
		cmd := exec.Command("zsh", "-f", "-c", fmt.Sprintf(`compdef() { : }
compadd() { [[ $1 == -- ]] && shift; local w; for w in "$@"; do [[ $w == ${words[CURRENT]}* ]] && print -r -- $w; done; return 0 }
_files() { : }
source %q
words=(%s); CURRENT=%d; _nodelanectl`, zpath, strings.Join(quoted, " "), len(c.words)))
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("zsh completion of %q: %v\n%s", c.words, err, b)
		}
		if got := strings.Fields(string(b)); !slices.Equal(got, c.want) {
			t.Errorf("zsh completion of %q: %q, want %q", c.words, got, c.want)
		}
	}
}
