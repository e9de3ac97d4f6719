package command

import "syscall"

// leftovers returns the processes of r that still run: its shim and the
// processes of its group (see KillLeftovers).
func leftovers(r RunRecord) []victim {
	var out []victim
	if r.ShimPID > 0 {
		if st, ok := readStat(r.ShimPID); ok && st.start == r.ShimStart && st.running() {
			out = append(out, victim{r.ShimPID, st.start})
		}
	}
	if r.PGID <= 1 {
		return out
	}
	if st, ok := readStat(r.PGID); ok && st.start != r.LeaderStart {
		// The leader's pid is another process's: the group is gone (a
		// pid is not reused while it names a process group).
		return out
	}
	scanProcs(func(pid int, st stat) bool {
		if st.pgrp == r.PGID && st.session == r.Session && st.start >= r.LeaderStart && st.running() && pid != r.ShimPID {
			out = append(out, victim{pid, st.start})
		}
		return true
	})
	return out
}

// killProcess sends v SIGKILL if it is still the same process; false if
// it is gone or could not be signalled.
func killProcess(v victim) bool {
	if st, ok := readStat(v.pid); !ok || st.start != v.start {
		return false
	}
	return syscall.Kill(v.pid, syscall.SIGKILL) == nil
}

// gone reports whether v runs no more: no process of its pid and start
// time, or a zombie.
func gone(v victim) bool {
	st, ok := readStat(v.pid)
	return !ok || st.start != v.start || !st.running()
}
