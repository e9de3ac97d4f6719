package command

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// group is a started command: the leader of its own process group,
// whose stdout and stderr are pipes the worker reads.
type group struct {
	cmd            *exec.Cmd
	stdout, stderr *os.File
	pgid           int
}

// startGroup starts argv in a new process group. The child's stdin is
// /dev/null; its stdout and stderr are pipes whose write ends only the
// child (and what it starts) holds, so they end when the last of them
// exits or closes them.
func startGroup(argv, env []string, dir string) (*group, error) {
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
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: dir, Stdout: outW, Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	return &group{cmd: cmd, stdout: outR, stderr: errR, pgid: cmd.Process.Pid}, nil
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) {
	// ESRCH: the group is gone. EPERM: a member changed its credentials
	// (setuid); nothing more the worker can do.
	_ = syscall.Kill(-g.pgid, sig)
}

// alive reports whether a process of the group still runs. A zombie
// does not count: it runs nothing and holds no memory or GPU, and its
// reaping is its new parent's (init's) business.
func (g *group) alive() bool {
	if err := syscall.Kill(-g.pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, pgrp, ok := procStat(pid); ok && pgrp == g.pgid && st != 'Z' && st != 'X' {
			return true
		}
	}
	return false
}

// procStat returns a process's state letter and process group, from
// /proc/PID/stat.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(string(f[2]))
	return f[0][0], pgrp, err == nil
}

// processGone reports whether pid runs no more (it does not exist, or is
// a zombie).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	st, _, ok := procStat(pid)
	return !ok || st == 'Z' || st == 'X'
}

// exitStatus describes how the leader ended: its exit code, or the
// signal that killed it.
func exitStatus(ps *os.ProcessState) (code int, signal string) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return ps.ExitCode(), ""
	}
	if ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("SIG%d", int(ws.Signal()))
		}
		return -1, name
	}
	return ws.ExitStatus(), ""
}

// errUnsupported is nil: commands run on Linux.
var errUnsupported error

// wait waits for the leader to exit.
func (g *group) wait() (*os.ProcessState, error) {
	err := g.cmd.Wait()
	return g.cmd.ProcessState, err
}

// syscallKill sends SIGKILL to pid (tests clean up with it).
func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
