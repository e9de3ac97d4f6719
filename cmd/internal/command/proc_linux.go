package command

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// group is a started command: the leader of its own process group,
// whose stdout and stderr are pipes the worker reads. Started through
// the shim (shim != nil), the leader is the shim's child, and every
// signal and the leader's status go through the shim's pipes.
type group struct {
	cmd            *exec.Cmd // the leader; with a shim, the shim
	stdout, stderr *os.File
	pgid           int
	// leaderStart and session identify the group in the state file: the
	// leader's start time (/proc/PID/stat field 22) and its session.
	leaderStart uint64
	session     int
	shim        *shimConn
}

// shimConn is the worker's end of a shim's pipes.
type shimConn struct {
	ctl     *os.File      // worker → shim: TERM, KILL; EOF: the worker is gone
	reports *bufio.Reader // shim → worker: pid, exit
	rep     *os.File
	pid     int
	start   uint64 // the shim's start time
}

// startGroup starts argv in a new process group. The child's stdin is
// /dev/null; its stdout and stderr are pipes whose write ends only the
// child (and what it starts) holds, so they end when the last of them
// exits or closes them. With shim (an executable that runs ShimMain when
// its first argument is ShimArg), the command is started by the shim,
// which ends the command's group, kill_grace after a SIGTERM, once the
// worker is gone (see ShimMain). With u, the command (and the shim) run
// as u.
func startGroup(argv, env []string, dir, shim string, killGrace time.Duration, u *User) (*group, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	var g *group
	if shim == "" {
		g, err = startDirect(argv, env, dir, outW, errW, credential(u))
	} else {
		g, err = startShim(shim, argv, env, dir, killGrace, outW, errW, credential(u))
	}
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	g.stdout, g.stderr = outR, errR
	return g, nil
}

func startDirect(argv, env []string, dir string, outW, errW *os.File, cred *syscall.Credential) (*group, error) {
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: dir, Stdout: outW, Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred}}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &group{cmd: cmd, pgid: cmd.Process.Pid}
	// The leader is the worker's child, not reaped yet: its stat is there.
	if st, ok := readStat(g.pgid); ok {
		g.leaderStart, g.session = st.start, st.session
	}
	return g, nil
}

func startShim(shim string, argv, env []string, dir string, killGrace time.Duration, outW, errW *os.File, cred *syscall.Credential) (*group, error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	// The shim is a process group of its own, so that a signal to the
	// worker's group (a terminal's Ctrl-C, kill -9 -PGID) does not take it
	// with the worker; fds 3-6 are shimCtlFD...shimStderrFD. With cred the
	// shim runs as the command's user already: it signals, and sees, the
	// command's processes as their own user (under hidepid too).
	cmd := &exec.Cmd{Path: shim, Args: append([]string{shim, ShimArg, killGrace.String()}, argv...),
		Env: env, Dir: dir, Stderr: os.Stderr, ExtraFiles: []*os.File{ctlR, repW, outW, errW},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred}}
	err = cmd.Start()
	ctlR.Close()
	repW.Close()
	if err != nil {
		ctlW.Close()
		repR.Close()
		return nil, err
	}
	c := &shimConn{ctl: ctlW, reports: bufio.NewReader(repR), rep: repR, pid: cmd.Process.Pid}
	if st, ok := readStat(c.pid); ok {
		c.start = st.start
	}
	g := &group{cmd: cmd, shim: c}
	fail := func(err error) (*group, error) {
		ctlW.Close()
		_ = cmd.Wait()
		repR.Close()
		return nil, err
	}
	line, err := c.reports.ReadString('\n')
	switch {
	case strings.HasPrefix(line, "error "):
		return fail(errors.New(strings.TrimSpace(strings.TrimPrefix(line, "error "))))
	case err != nil:
		return fail(fmt.Errorf("the command shim ended before it started the command: %w", err))
	}
	var start uint64
	if _, err := fmt.Sscanf(line, "pid %d %d %d\n", &g.pgid, &start, &g.session); err != nil || g.pgid <= 0 {
		return fail(fmt.Errorf("the command shim said %q", line))
	}
	g.leaderStart = start
	return g, nil
}

// signal sends sig to every process of the group (through the shim,
// which sends SIGKILL to what left the group too).
func (g *group) signal(sig syscall.Signal) {
	if g.shim != nil {
		msg := "TERM\n"
		if sig == syscall.SIGKILL {
			msg = "KILL\n"
		}
		if _, err := g.shim.ctl.WriteString(msg); err == nil {
			return
		}
		// The shim is gone (killed): the worker signals the group itself.
	}
	// ESRCH: the group is gone. EPERM: a member changed its credentials
	// (setuid); nothing more the worker can do.
	_ = syscall.Kill(-g.pgid, sig)
}

// alive reports whether a process of the group still runs. A zombie
// does not count: it runs nothing and holds no memory or GPU, and its
// reaping is its new parent's (init's) business.
func (g *group) alive() bool { return groupAlive(g.pgid) }

func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	alive := false
	scanProcs(func(_ int, st stat) bool {
		alive = st.pgrp == pgid && st.running()
		return !alive
	})
	return alive
}

// wait waits for the leader to exit and returns how it ended.
func (g *group) wait() (exitInfo, error) {
	if g.shim == nil {
		err := g.cmd.Wait()
		if g.cmd.ProcessState == nil {
			return exitInfo{code: -1}, err
		}
		return exitStatus(g.cmd.ProcessState.Sys().(syscall.WaitStatus)), nil
	}
	for {
		line, err := g.shim.reports.ReadString('\n')
		if err != nil {
			// The shim was killed: it no longer knows, nor do we.
			return exitInfo{code: -1, sig: "SHIM_LOST"}, errors.New("the command shim ended before the command")
		}
		var ws uint32
		if _, err := fmt.Sscanf(line, "exit %d\n", &ws); err == nil {
			return exitStatus(syscall.WaitStatus(ws)), nil
		}
	}
}

// close ends the shim, once the run is over: with its pipe closed it
// ends what is left of the command's processes and exits. Direct, it
// does nothing.
func (g *group) close() {
	if g.shim == nil {
		return
	}
	g.shim.ctl.Close()
	_, _ = io.Copy(io.Discard, g.shim.reports)
	_ = g.cmd.Wait()
	g.shim.rep.Close()
}

// shimPID returns the shim's pid and start time (0, 0 without a shim).
func (g *group) shimPID() (int, uint64) {
	if g.shim == nil {
		return 0, 0
	}
	return g.shim.pid, g.shim.start
}

// stat is what the worker reads of a process in /proc/PID/stat.
type stat struct {
	state   byte
	ppid    int
	pgrp    int
	session int
	start   uint64 // field 22: clock ticks after boot
}

// running: not a zombie (nor dead).
func (s stat) running() bool { return s.state != 'Z' && s.state != 'X' }

// readStat reads /proc/PID/stat.
func readStat(pid int) (stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, false
	}
	return parseStat(b)
}

func parseStat(b []byte) (stat, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, false
	}
	// After the command name: field 3 (state) is f[0], so field N is f[N-3].
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return stat{}, false
	}
	var s stat
	var err [4]error
	s.state = f[0][0]
	s.ppid, err[0] = strconv.Atoi(string(f[1]))
	s.pgrp, err[1] = strconv.Atoi(string(f[2]))
	s.session, err[2] = strconv.Atoi(string(f[3]))
	s.start, err[3] = strconv.ParseUint(string(f[19]), 10, 64)
	return s, errors.Join(err[:]...) == nil
}

// scanProcs calls fn with every process of /proc until fn returns false.
func scanProcs(fn func(pid int, st stat) bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && !fn(pid, st) {
			return
		}
	}
}

// processGone reports whether pid runs no more (it does not exist, or is
// a zombie).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	st, ok := readStat(pid)
	return !ok || !st.running()
}

// exitInfo is how a leader ended: its exit code, or the signal that
// killed it (then code is -1).
type exitInfo struct {
	code int
	sig  string
}

// exitStatus describes a wait status.
func exitStatus(ws syscall.WaitStatus) exitInfo {
	if ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("SIG%d", int(ws.Signal()))
		}
		return exitInfo{code: -1, sig: name}
	}
	return exitInfo{code: ws.ExitStatus()}
}

// errUnsupported is nil: commands run on Linux.
var errUnsupported error

// syscallKill sends SIGKILL to pid (tests clean up with it).
func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
