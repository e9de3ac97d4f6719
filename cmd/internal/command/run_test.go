//go:build linux

package command

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// recorder is a Reporter that keeps what a run reports.
type recorder struct {
	mu        sync.Mutex
	logs      []string
	payloads  []map[string]any
	progress  []map[string]any
	messages  []string
	artifacts []client.ArtifactInfo
	// store makes UploadArtifactFrom keep the bytes in uploads; without
	// it, it answers artifact_storage_off.
	store   bool
	uploads []upload
	// checkpoint is what DownloadCheckpoint writes, or checkpointErr its
	// error.
	checkpoint    []byte
	checkpointErr error
	outputURI     string
	metrics       any
	final         string
}

// upload is an artifact the recorder stored.
type upload struct {
	a     client.ArtifactFile
	bytes []byte
}

func (r *recorder) Log(message string, payload any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, message)
	p, _ := payload.(map[string]any)
	r.payloads = append(r.payloads, p)
}

func (r *recorder) Progress(ctx context.Context, message string, payload any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.messages = append(r.messages, message)
	r.progress = append(r.progress, payload.(map[string]any))
	return nil
}

func (r *recorder) Artifact(ctx context.Context, a client.ArtifactInfo) (*wire.ArtifactResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.artifacts = append(r.artifacts, a)
	return &wire.ArtifactResponse{}, nil
}

// UploadArtifactFrom keeps the bytes when the recorder stores them, and
// else answers as a control plane without storage.
func (r *recorder) UploadArtifactFrom(ctx context.Context, src io.ReaderAt, size int64, a client.ArtifactFile) (*wire.ArtifactResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.store {
		return nil, fmt.Errorf("%w: 404 artifact_storage_off", client.ErrArtifactStorageOff)
	}
	b, err := io.ReadAll(io.NewSectionReader(src, 0, size))
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != a.SHA256 {
		return nil, errors.New("artifact_mismatch")
	}
	r.uploads = append(r.uploads, upload{a: a, bytes: b})
	return &wire.ArtifactResponse{Stored: true}, nil
}

// DownloadCheckpoint writes the recorder's checkpoint into dir.
func (r *recorder) DownloadCheckpoint(ctx context.Context, dir string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checkpointErr != nil {
		return "", r.checkpointErr
	}
	path := filepath.Join(dir, "ckpt.bin")
	return path, os.WriteFile(path, r.checkpoint, 0o600)
}

func (r *recorder) SetOutput(uri string, metrics any, final string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outputURI, r.metrics, r.final = uri, metrics, final
}

func (r *recorder) logged(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.logs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// TestMain makes the test binary the command shim too, as the worker's
// main does. It exits with syscall.Exit: under -race, os.Exit first
// sleeps a second (GORACE atexit_sleep_ms), which every run would wait
// for.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		syscall.Exit(ShimMain(os.Args[2:]))
	}
	if script := os.Getenv(helperEnv); script != "" {
		syscall.Exit(helperWorker(script))
	}
	os.Exit(m.Run())
}

// modes are the two ways the executor starts commands: itself, or
// through the shim (the test binary).
var modes = []string{"direct", "shim"}

// executor returns an Executor for one job type "t" running script
// with /bin/sh; extra is more TOML of the [[job]] table.
func executor(t *testing.T, script, extra string, devs *Devices) *Executor {
	t.Helper()
	return executorIn(t, "direct", script, extra, devs)
}

// executorIn is executor, starting the commands as mode says.
func executorIn(t *testing.T, mode, script, extra string, devs *Devices) *Executor {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(fmt.Sprintf("[[job]]\ntype = \"t\"\ncommand = [\"/bin/sh\", %q]\n%s\n", path, extra), dir)
	if err != nil {
		t.Fatal(err)
	}
	shim := ""
	if mode == "shim" {
		shim = os.Args[0]
	}
	e, err := NewExecutor(cfg, devs, &Options{Workdir: filepath.Join(dir, "work"), Shim: shim,
		LookupEnv: func(k string) (string, bool) {
			if k == "SECRET_NOT_PASSED" || k == "PASSED" {
				return "value-of-" + k, true
			}
			return os.LookupEnv(k)
		}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func testJob() *wire.Job {
	return &wire.Job{ID: "job-1", JobType: "t", Attempt: 2, Payload: json.RawMessage(`{"steps": 3}`),
		Requirements: wire.Requirements{GPUCount: 1}}
}

// failure returns err's Failure, failing the test if it has none.
func failure(t *testing.T, err error) *Failure {
	t.Helper()
	var f *Failure
	if !errors.As(err, &f) {
		t.Fatalf("error %v is not a *Failure", err)
	}
	if client.IsPermanent(err) == f.Retryable {
		t.Errorf("%s: permanent %t, retryable %t", f.Code, client.IsPermanent(err), f.Retryable)
	}
	return f
}

func TestRunSucceeds(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { t.Parallel(); testRunSucceeds(t, mode) })
	}
}

func testRunSucceeds(t *testing.T, mode string) {
	devs, _ := NewDevices([]string{"GPU-a", "GPU-b"})
	e := executorIn(t, mode, `
echo "hello from $NODELANE_JOB_TYPE"
echo "to stderr" >&2
env | sort > "$NODELANE_OUTPUT_DIR/env.txt"
cp "$NODELANE_PAYLOAD" "$NODELANE_OUTPUT_DIR/payload.copy"
echo 'nodelane:progress {"fraction": 0.5, "message": "half", "metrics": {"loss": 0.7}}'
echo 'nodelane:progress {"fraction": 1}'
mkdir -p "$NODELANE_OUTPUT_DIR/adapter"
printf 'weights' > "$NODELANE_OUTPUT_DIR/adapter/model.bin"
echo 'nodelane:artifact {"name": "adapter", "path": "adapter/model.bin", "kind": "adapter", "metadata": {"rank": 8}}'
echo 'nodelane:progress {"fraction": 2}'
echo '{"loss": 0.25}' > "$NODELANE_OUTPUT_DIR/result.json"
`, `env_pass = ["PASSED"]`, devs)
	rec := &recorder{}
	if err := e.Run(context.Background(), testJob(), rec); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"hello from t", "to stderr"} {
		if !rec.logged(s) {
			t.Errorf("no log line %q in %q", s, rec.logs)
		}
	}
	if !rec.logged(`nodelane:progress {"fraction": 2}`) {
		t.Errorf("the invalid progress line was not logged: %q", rec.logs)
	}
	if len(rec.progress) != 2 || rec.progress[0]["fraction"] != 0.5 || rec.messages[0] != "half" || rec.messages[1] != "100%" {
		t.Errorf("progress %v %q", rec.progress, rec.messages)
	}
	if len(rec.artifacts) != 1 {
		t.Fatalf("artifacts %+v", rec.artifacts)
	}
	a := rec.artifacts[0]
	sum := sha256.Sum256([]byte("weights"))
	if a.Name != "adapter" || a.Type != "adapter" || a.SHA256 != hex.EncodeToString(sum[:]) || a.SizeBytes != 7 ||
		!strings.HasPrefix(a.URI, "file:///") || !strings.HasSuffix(a.URI, "/output/adapter/model.bin") {
		t.Errorf("artifact %+v", a)
	}
	if m, _ := rec.metrics.(json.RawMessage); !strings.Contains(string(m), `"loss": 0.25`) || rec.final != "exit 0" {
		t.Errorf("output %v %q", rec.metrics, rec.final)
	}
	out := strings.TrimPrefix(rec.outputURI, "file://")
	env, err := os.ReadFile(filepath.Join(out, "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NODELANE_JOB_ID=job-1", "NODELANE_JOB_TYPE=t", "NODELANE_ATTEMPT=2",
		"NODELANE_OUTPUT_DIR=" + out, "CUDA_VISIBLE_DEVICES=GPU-a", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "PASSED=value-of-PASSED", "PATH="} {
		if !strings.Contains("\n"+string(env), "\n"+want) {
			t.Errorf("environment lacks %s:\n%s", want, env)
		}
	}
	if strings.Contains(string(env), "SECRET_NOT_PASSED") {
		t.Error("a variable not in env_pass was passed")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "payload.copy")); string(b) != `{"steps": 3}` {
		t.Errorf("payload %q", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(out), "payload.json")); !os.IsNotExist(err) {
		t.Errorf("payload file left behind: %v", err)
	}
	// The GPUs are back.
	if ids, err := devs.Acquire(context.Background(), 2); err != nil || len(ids) != 2 {
		t.Errorf("GPUs not released: %v %v", ids, err)
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, script, extra, code string
		retryable                 bool
	}{
		{"exit 3", "echo oops >&2; exit 3", "", "exit_3", false},
		{"retryable exit", "exit 75", "retry_on_exit = [75, 76]", "exit_75", true},
		{"signal", "kill -SEGV $$", "", "signal_SIGSEGV", true},
		{"timeout", "sleep 30", `timeout = "300ms"` + "\nkill_grace = \"1s\"", "timeout", false},
		{"bad result", `echo '[1, 2]' > "$NODELANE_OUTPUT_DIR/result.json"`, "", "bad_result", false},
		{"big result", `head -c 20000 /dev/zero | tr '\0' ' ' > "$NODELANE_OUTPUT_DIR/result.json"`, "", "bad_result", false},
	}
	for _, tc := range tests {
		for _, mode := range modes {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				testRunExitCode(t, mode, tc.script, tc.extra, tc.code, tc.retryable)
			})
		}
	}
}

func testRunExitCode(t *testing.T, mode, script, extra, code string, retryable bool) {
	e := executorIn(t, mode, script, extra, nil)
	j := testJob()
	j.Requirements.GPUCount = 0
	rec := &recorder{}
	start := time.Now()
	err := e.Run(context.Background(), j, rec)
	f := failure(t, err)
	if f.Code != code || f.Retryable != retryable {
		t.Errorf("code %s retryable %t, want %s %t (%v)", f.Code, f.Retryable, code, retryable, err)
	}
	if code == "exit_3" && !strings.Contains(err.Error(), "last stderr line: oops") {
		t.Errorf("message %q", err)
	}
	if code == "timeout" && time.Since(start) > 5*time.Second {
		t.Errorf("the timeout took %v", time.Since(start))
	}
}

func TestRunNeedsGPUs(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("[[job]]\ntype = \"t\"\ncommand = [\"/bin/true\"]\ngpus = 2\n", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	one, _ := NewDevices([]string{"0"})
	if _, err := NewExecutor(cfg, one, nil); !errors.Is(err, ErrNotEnoughGPUs) {
		t.Errorf("a job of 2 GPUs on a worker of 1: %v", err)
	}
	e := executor(t, "exit 0", "", one)
	j := testJob()
	j.Requirements.GPUCount = 2
	if f := failure(t, e.Run(context.Background(), j, &recorder{})); f.Code != "not_enough_gpus" {
		t.Errorf("code %s", f.Code)
	}
	// Waiting for a GPU ends with the job's context.
	held, _ := one.Acquire(context.Background(), 1)
	defer one.Release(held)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(client.ErrDrained)
	rec := &recorder{}
	if err := e.Run(ctx, testJob(), rec); !errors.Is(err, client.ErrDrained) {
		t.Errorf("waiting for a GPU: %v", err)
	}
	if !rec.logged("waiting for 1 GPUs (0 free)") {
		t.Errorf("logs %q", rec.logs)
	}
}

// pids reads the pids a script wrote, one a line, waiting for n.
func pids(t *testing.T, path string, n int) []int {
	t.Helper()
	var out []int
	waitfor.Until(t, fmt.Sprintf("%d pids in %s", n, path), func() bool {
		b, _ := os.ReadFile(path)
		out = out[:0]
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				out = append(out, p)
			}
		}
		return len(out) >= n
	})
	t.Cleanup(func() {
		for _, p := range out {
			if !processGone(p) {
				_ = syscallKill(p)
			}
		}
	})
	return out
}

// checkGone fails unless every pid runs no more.
func checkGone(t *testing.T, ps []int) {
	t.Helper()
	for _, p := range ps {
		if !processGone(p) {
			t.Errorf("process %d survived", p)
			_ = syscallKill(p)
		}
	}
}

func TestRunCancelKillsTheGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, script string
		grace        time.Duration
		atLeast      time.Duration
	}{
		// The shell exits on SIGTERM; its grandchild sleep too.
		{"grandchild", `sleep 1000 & echo $$ > "$PIDS"; echo $! >> "$PIDS"; wait`, 3 * time.Second, 0},
		// SIGTERM ignored by the whole group: SIGKILL after kill_grace.
		// Each shell writes its pid once it ignores SIGTERM.
		{"ignores SIGTERM", `trap '' TERM; sh -c 'trap "" TERM; echo $$ >> "$PIDS"; exec sleep 1000' & echo $$ >> "$PIDS"; while :; do sleep 1; done`, time.Second, time.Second},
	}
	for _, tc := range tests {
		for _, mode := range modes {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				testRunCancel(t, mode, tc.script, tc.grace, tc.atLeast)
			})
		}
	}
}

func testRunCancel(t *testing.T, mode, script string, grace, atLeast time.Duration) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := executorIn(t, mode, "export PIDS="+pidFile+"\n"+script, fmt.Sprintf("kill_grace = %q\ngpus = 0", grace), nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, testJob(), &recorder{}) }()
	ps := pids(t, pidFile, 2)
	start := time.Now()
	cancel(client.ErrJobCanceled)
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrJobCanceled) {
			t.Errorf("Run returned %v, want the cause", err)
		}
	case <-time.After(grace + time.Second):
		t.Fatalf("Run did not return within kill_grace + 1s")
	}
	if took := time.Since(start); took < atLeast {
		t.Errorf("the group was killed after %v, before its kill_grace", took)
	}
	checkGone(t, ps)
}

// A process left in the background, holding the pipes, is killed when
// the command exits: it neither survives nor hangs the run.
func TestRunSweepsTheGroupOnExit(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { t.Parallel(); testRunSweeps(t, mode) })
	}
}

func testRunSweeps(t *testing.T, mode string) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := executorIn(t, mode, `sleep 1000 & echo $! > `+pidFile+`; echo done`, "gpus = 0", nil)
	start := time.Now()
	if err := e.Run(context.Background(), testJob(), &recorder{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the run took %v", took)
	}
	checkGone(t, pids(t, pidFile, 1))
}

func TestRunRefusesArtifactEscapes(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := executor(t, `
cd "$NODELANE_OUTPUT_DIR"
ln -s `+secret+` link
mkfifo fifo
mkdir d
echo 'nodelane:artifact {"path": "../payload.json"}'
echo 'nodelane:artifact {"path": "/etc/passwd"}'
echo 'nodelane:artifact {"path": "link"}'
echo 'nodelane:artifact {"path": "fifo"}'
echo 'nodelane:artifact {"path": "d"}'
echo 'nodelane:artifact {"path": "missing"}'
`, "gpus = 0", nil)
	rec := &recorder{}
	if err := e.Run(context.Background(), testJob(), rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.artifacts) != 0 {
		t.Errorf("artifacts reported: %+v", rec.artifacts)
	}
	warnings := 0
	for i, p := range rec.payloads {
		if p["warning"] != nil {
			warnings++
		}
		if strings.Contains(rec.logs[i], "secret") && !strings.Contains(rec.logs[i], "not reported") {
			t.Errorf("log line %q", rec.logs[i])
		}
	}
	if warnings != 6 {
		t.Errorf("%d warnings, want 6: %q", warnings, rec.logs)
	}
}

// A flood of output neither blocks the process nor floods the log.
func TestRunFlood(t *testing.T) {
	t.Parallel()
	e := executor(t, `head -c 100000 /dev/zero | tr '\0' x; echo; echo end >&2; yes "a line of output" | head -n 300000`, "gpus = 0", nil)
	rec := &recorder{}
	start := time.Now()
	if err := e.Run(context.Background(), testJob(), rec); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("300000 lines took %v", took)
	}
	if !rec.logged("end") || !rec.logged("xxxxx"+TruncatedMark) {
		t.Errorf("the first lines were not logged")
	}
	// Each line let through after a drop is preceded by the count.
	took := time.Since(start)
	if n := len(rec.logs); float64(n) > DefaultLineBurst+2*DefaultLineRate*took.Seconds()+2 {
		t.Errorf("%d log lines: the rate is not bounded", n)
	}
	if !rec.logged("output lines dropped") {
		t.Errorf("no line says lines were dropped")
	}
}

// A process that leaves the group (setsid) and keeps the pipes open
// cannot hang the run: the worker stops reading readerGrace after the
// group is gone.
func TestRunEscapedProcessDoesNotHang(t *testing.T) {
	t.Parallel()
	setsid, err := exec.LookPath("setsid")
	if err != nil {
		t.Fatalf("setsid (util-linux) is needed: %v", err)
	}
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := executor(t, setsid+` sh -c 'echo $$ > `+pidFile+`; exec sleep 1000' &
while [ ! -s `+pidFile+` ]; do sleep 0.01; done
echo left`, "gpus = 0", nil)
	start := time.Now()
	rec := &recorder{}
	err = e.Run(context.Background(), testJob(), rec)
	took := time.Since(start)
	escaped := pids(t, pidFile, 1)
	if processGone(escaped[0]) {
		t.Errorf("the process that left the group is gone: the test tested nothing")
	}
	_ = syscallKill(escaped[0])
	if err != nil {
		t.Fatal(err)
	}
	if took < readerGrace || took > readerGrace+3*time.Second {
		t.Errorf("the run took %v", took)
	}
	if !rec.logged("left") {
		t.Errorf("logs %q", rec.logs)
	}
}

// TestRunUploadsArtifacts checks that with storage on, an artifact
// line's file is uploaded (its bytes, sum and name) rather than reported
// as metadata, before Run returns; and that a run whose upload fails is
// failed as retryable.
func TestRunUploadsArtifacts(t *testing.T) {
	t.Parallel()
	e := executor(t, `
head -c 300000 /dev/urandom > "$NODELANE_OUTPUT_DIR/model.bin"
echo 'nodelane:artifact {"path": "model.bin", "kind": "checkpoint", "metadata": {"step": 3}}'
`, "gpus = 0", nil)
	rec := &recorder{store: true}
	if err := e.Run(context.Background(), testJob(), rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.artifacts) != 0 || len(rec.uploads) != 1 {
		t.Fatalf("metadata reports %+v, uploads %d", rec.artifacts, len(rec.uploads))
	}
	u := rec.uploads[0]
	if u.a.Name != "model.bin" || u.a.Type != "checkpoint" || len(u.bytes) != 300000 || string(u.a.Metadata.(json.RawMessage)) != `{"step": 3}` ||
		!strings.HasPrefix(u.a.URI, "file:///") || !strings.HasSuffix(u.a.URI, "/output/model.bin") {
		t.Errorf("upload %+v (%d bytes)", u.a, len(u.bytes))
	}
	// A failed upload fails the run, retryable.
	e2 := executor(t, `
printf x > "$NODELANE_OUTPUT_DIR/a"
echo 'nodelane:artifact {"path": "a"}'
`, "gpus = 0", nil)
	bad := &failingUploads{recorder: recorder{store: true}}
	f := failure(t, e2.Run(context.Background(), testJob(), bad))
	if f.Code != "artifact_not_reported" || !f.Retryable || !bad.logged("artifact a not reported: lease_lost") {
		t.Errorf("failure %+v; logs %q", f, bad.logs)
	}
}

// failingUploads refuses every upload as lease_lost.
type failingUploads struct{ recorder }

func (r *failingUploads) UploadArtifactFrom(context.Context, io.ReaderAt, int64, client.ArtifactFile) (*wire.ArtifactResponse, error) {
	return nil, &client.APIError{Status: 409, Code: wire.CodeLeaseLost}
}

// TestRunResumesFromCheckpoint checks NODELANE_RESUME_FROM: set to the
// downloaded checkpoint when the grant names one, absent otherwise; a
// download that may succeed later fails the attempt as retryable, one
// that cannot starts the command without it.
func TestRunResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	e := executor(t, `
if [ -n "$NODELANE_RESUME_FROM" ]; then cp "$NODELANE_RESUME_FROM" "$NODELANE_OUTPUT_DIR/resumed"; else echo fresh; fi
`, "gpus = 0", nil)
	job := testJob()
	job.ResumeFrom = &wire.ResumeFrom{ArtifactID: "art_1", Name: "ckpt.bin", SizeBytes: 5}
	rec := &recorder{checkpoint: []byte("state")}
	if err := e.Run(context.Background(), job, rec); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimPrefix(rec.outputURI, "file://"), "resumed"))
	if err != nil || string(b) != "state" || !rec.logged("resuming from checkpoint art_1") || !rec.logged("/resume/ckpt.bin") {
		t.Errorf("resumed %q %v; logs %q", b, err, rec.logs)
	}

	rec = &recorder{checkpointErr: &client.APIError{Status: 503, Code: wire.CodeUnavailable}}
	if f := failure(t, e.Run(context.Background(), job, rec)); f.Code != "resume_failed" || !f.Retryable {
		t.Errorf("unavailable: %+v", f)
	}
	rec = &recorder{checkpointErr: fmt.Errorf("%w: wrong bytes", client.ErrChecksumMismatch)}
	if err := e.Run(context.Background(), job, rec); err != nil || !rec.logged("fresh") || !rec.logged("not downloaded") {
		t.Errorf("mismatch: %v; logs %q", err, rec.logs)
	}
	rec = &recorder{checkpoint: []byte("unused")}
	if err := e.Run(context.Background(), testJob(), rec); err != nil || !rec.logged("fresh") {
		t.Errorf("no checkpoint: %v; logs %q", err, rec.logs)
	}
}

// TestRunStorageOffLogsOnce checks the fallback of a control plane that
// stores no bytes: each artifact is reported as metadata only, and the
// executor says so in its log once, whatever the runs and artifacts.
func TestRunStorageOffLogsOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte(`
printf a > "$NODELANE_OUTPUT_DIR/a"
printf bb > "$NODELANE_OUTPUT_DIR/b"
echo 'nodelane:artifact {"path": "a"}'
echo 'nodelane:artifact {"path": "b"}'
`), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(fmt.Sprintf("[[job]]\ntype = \"t\"\ncommand = [\"/bin/sh\", %q]\ngpus = 0\n", path), dir)
	if err != nil {
		t.Fatal(err)
	}
	var log syncbuf.Buffer
	e, err := NewExecutor(cfg, nil, &Options{Workdir: filepath.Join(dir, "work"), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		rec := &recorder{}
		if err := e.Run(context.Background(), testJob(), rec); err != nil {
			t.Fatal(err)
		}
		if len(rec.artifacts) != 2 || len(rec.uploads) != 0 || rec.artifacts[1].SizeBytes != 2 {
			t.Fatalf("artifacts %+v, uploads %d", rec.artifacts, len(rec.uploads))
		}
	}
	if n := strings.Count(log.String(), "stores no artifact bytes"); n != 1 {
		t.Errorf("the fallback logged %d times, want once:\n%s", n, log.String())
	}
}
