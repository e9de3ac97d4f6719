package command

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// userCaps are the capabilities a worker needs to run its commands as
// another user: to start them as that user (setuid, setgid and
// setgroups), to hand it the run directory (chown), to read and remove
// what the command left there, whatever its modes (dac_override), and
// to signal its processes when the shim is gone (kill).
var userCaps = []struct {
	name string
	bit  uint
}{
	{"CAP_SETUID", unix.CAP_SETUID},
	{"CAP_SETGID", unix.CAP_SETGID},
	{"CAP_CHOWN", unix.CAP_CHOWN},
	{"CAP_DAC_OVERRIDE", unix.CAP_DAC_OVERRIDE},
	{"CAP_KILL", unix.CAP_KILL},
}

// canRunAs returns nil if this process can run commands as u, else an
// error wrapping ErrUser that says why. The worker must be root: a
// process leaving uid 0 for u loses every capability (capabilities(7)),
// while one that is not root would pass its ambient capabilities on to
// the commands.
func canRunAs(u *User) error {
	if euid := os.Geteuid(); euid != 0 {
		return fmt.Errorf("%w %s: the worker runs as uid %d, not root with %s (docs/COMMANDS.md §7)",
			ErrUser, u.Name, euid, capNames(userCaps))
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w %s: reading the worker's capabilities: %v", ErrUser, u.Name, err)
	}
	var missing []string
	for _, c := range userCaps {
		if data[c.bit/32].Effective&(1<<(c.bit%32)) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w %s: the worker lacks %s (docs/COMMANDS.md §7)", ErrUser, u.Name, strings.Join(missing, ", "))
	}
	return nil
}

func capNames(cs []struct {
	name string
	bit  uint
}) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// credential is the syscall.Credential of u; nil for nil.
func credential(u *User) *syscall.Credential {
	if u == nil {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// handOver makes u the owner of dir and of everything in it. A symbolic
// link is changed itself, never what it points to.
func handOver(dir string, u *User) error {
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(u.UID), int(u.GID))
	})
}

// ownedBy reports whether fi's file belongs to u.
func ownedBy(fi fs.FileInfo, u *User) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == u.UID
}

// nonDumpable marks this process non-dumpable (PR_SET_DUMPABLE 0): its
// /proc/PID files (environ, cwd, fd, mem, ...) belong to root and
// ptrace is refused, so that a process of the same user, such as a
// command, reads nothing of it.
func nonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("command: PR_SET_DUMPABLE: %w", err)
	}
	return nil
}
