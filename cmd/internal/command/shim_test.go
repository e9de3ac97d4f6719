//go:build linux

package command

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
)

// stubborn is a script whose shell ignores SIGTERM and prints nothing,
// with a child that ignores SIGTERM too and one that left the group
// (setsid); it writes the three pids to $PIDS.
const stubborn = `trap '' TERM
sh -c 'trap "" TERM; exec sleep 1000' &
echo $$ > "$PIDS.tmp"; echo $! >> "$PIDS.tmp"
setsid sh -c 'trap "" TERM; echo $$ >> "$PIDS.tmp"; mv "$PIDS.tmp" "$PIDS"; exec sleep 1000' &
while :; do sleep 1; done
`

// waitGone waits until every pid runs no more, failing the test after
// within, and says how long it took.
func waitGone(t *testing.T, ps []int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitfor.Within(t, within, fmt.Sprintf("the processes %v to end", ps), func() bool {
		for _, p := range ps {
			if !processGone(p) {
				return false
			}
		}
		return true
	})
	return time.Since(start)
}

// When the worker's end of the control pipe closes (the worker died),
// the shim sends SIGTERM to the command's group and to what left it,
// SIGKILL kill_grace later, and exits.
func TestShimEndsTheCommandWhenTheWorkerIsGone(t *testing.T) {
	t.Parallel()
	setsid(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pids")
	const grace = time.Second
	g, err := startGroup([]string{"/bin/sh", "-c", stubborn}, []string{"PATH=/usr/bin:/bin", "PIDS=" + pidFile}, dir, os.Args[0], grace, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.stdout.Close()
	defer g.stderr.Close()
	ps := pids(t, pidFile, 3)
	// The session may be 0: a session whose leader lives outside this PID
	// namespace (as under some CI runners) reads as 0 in /proc.
	if st, ok := readStat(ps[0]); ps[0] != g.pgid || g.leaderStart == 0 || !ok || st.session != g.session || st.start != g.leaderStart {
		t.Errorf("group %d (start %d, session %d), the script says its pid is %d (%+v)", g.pgid, g.leaderStart, g.session, ps[0], st)
	}
	shimPID, shimStart := g.shimPID()
	if shimPID == 0 || shimStart == 0 {
		t.Fatalf("no shim: %d %d", shimPID, shimStart)
	}
	if st, _ := readStat(shimPID); st.pgrp != shimPID {
		t.Errorf("the shim is in process group %d, not one of its own", st.pgrp)
	}
	start := time.Now()
	g.shim.ctl.Close() // what the worker's death does
	took := waitGone(t, ps, grace+2*time.Second)
	if took < grace-100*time.Millisecond {
		t.Errorf("the processes ignoring SIGTERM were gone after %v, before kill_grace %v: no SIGTERM first?", took, grace)
	}
	if _, err := g.wait(); err != nil {
		t.Errorf("the shim did not report the leader's status: %v", err)
	}
	g.close()
	if since := time.Since(start); since > grace+3*time.Second {
		t.Errorf("the shim took %v to exit", since)
	}
	if !processGone(shimPID) {
		t.Errorf("the shim %d still runs", shimPID)
	}
}

func setsid(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Fatalf("setsid (util-linux) is needed: %v", err)
	}
}

// Through the shim, a process that left the group is killed with the
// rest once the command exits: no process outlives its job.
func TestShimKillsWhatLeftTheGroup(t *testing.T) {
	t.Parallel()
	setsid(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := executorIn(t, "shim", `setsid sh -c 'echo $$ > `+pidFile+`; exec sleep 1000' &
while [ ! -s `+pidFile+` ]; do sleep 0.01; done
echo left`, "gpus = 0", nil)
	start := time.Now()
	if err := e.Run(context.Background(), testJob(), &recorder{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > readerGrace {
		t.Errorf("the run took %v", took)
	}
	checkGone(t, pids(t, pidFile, 1))
}

// A command the shim cannot start fails the run as start_failed.
func TestShimStartFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := startGroup([]string{filepath.Join(dir, "none")}, nil, dir, os.Args[0], time.Second, nil)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("startGroup = %v, want no such file", err)
	}
}

// The state file lists each running command (0600) and none once done.
func TestStateFileTracksRuns(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pidFile := filepath.Join(t.TempDir(), "pids")
			e := executorIn(t, mode, "echo $$ > "+pidFile+"; sleep 1000", "gpus = 0\nkill_grace = \"1s\"", nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx, testJob(), &recorder{}) }()
			leader := pids(t, pidFile, 1)[0]
			s := waitRun(t, e.opts.Workdir)
			path := filepath.Join(e.opts.Workdir, StateFile)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("state file mode %v", fi.Mode())
			}
			r := s.Runs[0]
			st, _ := readStat(leader)
			if r.JobID != "job-1" || r.Attempt != 2 || r.PGID != leader || r.LeaderStart != st.start || r.Session != st.session {
				t.Errorf("record %+v, leader %d %+v", r, leader, st)
			}
			if (r.ShimPID != 0) != (mode == "shim") {
				t.Errorf("record %+v in %s mode", r, mode)
			}
			cancel()
			<-done
			if s, err := readState(e.opts.Workdir); err != nil || len(s.Runs) != 0 {
				t.Errorf("state after the run %+v %v", s, err)
			}
		})
	}
}

// waitRun waits for the state file of workdir to list one run, and
// returns it. The command may run (and write its pids) a moment before
// the executor records it.
func waitRun(t *testing.T, workdir string) *state {
	t.Helper()
	var s *state
	waitfor.Until(t, "the state file to list the run", func() bool {
		var err error
		s, err = readState(workdir)
		if err != nil {
			t.Fatalf("state file: %v", err)
		}
		return len(s.Runs) == 1
	})
	return s
}

// startStubborn starts the stubborn script in a group of its own, as a
// worker that is gone would have left it, and returns its record and
// pids.
func startStubborn(t *testing.T) (RunRecord, []int) {
	t.Helper()
	setsid(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	cmd := exec.Command("/bin/sh", "-c", stubborn)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PIDS=" + pidFile}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	ps := pids(t, pidFile, 3)
	st, ok := readStat(cmd.Process.Pid)
	if !ok {
		t.Fatal("no stat")
	}
	return RunRecord{JobID: "job-old", Attempt: 1, PGID: cmd.Process.Pid, LeaderStart: st.start, Session: st.session}, ps
}

// KillLeftovers kills the recorded groups' processes, but not a process
// whose pid was recorded with another start time (the pid was reused),
// and removes the file.
func TestKillLeftovers(t *testing.T) {
	t.Parallel()
	rec, ps := startStubborn(t)
	reused, reusedPIDs := startStubborn(t)
	reused.LeaderStart-- // the recorded leader started earlier: another process
	wd := t.TempDir()
	if err := writeState(wd, &state{Runs: []RunRecord{rec, reused}}); err != nil {
		t.Fatal(err)
	}
	killed, err := KillLeftovers(wd, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The process that left the group (setsid) is not found: only a
	// live shim could have ended it.
	checkGone(t, ps[:2])
	if len(killed) != 1 || killed[0].JobID != "job-old" || len(killed[0].PIDs) < 2 {
		t.Errorf("killed %+v, want the old job's processes", killed)
	}
	if !strings.Contains(killed[0].String(), "process group") {
		t.Errorf("String %q", killed[0].String())
	}
	for _, p := range reusedPIDs {
		if processGone(p) {
			t.Errorf("process %d of a group recorded with another start time was killed", p)
		}
	}
	if _, err := os.Stat(filepath.Join(wd, StateFile)); !os.IsNotExist(err) {
		t.Errorf("the state file is still there: %v", err)
	}
	// No file: nothing to do.
	if killed, err := KillLeftovers(wd, time.Second); err != nil || killed != nil {
		t.Errorf("KillLeftovers without a file = %v, %v", killed, err)
	}
}

// A shim the previous run left (it was still ending its command) is
// killed too, with its command's group.
func TestKillLeftoversKillsALiveShim(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := executorIn(t, "shim", "trap '' TERM; echo $$ > "+pidFile+"; while :; do sleep 1; done", "gpus = 0\nkill_grace = \"30s\"", nil)
	done := make(chan error, 1)
	go func() { done <- e.Run(context.Background(), testJob(), &recorder{}) }()
	leader := pids(t, pidFile, 1)[0]
	s := waitRun(t, e.opts.Workdir)
	if s.Runs[0].ShimPID == 0 {
		t.Fatalf("state %+v: no shim", s)
	}
	killed, err := KillLeftovers(e.opts.Workdir, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 1 || len(killed[0].PIDs) < 2 {
		t.Errorf("killed %+v, want the shim and the leader", killed)
	}
	checkGone(t, []int{leader, s.Runs[0].ShimPID})
	select {
	case err := <-done:
		if err == nil {
			t.Error("the run whose shim was killed succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end when its shim was killed")
	}
}

// A state file that is not JSON, or too large, stops the worker's start.
func TestKillLeftoversBadFile(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{"not json": "{", "huge": strings.Repeat(" ", maxStateBytes+1)} {
		wd := t.TempDir()
		if err := os.WriteFile(filepath.Join(wd, StateFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := KillLeftovers(wd, time.Second); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A record's JSON names are the documented ones.
	b, _ := json.Marshal(RunRecord{JobID: "j", PGID: 7, ShimPID: 8, ShimStart: 9})
	for _, k := range []string{`"job_id"`, `"attempt"`, `"pgid"`, `"leader_start"`, `"session"`, `"shim_pid"`, `"shim_start"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("record %s lacks %s", b, k)
		}
	}
}
