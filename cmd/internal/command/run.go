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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Reporter is what a run reports to; *client.Reporter implements it.
// Log must not block.
type Reporter interface {
	Log(message string, payload any)
	Progress(ctx context.Context, message string, payload any) error
	Artifact(ctx context.Context, a client.ArtifactInfo) (*wire.ArtifactResponse, error)
	// UploadArtifactFrom uploads an artifact's bytes and records it as
	// stored; its error wraps client.ErrArtifactStorageOff when the
	// control plane stores no bytes.
	UploadArtifactFrom(ctx context.Context, src io.ReaderAt, size int64, a client.ArtifactFile) (*wire.ArtifactResponse, error)
	// DownloadCheckpoint downloads the checkpoint the job's grant names
	// (Job.ResumeFrom) into a directory and returns its path.
	DownloadCheckpoint(ctx context.Context, dir string) (string, error)
	SetOutput(outputURI string, metrics any, finalMessage string)
}

// ResumeEnv is the variable that names, for a command whose attempt
// resumes from a checkpoint, the downloaded checkpoint's path.
const ResumeEnv = "NODELANE_RESUME_FROM"

// MaxResultBytes bounds $NODELANE_OUTPUT_DIR/result.json: it becomes the
// completion's metrics, which the control plane bounds so.
const MaxResultBytes = wire.MaxPayloadBytes

// readerGrace is how long the worker still reads a run's pipes once its
// process group is gone (a process that left the group may hold them).
const readerGrace = 2 * time.Second

// ErrUser is wrapped by the error NewExecutor returns when the
// configuration's user is one the worker cannot run commands as.
var ErrUser = errors.New("command: the worker cannot run its commands as user")

// errTimeout is the cause of a run's context when its timeout passes.
var errTimeout = errors.New("command: the job ran over its timeout")

// Failure is why a run failed: the error_code it is reported with
// (wrapped with client.WithErrorCode) and whether another attempt may
// succeed (if not, it is wrapped with client.Permanent too).
type Failure struct {
	Code      string
	Retryable bool
	Err       error
}

func (f *Failure) Error() string { return f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// fail returns a run's failure, as the client's Runner reports it.
func fail(code string, retryable bool, err error) error {
	e := client.WithErrorCode(code, &Failure{Code: code, Retryable: retryable, Err: err})
	if !retryable {
		e = client.Permanent(e)
	}
	return e
}

// Options are an Executor's settings; nil means all defaults.
type Options struct {
	// Workdir holds the run directories (Workdir/runs/...), created 0700.
	// Defaults to "nodelane-work".
	Workdir string
	// LineRate and LineBurst bound the output lines a run logs per
	// second. Default to DefaultLineRate and DefaultLineBurst.
	LineRate  float64
	LineBurst int
	// LookupEnv reads the worker's environment (PATH, HOME, LANG and
	// env_pass). Defaults to os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Now is the clock of the line rate. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the executor's own events. Defaults to slog.Default().
	Logger *slog.Logger
	// Shim is the executable the commands are started through (Linux): the
	// worker's own, os.Executable(), whose main runs ShimMain when its
	// first argument is ShimArg. The shim ends a command's processes,
	// orphans included, when the worker dies, by any signal (DESIGN.md
	// §10a). Empty: the worker starts the commands itself, and a command
	// outlives a worker killed by SIGKILL until KillLeftovers at the
	// worker's next start.
	Shim string
	// Protected are files no artifact and no result.json may be, by any
	// path or hard link: the worker's identity and token files. They are
	// compared by device and inode when an artifact is read.
	Protected []string
}

// Executor runs the configured jobs. It is safe for concurrent use.
type Executor struct {
	cfg  *Config
	devs *Devices
	opts Options
	jobs map[string]*Job
	runs sync.WaitGroup

	// storageOffLogged is set once the executor has logged that the
	// control plane stores no artifact bytes.
	storageOffLogged atomic.Bool

	// stateMu guards running, the runs the state file lists.
	stateMu sync.Mutex
	running map[*run]RunRecord
}

// NewExecutor returns an Executor for cfg's jobs over devs (nil: no GPU).
// It fails if a job takes more GPUs than devs holds, or (wrapping
// ErrUser) if cfg names a user the process cannot run commands as: it
// must be root, with the capabilities docs/COMMANDS.md §7 lists. It
// marks the process non-dumpable (Linux's PR_SET_DUMPABLE 0), so that a
// command of the same user cannot read the worker's memory, environment
// or working directory through /proc. Without a user it logs a warning:
// the commands can read whatever the worker's user can.
func NewExecutor(cfg *Config, devs *Devices, opts *Options) (*Executor, error) {
	if errUnsupported != nil {
		return nil, errUnsupported
	}
	if cfg.User != nil {
		if err := canRunAs(cfg.User); err != nil {
			return nil, err
		}
	}
	if err := nonDumpable(); err != nil {
		return nil, err
	}
	if devs == nil {
		devs, _ = NewDevices(nil)
	}
	e := &Executor{cfg: cfg, devs: devs, jobs: map[string]*Job{}, running: map[*run]RunRecord{}}
	if opts != nil {
		e.opts = *opts
	}
	if e.opts.Workdir == "" {
		e.opts.Workdir = "nodelane-work"
	}
	wd, err := filepath.Abs(e.opts.Workdir)
	if err != nil {
		return nil, fmt.Errorf("command: workdir: %w", err)
	}
	e.opts.Workdir = wd
	if e.opts.LineRate <= 0 {
		e.opts.LineRate = DefaultLineRate
	}
	if e.opts.LineBurst <= 0 {
		e.opts.LineBurst = DefaultLineBurst
	}
	if e.opts.LookupEnv == nil {
		e.opts.LookupEnv = os.LookupEnv
	}
	if e.opts.Now == nil {
		e.opts.Now = time.Now
	}
	if e.opts.Logger == nil {
		e.opts.Logger = slog.Default()
	}
	for _, j := range cfg.Jobs {
		if j.GPUs > devs.Len() {
			return nil, fmt.Errorf("%w: job type %s takes %d GPUs, the worker has %d", ErrNotEnoughGPUs, j.Type, j.GPUs, devs.Len())
		}
		e.jobs[j.Type] = j
	}
	if cfg.User == nil {
		e.opts.Logger.Warn("the commands run as the worker's own user: they can read every file it can, its identity and token included; "+
			"set user in the configuration to run them as another (docs/COMMANDS.md §7)", "uid", os.Geteuid())
	} else if err := e.runsDir(); err != nil {
		return nil, err
	}
	return e, nil
}

// runsDir creates Workdir/runs/. With a user, it and Workdir are 0711:
// the user reaches its own run directories, but lists nothing.
func (e *Executor) runsDir() error {
	runs := filepath.Join(e.opts.Workdir, "runs")
	if err := os.MkdirAll(runs, 0o700); err != nil {
		return err
	}
	if e.cfg.User == nil {
		return nil
	}
	for _, d := range []string{e.opts.Workdir, runs} {
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("command: workdir: %w", err)
		}
	}
	return nil
}

// Register installs a handler for every configured job type on r.
func (e *Executor) Register(r *client.Runner) {
	for _, j := range e.cfg.Jobs {
		r.Handle(j.Type, e.Handler())
	}
}

// Handler returns the client.HandlerFunc that runs a job with Run.
func (e *Executor) Handler() client.HandlerFunc {
	return func(ctx context.Context, job *wire.Job, r *client.Reporter) error { return e.Run(ctx, job, r) }
}

// Wait waits until no run is left: every process group the executor
// started is gone. A worker calls it before it exits, so that no
// command outlives it.
func (e *Executor) Wait() { e.runs.Wait() }

// Run runs job's command and returns when its process group is gone:
// nil when it exited 0 (the completion's metrics are set from
// result.json), or the job's failure (client.WithErrorCode, and
// client.Permanent unless retryable), or context.Cause(ctx) when ctx was
// cancelled (the group was sent SIGTERM, then SIGKILL after kill_grace).
func (e *Executor) Run(ctx context.Context, job *wire.Job, rep Reporter) error {
	e.runs.Add(1)
	defer e.runs.Done()
	j := e.jobs[job.JobType]
	if j == nil {
		return fail("unknown_job_type", false, fmt.Errorf("no command for job type %s", job.JobType))
	}
	n := j.GPUs
	if n < 0 {
		n = max(job.Requirements.GPUCount, 0)
	}
	if n > e.devs.Len() {
		return fail("not_enough_gpus", false, fmt.Errorf("the job takes %d GPUs, the worker has %d", n, e.devs.Len()))
	}
	if free := e.devs.Free(); free < n {
		rep.Log(fmt.Sprintf("waiting for %d GPUs (%d free): other jobs hold them", n, free), nil)
	}
	gpus, err := e.devs.Acquire(ctx, n)
	if err != nil {
		return err
	}
	defer e.devs.Release(gpus)

	if err := e.runsDir(); err != nil {
		return fail("workdir", true, err)
	}
	runDir, err := os.MkdirTemp(filepath.Join(e.opts.Workdir, "runs"), safeName(job.ID)+"-a"+strconv.Itoa(job.Attempt)+"-")
	if err != nil {
		return fail("workdir", true, err)
	}
	outDir := filepath.Join(runDir, "output")
	if err := os.Mkdir(outDir, 0o700); err != nil {
		return fail("workdir", true, err)
	}
	payloadPath := filepath.Join(runDir, "payload.json")
	payload := []byte(job.Payload)
	if len(payload) == 0 {
		payload = []byte("null")
	}
	if err := os.WriteFile(payloadPath, payload, 0o600); err != nil {
		return fail("workdir", true, err)
	}
	defer os.Remove(payloadPath)

	resume, err := e.resume(ctx, job, rep, runDir)
	if err != nil {
		return err
	}
	if u := e.cfg.User; u != nil {
		// The run directory becomes the user's, 0700: no other job's.
		if err := handOver(runDir, u); err != nil {
			return fail("workdir", true, err)
		}
	}
	r := &run{e: e, j: j, job: job, rep: rep, outDir: outDir,
		bucket: newBucket(e.opts.LineRate, e.opts.LineBurst, e.opts.Now), q: newQueue()}
	env := r.environ(payloadPath, gpus)
	if resume != "" {
		env = append(env, ResumeEnv+"="+resume)
	}
	dir := j.Workdir
	if dir == "" {
		dir = runDir
	}
	return r.execute(ctx, env, dir)
}

// resume downloads the checkpoint job's grant names, if any, into
// runDir/resume/ and returns its path. A download that may succeed later fails
// the attempt as retryable (error_code resume_failed); one that cannot
// (the bytes are not the checkpoint's, or it is gone) is logged, and the
// command starts without a checkpoint.
func (e *Executor) resume(ctx context.Context, job *wire.Job, rep Reporter, runDir string) (string, error) {
	rf := job.ResumeFrom
	if rf == nil {
		return "", nil
	}
	// A directory of its own: no checkpoint name can take the place of
	// payload.json or output/.
	dir := filepath.Join(runDir, "resume")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fail("workdir", true, err)
	}
	path, err := rep.DownloadCheckpoint(ctx, dir)
	switch {
	case err == nil:
		rep.Log(fmt.Sprintf("resuming from checkpoint %s (%s, %d bytes) at %s", rf.ArtifactID, rf.Name, rf.SizeBytes, path), nil)
		return path, nil
	case ctx.Err() != nil:
		return "", context.Cause(ctx)
	case client.IsRetryable(err) || client.IsLeaseLost(err):
		return "", fail("resume_failed", true, fmt.Errorf("downloading checkpoint %s: %w", rf.ArtifactID, err))
	}
	rep.Log(fmt.Sprintf("checkpoint %s not downloaded: %v; the command starts without %s", rf.ArtifactID, err, ResumeEnv),
		map[string]any{"warning": "checkpoint not downloaded"})
	e.opts.Logger.Warn("checkpoint not downloaded; the command starts without it", "job", job.ID, "artifact", rf.ArtifactID, "err", err)
	return "", nil
}

// run is one run of a job's command.
type run struct {
	e      *Executor
	j      *Job
	job    *wire.Job
	rep    Reporter
	outDir string
	bucket *bucket
	q      *queue

	mu          sync.Mutex
	lastStderr  string
	notReported int
}

// environ is the command's scrubbed environment.
func (r *run) environ(payloadPath string, gpus []string) []string {
	var env []string
	u := r.e.cfg.User
	for _, k := range append([]string{"PATH", "HOME", "LANG"}, r.j.EnvPass...) {
		if k == "HOME" && u != nil {
			// The user's own, not the worker's, which it cannot use.
			env = append(env, "HOME="+u.Home)
		} else if v, ok := r.e.opts.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		} else if k == "PATH" {
			env = append(env, "PATH=/usr/local/bin:/usr/bin:/bin")
		}
	}
	return append(env,
		"NODELANE_JOB_ID="+r.job.ID,
		"NODELANE_JOB_TYPE="+r.job.JobType,
		"NODELANE_ATTEMPT="+strconv.Itoa(r.job.Attempt),
		"NODELANE_PAYLOAD="+payloadPath,
		"NODELANE_OUTPUT_DIR="+r.outDir,
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		"CUDA_VISIBLE_DEVICES="+strings.Join(gpus, ","))
}

func (r *run) execute(ctx context.Context, env []string, dir string) error {
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if r.j.Timeout > 0 {
		runCtx, cancel = context.WithTimeoutCause(ctx, r.j.Timeout, errTimeout)
	}
	defer cancel()
	g, err := startGroup(r.j.Command, env, dir, r.e.opts.Shim, r.j.KillGrace, r.e.cfg.User)
	if err != nil {
		return fail("start_failed", false, fmt.Errorf("starting %s: %w", r.j.Command[0], err))
	}
	rec := RunRecord{JobID: r.job.ID, Attempt: r.job.Attempt, PGID: g.pgid, LeaderStart: g.leaderStart, Session: g.session}
	rec.ShimPID, rec.ShimStart = g.shimPID()
	r.e.track(r, &rec)
	defer func() {
		// The shim ends once every process of the command is gone; only
		// then is the run off the state file.
		g.close()
		r.e.track(r, nil)
	}()
	var readers sync.WaitGroup
	for _, s := range []struct {
		name string
		f    *os.File
	}{{"stdout", g.stdout}, {"stderr", g.stderr}} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			_ = readLines(s.f, MaxLineBytes, func(line string, truncated bool) { r.line(s.name, line, truncated) })
		}()
	}
	eventsDone := make(chan struct{})
	go func() {
		defer close(eventsDone)
		r.events(ctx)
	}()

	var status exitInfo
	exited := make(chan struct{})
	go func() {
		status, _ = g.wait()
		close(exited)
	}()
	killed := false
	select {
	case <-exited:
	case <-runCtx.Done():
		killed = true
		grace := time.NewTimer(r.j.KillGrace)
		g.signal(syscall.SIGTERM)
		// The group has kill_grace to end, the leader and the rest.
		select {
		case <-exited:
			r.waitGroup(g, grace.C)
		case <-grace.C:
		}
		grace.Stop()
	}
	// Whatever is left of the group, now that its leader is gone (or its
	// grace is over), is killed: no process outlives its job.
	g.signal(syscall.SIGKILL)
	<-exited
	r.waitGroup(g, time.After(5*time.Second))

	readersDone := make(chan struct{})
	go func() {
		readers.Wait()
		close(readersDone)
	}()
	select {
	case <-readersDone:
	case <-time.After(readerGrace):
		// A process outside the group holds the pipes: stop reading.
		g.stdout.Close()
		g.stderr.Close()
		<-readersDone
	}
	g.stdout.Close()
	g.stderr.Close()
	if d := r.bucket.flush(); d > 0 {
		r.rep.Log(r.droppedMessage(d), nil)
	}
	r.q.close()
	<-eventsDone

	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if killed {
		return fail("timeout", false, fmt.Errorf("the command ran over its timeout of %v", r.j.Timeout))
	}
	code, sig := status.code, status.sig
	r.mu.Lock()
	last, notReported := r.lastStderr, r.notReported
	r.mu.Unlock()
	if last != "" {
		last = "; last stderr line: " + last
	}
	switch {
	case sig != "":
		return fail("signal_"+sig, true, fmt.Errorf("the command was killed by %s%s", sig, last))
	case code != 0:
		return fail("exit_"+strconv.Itoa(code), slices.Contains(r.j.RetryOnExit, code),
			fmt.Errorf("the command exited with status %d%s", code, last))
	case notReported > 0:
		return fail("artifact_not_reported", true, fmt.Errorf("%d artifacts could not be reported", notReported))
	}
	metrics, err := r.e.readResult(r.outDir)
	if err != nil {
		return fail("bad_result", false, err)
	}
	r.rep.SetOutput(fileURI(r.outDir), metrics, "exit 0")
	return nil
}

// track puts r's record on the state file, or (rec nil) takes it off.
// A state file that cannot be written is logged: the run goes on (with
// a shim, the worker's death still ends it).
func (e *Executor) track(r *run, rec *RunRecord) {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	if rec != nil {
		e.running[r] = *rec
	} else {
		delete(e.running, r)
	}
	s := &state{Runs: []RunRecord{}}
	for _, x := range e.running {
		s.Runs = append(s.Runs, x)
	}
	slices.SortFunc(s.Runs, func(a, b RunRecord) int { return a.PGID - b.PGID })
	if err := writeState(e.opts.Workdir, s); err != nil {
		e.opts.Logger.Warn("the state file of the running commands could not be written: a restart after a crash may not find them",
			"file", filepath.Join(e.opts.Workdir, StateFile), "err", err)
	}
}

// waitGroup waits until no process of the group runs, or until done.
func (r *run) waitGroup(g *group, done <-chan time.Time) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for g.alive() {
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

func (r *run) droppedMessage(n int64) string {
	return fmt.Sprintf("%d output lines dropped: over the limit of %v lines per second", n, r.e.opts.LineRate)
}

// line handles one output line. It never blocks.
func (r *run) line(stream, line string, truncated bool) {
	payload := map[string]any{"stream": stream}
	if stream == "stdout" && !truncated {
		p, a, err := ParseLine(line)
		switch {
		case err != nil:
			payload["warning"] = err.Error()
		case p != nil:
			r.q.push(event{p: p})
			return
		case a != nil:
			if !r.q.push(event{a: a}) {
				payload["warning"] = fmt.Sprintf("over %d artifacts: not reported", MaxArtifacts)
			} else {
				return
			}
		}
	}
	if truncated {
		line += TruncatedMark
		if hasPrefix(line, ProgressPrefix) || hasPrefix(line, ArtifactPrefix) {
			payload["warning"] = fmt.Sprintf("over %d bytes: not read", MaxLineBytes)
		}
	}
	if stream == "stderr" && line != "" {
		r.mu.Lock()
		r.lastStderr = line
		if len(r.lastStderr) > 512 {
			r.lastStderr = strings.ToValidUTF8(trimRune(r.lastStderr[:512]), "") + "..."
		}
		r.mu.Unlock()
	}
	ok, dropped := r.bucket.take()
	if !ok {
		return
	}
	if dropped > 0 {
		r.rep.Log(r.droppedMessage(dropped), nil)
	}
	r.rep.Log(line, payload)
}

// events reports the progress and artifact lines, in order, until the
// queue is closed and empty or ctx ends.
func (r *run) events(ctx context.Context) {
	for {
		ev, ok := r.q.next(ctx)
		if !ok {
			return
		}
		if ev.p != nil {
			r.progress(ctx, ev.p)
		} else {
			r.artifact(ctx, ev.a)
		}
	}
}

func (r *run) progress(ctx context.Context, p *Progress) {
	payload := map[string]any{}
	msg := p.Message
	if p.Fraction != nil {
		payload["fraction"] = *p.Fraction
		if msg == "" {
			msg = fmt.Sprintf("%.0f%%", *p.Fraction*100)
		}
	}
	if len(p.Metrics) > 0 && string(p.Metrics) != "null" {
		payload["metrics"] = p.Metrics
	}
	if err := r.rep.Progress(ctx, msg, payload); err != nil && ctx.Err() == nil {
		// Progress is advisory: the heartbeat keeps the lease.
		r.e.opts.Logger.Debug("progress not reported", "job", r.job.ID, "err", err)
	}
}

// artifact reports an artifact line's file: its bytes are uploaded when
// the control plane stores them, else (artifact_storage_off) it is
// reported as metadata only. Either way its uri is the file's file://
// URI on this box.
func (r *run) artifact(ctx context.Context, a *Artifact) {
	f, size, err := r.e.openArtifact(r.outDir, a.Path)
	if errors.Is(err, errProtected) {
		r.e.opts.Logger.Warn("a command reported one of the worker's own files as an artifact: refused", "job", r.job.ID, "path", a.Path, "err", err)
	}
	if err != nil {
		r.rep.Log(fmt.Sprintf("artifact %s not reported: %v", a.Name, err), map[string]any{"warning": "bad artifact"})
		return
	}
	defer f.Close()
	sum, err := digest(ctx, f, size)
	if err != nil {
		r.rep.Log(fmt.Sprintf("artifact %s not reported: %v", a.Name, err), map[string]any{"warning": "bad artifact"})
		return
	}
	var md any
	if len(a.Metadata) > 0 && string(a.Metadata) != "null" {
		md = a.Metadata
	}
	uri := fileURI(filepath.Join(r.outDir, a.Path))
	_, err = r.rep.UploadArtifactFrom(ctx, f, size, client.ArtifactFile{Type: a.Kind, Name: a.Name, Metadata: md, URI: uri, SHA256: sum})
	if errors.Is(err, client.ErrArtifactStorageOff) {
		if r.e.storageOffLogged.CompareAndSwap(false, true) {
			r.e.opts.Logger.Info("the control plane stores no artifact bytes: artifacts are reported as metadata only, with their file:// URIs",
				"job", r.job.ID)
		}
		_, err = r.rep.Artifact(ctx, client.ArtifactInfo{Type: a.Kind, Name: a.Name,
			URI: uri, SHA256: sum, SizeBytes: size, Metadata: md})
	}
	if err != nil && ctx.Err() == nil {
		r.rep.Log(fmt.Sprintf("artifact %s not reported: %s", a.Name, errorText(err)), map[string]any{"warning": "artifact not reported"})
		r.mu.Lock()
		r.notReported++
		r.mu.Unlock()
	}
}

// errorText is the PROTOCOL.md code of err, or its message when it has
// none (the upload's own failures: a file that changed, the store out of
// reach).
func errorText(err error) string {
	if code := client.ErrorCode(err); code != "" {
		return code
	}
	return err.Error()
}

// errProtected is why a file of the command's output is refused: it is
// one of the worker's own (Options.Protected), or not the user's.
var errProtected = errors.New("it is not the command's own file")

// openArtifact opens the regular file at rel inside dir, and returns it
// with its size; a path that leaves dir, through ".." or a symbolic
// link, is refused, and so is a file that is not the command's own
// (errProtected).
func (e *Executor) openArtifact(dir, rel string) (*os.File, int64, error) {
	if !filepath.IsLocal(rel) {
		return nil, 0, fmt.Errorf("path %q is not inside NODELANE_OUTPUT_DIR", rel)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, 0, err
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO must not hang the worker; it is refused below.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("path %q is not a regular file", rel)
	}
	if err := e.commandsOwn(fi); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("path %q: %w", rel, err)
	}
	return f, fi.Size(), nil
}

// commandsOwn returns an error wrapping errProtected if fi is one of
// Options.Protected, or (with a user) a file the user does not own: a
// hard link the command made to a file of the worker's.
func (e *Executor) commandsOwn(fi os.FileInfo) error {
	for _, p := range e.opts.Protected {
		if pi, err := os.Stat(p); err == nil && os.SameFile(fi, pi) {
			return fmt.Errorf("%w: it is the worker's %s", errProtected, p)
		}
	}
	if u := e.cfg.User; u != nil && !ownedBy(fi, u) {
		return fmt.Errorf("%w: user %s does not own it", errProtected, u.Name)
	}
	return nil
}

// digest returns the SHA-256 (lowercase hex) of the size bytes of f.
func digest(ctx context.Context, f *os.File, size int64) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, io.NewSectionReader(f, 0, size)})
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", filepath.Base(f.Name()), err)
	}
	if n != size {
		return "", fmt.Errorf("%s changed while it was read", filepath.Base(f.Name()))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader is a reader that fails once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, context.Cause(r.ctx)
	}
	return r.r.Read(p)
}

// readResult reads outDir/result.json, if present: a JSON object of at
// most MaxResultBytes, the command's own file (see commandsOwn). It returns nil metrics if there is none.
func (e *Executor) readResult(outDir string) (any, error) {
	root, err := os.OpenRoot(outDir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.OpenFile("result.json", os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("result.json is not a regular file")
	}
	if err := e.commandsOwn(fi); err != nil {
		return nil, fmt.Errorf("result.json: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxResultBytes+1))
	if err != nil {
		return nil, fmt.Errorf("result.json: %w", err)
	}
	if len(b) > MaxResultBytes {
		return nil, fmt.Errorf("result.json is over %d bytes", MaxResultBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return nil, errors.New("result.json is not a JSON object")
	}
	return json.RawMessage(b), nil
}

// safeName keeps a job id usable as part of a file name.
func safeName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}

func fileURI(path string) string { return "file://" + filepath.ToSlash(path) }

// event is a progress or an artifact line.
type event struct {
	p *Progress
	a *Artifact
}

// maxPendingProgress bounds the progress events waiting to be reported;
// beyond, the newest waiting one is replaced.
const maxPendingProgress = 64

// queue holds the events the reader has not reported yet, bounded: with
// maxPendingProgress progress events waiting, a progress event waiting
// last in the queue is replaced by a newer one, and at most MaxArtifacts
// artifacts are taken.
type queue struct {
	mu        sync.Mutex
	items     []event
	progress  int // waiting progress events
	artifacts int
	closed    bool
	wake      chan struct{}
}

func newQueue() *queue { return &queue{wake: make(chan struct{}, 1)} }

// push adds ev; false means it was refused (too many artifacts).
func (q *queue) push(ev event) bool {
	q.mu.Lock()
	switch {
	case ev.a != nil && q.artifacts >= MaxArtifacts:
		q.mu.Unlock()
		return false
	case ev.a != nil:
		q.artifacts++
		q.items = append(q.items, ev)
	case q.progress >= maxPendingProgress && q.items[len(q.items)-1].p != nil:
		q.items[len(q.items)-1] = ev
	default:
		q.progress++
		q.items = append(q.items, ev)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest event, waiting for one; false once the queue
// is closed and empty, or ctx ended.
func (q *queue) next(ctx context.Context) (event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items = q.items[1:]
			if ev.p != nil {
				q.progress--
			}
			q.mu.Unlock()
			return ev, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return event{}, false
		}
		select {
		case <-ctx.Done():
			return event{}, false
		case <-q.wake:
		}
	}
}
