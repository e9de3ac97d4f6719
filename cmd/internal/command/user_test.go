//go:build linux

package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// nobody is the unprivileged user the tests run commands as.
const nobody = 65534

// needRoot stops a test that switches users when it does not run as
// root (CI runs as root).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
}

// reachable returns a fresh directory that every user can reach (0711,
// and its parent too), unlike t.TempDir's.
func reachable(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// copySelf copies the test binary into dir, executable by every user.
func copySelf(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "command.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// snoop is a job script that tries to read the files $TRY names (and
// /proc/$PPID/environ, the parent's) and says, per file, whether it
// could; it tries to hard-link $ID_FILE into its output and report it
// as an artifact, and reports its uid as an artifact.
const snoop = `
id -u > "$NODELANE_OUTPUT_DIR/uid"
echo "home $HOME"
cat "$NODELANE_PAYLOAD" > /dev/null && echo "the payload is readable"
for f in $TRY /proc/$PPID/environ; do
	if cat "$f" > /dev/null 2>&1; then echo "read $f"; else echo "cannot read $f"; fi
done
ln "$ID_FILE" "$NODELANE_OUTPUT_DIR/key" 2> /dev/null && echo 'nodelane:artifact {"name": "key", "path": "key", "kind": "k"}'
echo 'nodelane:artifact {"name": "uid", "path": "uid", "kind": "k"}'
echo '{"done": true}' > "$NODELANE_OUTPUT_DIR/result.json"
`

// TestRunAsUser checks that a command run as another user (user =
// "nobody") reads its payload and writes outputs the worker collects,
// but cannot read the worker's identity file nor its /proc files, nor
// hard-link the identity into its output; run as the worker's own user
// (root here) it reads them all, and the hard link it reports as an
// artifact is refused.
func TestRunAsUser(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, mode := range modes {
		for _, user := range []string{"nobody", ""} {
			t.Run(mode+"/"+user, func(t *testing.T) { t.Parallel(); testRunAsUser(t, mode, user) })
		}
	}
}

func testRunAsUser(t *testing.T, mode, user string) {
	secrets := t.TempDir() // 0700, root's
	idFile := filepath.Join(secrets, "identity.json")
	if err := os.WriteFile(idFile, []byte(`{"private_key": "the-node-key"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := reachable(t)
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte(snoop), 0o755); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("[[job]]\ntype = \"t\"\ncommand = [\"/bin/sh\", %q]\ngpus = 0\nenv_pass = [\"ID_FILE\", \"TRY\"]\n", path)
	if user != "" {
		text = fmt.Sprintf("user = %q\n", user) + text
	}
	cfg, err := Parse(text, dir)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" && (cfg.User == nil || cfg.User.UID != nobody || cfg.User.Name != user) {
		t.Fatalf("user %+v", cfg.User)
	}
	worker := strconv.Itoa(os.Getpid())
	tries := []string{idFile, "/proc/" + worker + "/environ", "/proc/" + worker + "/cwd/user_test.go"}
	env := map[string]string{"ID_FILE": idFile, "TRY": strings.Join(tries, " "), "HOME": "/root"}
	shim := ""
	if mode == "shim" {
		shim = copySelf(t, dir) // the user runs the shim
	}
	e, err := NewExecutor(cfg, nil, &Options{Workdir: filepath.Join(dir, "work"), Shim: shim, Protected: []string{idFile},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{store: true}
	if err := e.Run(context.Background(), &wire.Job{ID: "job-u", JobType: "t", Attempt: 1, Payload: []byte(`{}`)}, rec); err != nil {
		t.Fatalf("run: %v; logs %q", err, rec.logs)
	}
	if !rec.logged("the payload is readable") {
		t.Errorf("the command could not read its payload: %q", rec.logs)
	}
	for _, f := range tries {
		switch read := rec.logged("read "+f) && !rec.logged("cannot read "+f); {
		case user != "" && read:
			t.Errorf("the command, run as %s, read %s", user, f)
		case user == "" && !read:
			t.Errorf("the command, run as root, could not read %s: %q", f, rec.logs)
		}
	}
	wantUID, wantHome := "0\n", "home "+env["HOME"]
	if user != "" {
		wantUID, wantHome = strconv.Itoa(nobody)+"\n", "home "+cfg.User.Home // nobody's, not root's
	}
	if !rec.logged(wantHome) {
		t.Errorf("the command's HOME is not %q: %q", wantHome, rec.logs)
	}
	var names []string
	for _, u := range rec.uploads {
		names = append(names, u.a.Name)
		if u.a.Name == "uid" && string(u.bytes) != wantUID {
			t.Errorf("the command ran as uid %q, want %q", u.bytes, wantUID)
		}
		if strings.Contains(string(u.bytes), "the-node-key") {
			t.Errorf("artifact %s holds the worker's identity", u.a.Name)
		}
	}
	if len(names) != 1 || names[0] != "uid" {
		t.Errorf("uploaded %q, want the uid only", names)
	}
	if user == "" && !rec.logged("artifact key not reported: path \"key\": it is not the command's own file: it is the worker's "+idFile) {
		t.Errorf("the hard link to the identity was not refused in the job's log: %q", rec.logs)
	}
	if rec.final != "exit 0" || rec.metrics == nil {
		t.Errorf("no result: %v %q", rec.metrics, rec.final)
	}
}

// TestResultIsNotTheIdentity checks that a result.json hard-linked to the
// worker's identity file (a JSON object) is refused, not sent as the
// completion's metrics.
func TestResultIsNotTheIdentity(t *testing.T) {
	t.Parallel()
	idFile := filepath.Join(t.TempDir(), "identity.json")
	if err := os.WriteFile(idFile, []byte(`{"private_key": "the-node-key"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e := executor(t, `ln "$ID_FILE" "$NODELANE_OUTPUT_DIR/result.json"`, "gpus = 0\nenv_pass = [\"ID_FILE\"]", nil)
	e.opts.Protected = []string{idFile}
	e.opts.LookupEnv = func(k string) (string, bool) { return idFile, k == "ID_FILE" }
	rec := &recorder{}
	err := e.Run(context.Background(), testJob(), rec)
	if f := failure(t, err); f.Code != "bad_result" || !errors.Is(err, errProtected) {
		t.Errorf("run = %v (%s), want bad_result refusing the identity", err, f.Code)
	}
	if rec.metrics != nil {
		t.Errorf("metrics %s", rec.metrics)
	}
}

// TestArtifactNotTheUsers checks that with a user, an output file the
// user does not own (a hard link to a file of the worker's) is refused.
func TestArtifactNotTheUsers(t *testing.T) {
	t.Parallel()
	needRoot(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &Executor{cfg: &Config{User: &User{Name: "nobody", UID: nobody, GID: nobody}}}
	if _, _, err := e.openArtifact(dir, "f"); !errors.Is(err, errProtected) || !strings.Contains(err.Error(), "user nobody does not own it") {
		t.Errorf("a root file as nobody's artifact: %v", err)
	}
	if err := os.Chown(filepath.Join(dir, "f"), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	f, _, err := e.openArtifact(dir, "f")
	if err != nil {
		t.Fatalf("nobody's own file: %v", err)
	}
	f.Close()
}

// TestUserRefused checks that an unknown user, root, and a name that is
// not one stop the configuration with an error naming the user.
func TestUserRefused(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"no-such-user-nodelane", "root", "", "a\x00b"} {
		_, err := Parse(fmt.Sprintf("user = %q\n[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\n", name), "/")
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "user ") {
			t.Errorf("user %q: %v, want ErrConfig naming the user", name, err)
		}
	}
}

// helperEnv makes the test binary the worker process of
// TestWorkerIsNotDumpable (see TestMain).
const helperEnv = "NODELANE_COMMAND_TEST_WORKER"

// TestWorkerIsNotDumpable runs a worker process as nobody, with the
// provisioning token in its environment (removed with os.Unsetenv, as
// cmd/worker does) and its identity file in its working directory, and
// a command as the same user: the command reads none of them through
// /proc (the worker and the shim are non-dumpable). The same worker,
// not root, is refused a user to run commands as.
func TestWorkerIsNotDumpable(t *testing.T) {
	t.Parallel()
	needRoot(t)
	dir := reachable(t)
	bin := copySelf(t, dir)
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte(snoop), 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "identity.json"), []byte(`{"private_key": "the-node-key"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{work, filepath.Join(work, "identity.json")} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Dir = work
	cmd.Env = []string{helperEnv + "=" + script, "PATH=/usr/bin:/bin", "NODELANE_PROVISIONING_TOKEN=nlp_the-provisioning-token"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the worker: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "refused: "+ErrUser.Error()+" nobody: the worker runs as uid 65534") {
		t.Errorf("a worker that is not root was not refused user = \"nobody\":\n%s", out)
	}
	for _, s := range []string{"/environ", "/cwd/identity.json", "/maps"} {
		if !regexp.MustCompile(`(?m)^cannot read /proc/[0-9]+` + regexp.QuoteMeta(s) + `$`).Match(out) {
			t.Errorf("the command read, or did not try, the worker's %s:\n%s", s, out)
		}
	}
	if regexp.MustCompile(`(?m)^read `).Match(out) || strings.Contains(string(out), "the-provisioning-token") || strings.Contains(string(out), "the-node-key") {
		t.Errorf("the command read what is the worker's:\n%s", out)
	}
}

// helperWorker is the worker process of TestWorkerIsNotDumpable: it
// runs the script its environment names, as a job, and prints the job's
// log lines.
func helperWorker(script string) int {
	os.Unsetenv("NODELANE_PROVISIONING_TOKEN")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg, err := Parse("user = \"nobody\"\n[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\n", "/")
	if err == nil {
		_, err = NewExecutor(cfg, nil, &Options{Workdir: "jobs", Logger: quiet})
	}
	fmt.Printf("refused: %v\n", err)
	cfg, err = Parse(fmt.Sprintf("[[job]]\ntype = \"t\"\ncommand = [\"/bin/sh\", %q]\ngpus = 0\nenv_pass = [\"TRY\", \"ID_FILE\"]\n", script), "/")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	wd, _ := os.Getwd()
	w := "/proc/" + strconv.Itoa(os.Getpid())
	env := map[string]string{"ID_FILE": filepath.Join(wd, "identity.json"),
		"TRY": w + "/environ " + w + "/cwd/identity.json " + w + "/maps", "PATH": "/usr/bin:/bin"}
	e, err := NewExecutor(cfg, nil, &Options{Workdir: "jobs", Shim: os.Args[0], Logger: quiet,
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	rec := &recorder{}
	err = e.Run(context.Background(), &wire.Job{ID: "job-d", JobType: "t", Attempt: 1}, rec)
	for _, l := range rec.logs {
		fmt.Println(l)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// TestNoUserWarns checks that an Executor whose commands run as the
// worker's own user says so at WARN, and one with a user does not.
func TestNoUserWarns(t *testing.T) {
	t.Parallel()
	needRoot(t)
	for _, user := range []string{"", "nobody"} {
		text := "[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\n"
		if user != "" {
			text = fmt.Sprintf("user = %q\n", user) + text
		}
		cfg, err := Parse(text, "/")
		if err != nil {
			t.Fatal(err)
		}
		var logs syncbuf.Buffer
		if _, err := NewExecutor(cfg, nil, &Options{Workdir: filepath.Join(t.TempDir(), "work"), Logger: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "identity and token included")
		if warned != (user == "") {
			t.Errorf("user %q: warned %t: %s", user, warned, logs.String())
		}
	}
}
