package command

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ShimArg is the hidden first argument that makes the worker's own
// executable the command shim: a program that runs commands through an
// Executor whose Options.Shim is os.Executable() must start with
//
//	if len(os.Args) > 1 && os.Args[1] == command.ShimArg {
//		os.Exit(command.ShimMain(os.Args[2:]))
//	}
const ShimArg = "__nodelane-command-shim"

// The shim's file descriptors (exec.Cmd.ExtraFiles, from 3).
const (
	shimCtlFD    = 3 // read: TERM and KILL lines from the worker; EOF: the worker is gone
	shimReportFD = 4 // write: "pid PID START SESSION", "exit WAITSTATUS", or "error MESSAGE"
	shimStdoutFD = 5 // the command's stdout
	shimStderrFD = 6 // the command's stderr
)

// shimKillWait bounds how long the shim waits for the processes it sent
// SIGKILL to (a process in uninterruptible sleep, such as one stuck in
// a GPU driver call, ends only when the call does).
const shimKillWait = 5 * time.Second

// ShimMain is the command shim (DESIGN.md §10a): args are kill_grace and
// the command's argv; its environment and working directory are the
// command's. It makes itself non-dumpable and a child subreaper (every descendant the
// command orphans becomes its child), starts the command in a new
// process group with stdin /dev/null and stdout and stderr the worker's
// pipes, reports the leader's pid, start time and session, relays TERM
// (SIGTERM to the group) and KILL (SIGKILL to the group and to every
// process orphaned to the shim), reports the leader's wait status, and
// when its control pipe ends (the worker exited or was killed, by any
// signal) it sends SIGTERM to the group and to every process orphaned to
// it, SIGKILL kill_grace later (at once after a KILL), reaps them and
// exits. It returns the shim's exit code.
func ShimMain(args []string) int {
	ctl := os.NewFile(shimCtlFD, "control")
	rep := os.NewFile(shimReportFD, "reports")
	if len(args) < 2 || ctl == nil || rep == nil {
		fmt.Fprintln(os.Stderr, "nodelane command shim: started by something other than the worker")
		return 2
	}
	report := func(format string, a ...any) {
		// EPIPE: the worker is gone (SIGPIPE is handled, below).
		_, _ = fmt.Fprintf(rep, format+"\n", a...)
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil || grace <= 0 {
		report("error the command shim was given kill_grace %q", args[0])
		return 2
	}
	// Handled, not ignored: an ignored signal would stay ignored in the
	// command. The shim obeys its control pipe only (and SIGKILL).
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for range sigs {
		}
	}()
	// Non-dumpable: the command, of the shim's user, cannot open the
	// shim's /proc files (its pipes to the worker among them).
	if err := nonDumpable(); err != nil {
		report("error %v", err)
		return 1
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		report("error PR_SET_CHILD_SUBREAPER: %v", err)
		return 1
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		report("error %v", err)
		return 1
	}
	// Only fds 0-2 reach the command: a command holding the report pipe
	// would keep the worker waiting after the shim is gone.
	for fd := shimCtlFD; fd <= shimStderrFD; fd++ {
		syscall.CloseOnExec(fd)
	}
	argv := args[1:]
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: os.Environ(),
		Files: []uintptr{devnull.Fd(), shimStdoutFD, shimStderrFD}, Sys: &syscall.SysProcAttr{Setpgid: true}})
	devnull.Close()
	_ = syscall.Close(shimStdoutFD)
	_ = syscall.Close(shimStderrFD)
	if err != nil {
		report("error fork/exec %s: %v", argv[0], err)
		return 1
	}
	st, _ := readStat(pid) // a child not reaped yet: its stat is there
	report("pid %d %d %d", pid, st.start, st.session)

	s := &shim{self: os.Getpid(), pgid: pid, report: report, signaled: map[int]bool{}}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(ctl)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	s.reap()
	for {
		select {
		case <-chld:
			s.reap()
		case line, ok := <-lines:
			if !ok {
				s.end(grace)
				return 0
			}
			switch line {
			case "TERM":
				_ = syscall.Kill(-s.pgid, syscall.SIGTERM)
			case "KILL":
				s.killed = true
				s.signalAll(syscall.SIGKILL)
			}
		}
	}
}

// shim is the command shim's state.
type shim struct {
	self, pgid  int
	killed      bool // the worker asked for SIGKILL
	groupTermed bool // the group was sent SIGTERM by end
	report      func(string, ...any)
	signaled    map[int]bool // orphans sent SIGTERM
}

// reap waits for every child that has ended; the leader's status is
// reported.
func (s *shim) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if pid == s.pgid {
			s.report("exit %d", uint32(ws))
		}
	}
}

// signalAll sends sig to the command's group and to every process
// orphaned to the shim (its children other than the leader, which is in
// the group). SIGTERM is sent once to the group and to each orphan.
func (s *shim) signalAll(sig syscall.Signal) {
	if sig == syscall.SIGKILL || !s.groupTermed {
		_ = syscall.Kill(-s.pgid, sig)
		s.groupTermed = true
	}
	scanProcs(func(pid int, st stat) bool {
		if st.ppid == s.self && st.running() && (sig == syscall.SIGKILL || !s.signaled[pid]) {
			_ = syscall.Kill(pid, sig)
			s.signaled[pid] = true
		}
		return true
	})
}

// alive reports whether a process of the group, or a child of the
// shim, still runs.
func (s *shim) alive() bool {
	alive := false
	scanProcs(func(pid int, st stat) bool {
		alive = st.running() && (st.pgrp == s.pgid || st.ppid == s.self)
		return !alive
	})
	return alive
}

// end ends every process left: SIGTERM, and SIGKILL after grace (at once
// if the worker had asked for SIGKILL), then reaps them.
func (s *shim) end(grace time.Duration) {
	s.reap()
	if !s.alive() {
		return
	}
	sig := syscall.SIGKILL
	if !s.killed {
		sig = syscall.SIGTERM
		fmt.Fprintf(os.Stderr, "nodelane command shim %d: the worker is gone; SIGTERM to process group %d and its orphans, SIGKILL after %v\n", s.self, s.pgid, grace)
		// The worker's stderr is let go: whatever waits for its end (a
		// supervisor, a terminal) need not wait for the shim's.
		if null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
			_ = syscall.Dup2(int(null.Fd()), 2)
			null.Close()
		}
	}
	deadline := time.Now().Add(grace)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		s.signalAll(sig)
		s.reap()
		if !s.alive() {
			return
		}
		if time.Now().After(deadline) {
			if sig == syscall.SIGKILL {
				return // stuck in the kernel (D state): nothing more to do
			}
			sig, deadline = syscall.SIGKILL, time.Now().Add(shimKillWait)
		}
		<-tick.C
	}
}
