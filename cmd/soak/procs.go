package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// restartDelay is how long a supervised process stays down after it
// exited or was killed.
const restartDelay = 300 * time.Millisecond

// slot is a supervised process: a server replica or a worker. It is
// started again whenever it exits, until it is stopped.
type slot struct {
	name string
	bin  string
	args func() []string // read at each start
	log  string          // appended to
	// noStdout discards the process's standard output: the server shows
	// its tokens there, which the logs must not keep.
	noStdout bool
	// exited, when set, is told of each exit nobody asked for, with the
	// last line the process wrote.
	exited   func(msg string)
	lastExit string // the last exit told

	mu         sync.Mutex
	cmd        *exec.Cmd
	pending    string // what the current process was told: "" until then
	stopping   bool
	starts     int
	unexpected int // exits nobody asked for
	done       chan struct{}
}

// start starts the process and its supervisor.
func (s *slot) start() error {
	s.done = make(chan struct{})
	if err := s.spawn(); err != nil {
		return err
	}
	go s.supervise()
	return nil
}

func (s *slot) spawn() error {
	f, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	args := s.args()
	fmt.Fprintf(f, "=== soak: starting %s %q at %s\n", s.name, args, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if s.noStdout {
		cmd.Stdout = nil // the null device
	}
	// A process group of its own: a Ctrl-C on the terminal reaches the
	// soak only, which stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.pending = cmd, ""
	s.starts++
	s.mu.Unlock()
	return nil
}

func (s *slot) supervise() {
	defer close(s.done)
	for {
		s.mu.Lock()
		cmd := s.cmd
		s.mu.Unlock()
		err := cmd.Wait()
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		unexpected := s.pending == ""
		if unexpected {
			s.unexpected++
			s.note(fmt.Sprintf("exited on its own: %v", err))
		}
		s.mu.Unlock()
		if unexpected && s.exited != nil {
			// The same reason again (a server started while PostgreSQL
			// is down) is told once.
			if msg := fmt.Sprintf("exited on its own (%v): %s", err, s.lastLine()); msg != s.lastExit {
				s.lastExit = msg
				s.exited(s.name + " " + msg)
			}
		}
		time.Sleep(restartDelay)
		for {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return
			}
			err := s.spawn()
			if err == nil {
				break
			}
			s.note(fmt.Sprintf("cannot start: %v", err))
			time.Sleep(time.Second)
		}
	}
}

// note appends a line to the slot's log.
func (s *slot) note(msg string) {
	if f, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		fmt.Fprintf(f, "=== soak: %s %s at %s\n", s.name, msg, time.Now().UTC().Format(time.RFC3339Nano))
		f.Close()
	}
}

// lastLine is the last line the process wrote to the log before the
// soak's own note.
func (s *slot) lastLine() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(tail(b, 8192))), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.HasPrefix(lines[i], "=== soak:") && strings.TrimSpace(lines[i]) != "" {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// signal sends sig to the running process, which the supervisor then
// starts again; why is written to the log. False: the process is
// stopping or already being restarted, and was not signalled.
func (s *slot) signal(sig syscall.Signal, why string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || s.pending != "" {
		return false
	}
	s.pending = why
	s.note(why)
	_ = s.cmd.Process.Signal(sig)
	return true
}

// stop ends the process for good (sig, then SIGKILL after grace) and
// waits for the supervisor.
func (s *slot) stop(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(sig)
	}
	select {
	case <-s.done:
		return
	case <-time.After(grace):
	}
	s.mu.Lock()
	cmd = s.cmd // a restart may have raced the stop
	s.mu.Unlock()
	_ = cmd.Process.Kill()
	<-s.done
}

// counts returns the starts and the unexpected exits so far.
func (s *slot) counts() (starts, unexpected int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.unexpected
}
