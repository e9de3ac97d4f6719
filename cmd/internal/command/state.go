package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// StateFile is the file, in an Executor's Workdir, that lists the
// process groups of the commands running (0600, replaced atomically on
// every change), so that the next start of the worker can kill what a
// run that died left behind (KillLeftovers).
const StateFile = "running.json"

// DefaultLeftoverTimeout is how long KillLeftovers waits for the
// processes it killed to be gone.
const DefaultLeftoverTimeout = 10 * time.Second

// ErrLeftovers means processes of a previous run survived SIGKILL for the
// whole timeout of KillLeftovers.
var ErrLeftovers = errors.New("command: processes of a previous run of the worker are still running")

// RunRecord is one running command in the state file. A process group
// is known by its pgid and its leader's start time (field 22 of
// /proc/PID/stat, clock ticks after boot), so that a reused pid is never
// taken for it, and by its session.
type RunRecord struct {
	JobID       string `json:"job_id"`
	Attempt     int    `json:"attempt"`
	PGID        int    `json:"pgid"`
	LeaderStart uint64 `json:"leader_start"`
	Session     int    `json:"session"`
	// ShimPID and ShimStart are the command shim's, 0 without one.
	ShimPID   int    `json:"shim_pid,omitempty"`
	ShimStart uint64 `json:"shim_start,omitempty"`
}

// state is the state file's content.
type state struct {
	Runs []RunRecord `json:"runs"`
}

// maxStateBytes bounds the state file a worker reads at start.
const maxStateBytes = 1 << 20

// Leftover is a process group of a previous run that KillLeftovers
// killed: its record and the processes it sent SIGKILL.
type Leftover struct {
	RunRecord
	PIDs []int
}

func (l Leftover) String() string {
	ps := make([]string, len(l.PIDs))
	for i, p := range l.PIDs {
		ps[i] = strconv.Itoa(p)
	}
	return fmt.Sprintf("job %s attempt %d: process group %d (pids %s)", l.JobID, l.Attempt, l.PGID, strings.Join(ps, " "))
}

// readState reads the state file of workdir; no file is no run.
func readState(workdir string) (*state, error) {
	path := filepath.Join(workdir, StateFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return &state{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxStateBytes {
		return nil, fmt.Errorf("command: %s is over %d bytes", path, maxStateBytes)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("command: %s: %w", path, err)
	}
	return &s, nil
}

// writeState replaces the state file of workdir: a temporary file, 0600,
// renamed over it.
func writeState(workdir string, s *state) error {
	if err := os.MkdirAll(workdir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(workdir, "."+StateFile+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(workdir, StateFile)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// KillLeftovers kills what a previous run of the worker on workdir left
// behind: for each command its state file lists, the shim (if it still
// runs, the same process: same pid and start time) and every process of
// the recorded group (SIGKILL: the previous run's jobs are forfeit; the
// control plane requeues them). A group whose leader's pid now names
// another process (another start time) is gone and left alone; without
// its leader, a process counts as the group's only if it is in the
// recorded group and session and started no earlier than the leader.
// It waits up to timeout (<= 0: DefaultLeftoverTimeout) for them to be
// gone (zombies count as gone), else returns an error wrapping
// ErrLeftovers, the file kept. Then it removes the file and returns what
// it killed. A worker calls it before it registers or leases.
func KillLeftovers(workdir string, timeout time.Duration) ([]Leftover, error) {
	if timeout <= 0 {
		timeout = DefaultLeftoverTimeout
	}
	if wd, err := filepath.Abs(workdir); err == nil {
		workdir = wd
	}
	s, err := readState(workdir)
	if err != nil {
		return nil, err
	}
	if len(s.Runs) == 0 {
		return nil, removeState(workdir)
	}
	if errUnsupported != nil {
		return nil, errUnsupported
	}
	var killed []Leftover
	var victims []victim
	for _, r := range s.Runs {
		l := Leftover{RunRecord: r}
		for _, v := range leftovers(r) {
			if killProcess(v) {
				victims = append(victims, v)
				l.PIDs = append(l.PIDs, v.pid)
			}
		}
		if len(l.PIDs) > 0 {
			killed = append(killed, l)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		victims = slices.DeleteFunc(victims, gone)
		if len(victims) == 0 {
			break
		}
		if time.Now().After(deadline) {
			pids := make([]string, len(victims))
			for i, v := range victims {
				pids[i] = strconv.Itoa(v.pid)
			}
			return killed, fmt.Errorf("%w: pids %s survive SIGKILL after %v (%s)", ErrLeftovers, strings.Join(pids, " "), timeout, filepath.Join(workdir, StateFile))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return killed, removeState(workdir)
}

func removeState(workdir string) error {
	if err := os.Remove(filepath.Join(workdir, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// victim is a process KillLeftovers kills: its pid and start time.
type victim struct {
	pid   int
	start uint64
}
