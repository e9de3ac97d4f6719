package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2ECommandUser runs a worker process, root, whose worker.toml says
// user = "nobody", against a control plane: the job's command runs as
// nobody and cannot read the worker's identity file, its provisioning
// token file, nor the worker's /proc/PID/environ and cwd; its output is
// collected and the job succeeds.
func TestE2ECommandUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("user = \"nobody\" needs a root worker (CI runs as root)")
	}
	c := newCluster(t, "-heartbeat-interval", "1s")
	c.activate()
	t.Cleanup(c.checkNoTokensLogged)
	// The user runs the worker's executable (the shim) and reaches the
	// run directories: both in a directory every user can enter.
	pub, err := os.MkdirTemp("", "nodelane-jobuser-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	if err := os.Chmod(pub, 0o711); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(c.workerBin)
	if err != nil {
		t.Fatal(err)
	}
	c.workerBin = filepath.Join(pub, "nodelane-worker")
	if err := os.WriteFile(c.workerBin, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	const node = "user-node"
	snoop := script(t, pub, "snoop.sh", fmt.Sprintf(`
echo "uid $(id -u)"
W=$(cut -d' ' -f4 /proc/$PPID/stat)
for f in %q %q /proc/$W/environ /proc/$PPID/environ; do
	if cat "$f" > /dev/null 2>&1; then echo "read $f"; else echo "cannot read $f"; fi
done
if ls /proc/$W/cwd/ > /dev/null 2>&1; then echo "listed the worker's cwd"; else echo "cannot list the worker's cwd"; fi
echo hello > "$NODELANE_OUTPUT_DIR/hello.txt"
echo 'nodelane:artifact {"name": "hello.txt", "path": "hello.txt", "kind": "text"}'
echo '{"ok": true}' > "$NODELANE_OUTPUT_DIR/result.json"
`, c.identityPath(node), filepath.Join(c.dir, node+".provisioning-token")))
	if err := os.Chmod(snoop, 0o755); err != nil {
		t.Fatal(err)
	}
	c.startCommandWorker(node, fmt.Sprintf("user = \"nobody\"\n\n[[job]]\ntype = \"cmd_snoop\"\ncommand = [%q]\ngpus = 0\n", snoop),
		"-gpu", "rtx-4090:24576", "-workdir", filepath.Join(pub, "work"))
	d := c.waitDone(c.dispatchGPUs("cmd_snoop", 0).Job.ID, "succeeded")
	logs := strings.Join(logLines(d), "\n")
	if !strings.Contains(logs, "uid 65534") {
		t.Errorf("the command did not run as nobody:\n%s", logs)
	}
	if strings.Contains(logs, "\nread ") || strings.HasPrefix(logs, "read ") || strings.Contains(logs, "listed") {
		t.Errorf("the command read the worker's files:\n%s", logs)
	}
	if n := strings.Count(logs, "cannot read "); n != 4 || !strings.Contains(logs, "cannot list the worker's cwd") {
		t.Errorf("the command did not try every file (%d):\n%s", n, logs)
	}
	if len(d.Artifacts) != 1 || d.Artifacts[0].Name != "hello.txt" {
		t.Errorf("the command's artifact was not collected: %+v", d.Artifacts)
	}
}
