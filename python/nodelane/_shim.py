"""The command shim: the supervising process between a worker and the command it runs (docs/COMMANDS.md §5).

process.run_command starts it as

    PYTHON -I -S .../nodelane/_shim.py CTL_FD STATUS_FD STDOUT_FD STDERR_FD

in a session of its own (so a signal to the worker's process group, a
terminal's Ctrl-C, does not reach it), with the worker's stderr as its own.
It imports nothing but the standard library and is run by its path, so it
needs no installed package. The file descriptors:

- CTL_FD (read), from the worker: first one line of JSON, the spec
  {"path": "/usr/bin/python3", "argv": [...], "env": {...}, "cwd": "...",
  "kill_grace": seconds} (the
  environment may hold secrets: it never goes on a command line), then
  "TERM" lines. Its end (EOF) means the worker is gone, whatever killed it.
- STATUS_FD (write), to the worker: JSON lines. {"error": "..."} when the
  command could not start; else {"pid", "pgid", "start", "session"} once it
  started (start: field 22 of /proc/PID/stat), then {"exit": N} or
  {"signal": "SIGSEGV", "signum": 11} when the command's leader ends.
- STDOUT_FD, STDERR_FD: the command's stdout and stderr (the worker reads
  them); the shim keeps no copy.

The shim makes itself non-dumpable and a child subreaper (every process the
command orphans, one that left the group included, becomes its child), and
starts the command in a new session and process group with stdin /dev/null.
"TERM" sends SIGTERM to the group and to every child of the shim, SIGKILL to
all of them kill_grace later. EOF does the same, and the shim writes one line
saying so to the worker's stderr. When the leader exits on its own, whatever
is left of the group and its orphans gets SIGKILL at once. The shim reaps
them all and exits once none runs (or SIGKILL_WAIT after SIGKILL, when one
is stuck in the kernel).
"""

import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time

#: The most bytes of the spec line.
MAX_SPEC_BYTES = 4 << 20
#: How long the shim waits for processes it sent SIGKILL (one in uninterruptible sleep, such as a
#: GPU driver call, ends only when the call does).
SIGKILL_WAIT = 5.0
#: How often the shim signals and looks for what is left while it ends the command, in seconds.
TICK = 0.05

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "prctl(%d): %s" % (option, os.strerror(e)))


def read_stat(pid: int):
    """(state, ppid, pgrp, session, start) of /proc/PID/stat, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            b = f.read()
    except OSError:
        return None
    i = b.rfind(b")")
    f = b[i + 1:].split()
    if i < 0 or len(f) < 20 or len(f[0]) != 1:
        return None
    try:
        return chr(f[0][0]), int(f[1]), int(f[2]), int(f[3]), int(f[19])
    except ValueError:
        return None


def _procs():
    """(pid, stat) of every process /proc lists."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                yield int(name), st


def _running(st) -> bool:
    return st[0] not in "ZX"


def _signal_name(n: int) -> str:
    if n < signal.SIGRTMIN:
        try:
            return signal.Signals(n).name
        except ValueError:
            pass
    return "SIG%d" % n


class Shim:
    """The shim's state once the command runs."""

    def __init__(self, status_fd: int, leader: int, grace: float):
        self.status_fd = status_fd
        self.self = os.getpid()
        self.pgid = leader
        self.grace = grace
        self.leader_done = False
        self.group_termed = False
        self.termed = set()
        self.term_deadline = None  # once SIGTERM was sent: when SIGKILL follows
        self.kill_deadline = None  # once SIGKILL was sent: when the shim stops waiting

    def report(self, **kw) -> None:
        """Write one status line to the worker; once it is gone (EPIPE), nothing."""
        try:
            os.write(self.status_fd, (json.dumps(kw) + "\n").encode())
        except OSError:
            pass

    def reap(self) -> None:
        """Wait for every child that ended; report the leader's status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            if pid == self.pgid:
                self.leader_done = True
                if os.WIFSIGNALED(status):
                    n = os.WTERMSIG(status)
                    self.report(signal=_signal_name(n), signum=n)
                else:
                    self.report(exit=os.waitstatus_to_exitcode(status))

    def signal_all(self, sig: int) -> None:
        """Send sig to the group and to every child of the shim (the processes orphaned to it).

        SIGTERM goes once to the group and once to each child; SIGKILL every time. The group is
        signalled only while a process of it is seen: once it is empty its id may name another's.
        """
        procs = list(_procs())
        if (sig == signal.SIGKILL or not self.group_termed) and any(st[2] == self.pgid for _, st in procs):
            try:
                os.killpg(self.pgid, sig)
            except OSError:
                pass
            self.group_termed = True
        for pid, st in procs:
            if st[1] == self.self and _running(st) and (sig == signal.SIGKILL or pid not in self.termed):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
                self.termed.add(pid)

    def alive(self) -> bool:
        """Whether a process of the group, or a child of the shim, still runs (a zombie does not)."""
        for _, st in _procs():
            if _running(st) and (st[2] == self.pgid or st[1] == self.self):
                return True
        return False

    def terminate(self) -> None:
        """SIGTERM to all, SIGKILL after the grace (see step)."""
        if self.term_deadline is None and self.kill_deadline is None:
            self.signal_all(signal.SIGTERM)
            self.term_deadline = time.monotonic() + self.grace

    def kill(self) -> None:
        """SIGKILL to all now, and every tick until none is left or SIGKILL_WAIT passed."""
        if self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + SIGKILL_WAIT
        self.signal_all(signal.SIGKILL)

    def gone(self) -> None:
        """The worker is gone: end what is left, saying so on its stderr, which is then let go."""
        if not self.alive():
            return
        _write_bounded(2, "nodelane command shim %d: the worker is gone; SIGTERM to process group %d and its "
                          "orphans, SIGKILL after %gs\n" % (self.self, self.pgid, self.grace))
        # Whatever waits for the end of the worker's stderr (a supervisor, a terminal) need not
        # wait for the shim's.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            pass
        self.terminate()

    def step(self) -> bool:
        """Reap, and signal what must be; False once the shim is done: the leader reaped and nothing
        left, or SIGKILL_WAIT after SIGKILL (a process stuck in the kernel)."""
        self.reap()
        now = time.monotonic()
        if self.leader_done and self.term_deadline is None and self.kill_deadline is None:
            self.kill()  # the command ended on its own: nothing of it outlives it
        elif self.kill_deadline is not None:
            self.signal_all(signal.SIGKILL)
        elif self.term_deadline is not None:
            if now >= self.term_deadline:
                self.kill()
            else:
                self.signal_all(signal.SIGTERM)  # an orphan that appeared since
        self.reap()
        if self.leader_done and not self.alive():
            return False
        return self.kill_deadline is None or now < self.kill_deadline

    def ending(self) -> bool:
        return self.leader_done or self.term_deadline is not None or self.kill_deadline is not None


class _Timeout(Exception):
    pass


def _alarm(signum, frame) -> None:
    raise _Timeout()


def _write_bounded(fd: int, text: str, seconds: float = 0.5) -> None:
    """Write text to fd, giving up after seconds (a full pipe nobody reads must not hold the shim) or on
    any error (EPIPE: nobody reads it any more)."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        os.write(fd, text.encode())
    except (OSError, _Timeout):
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _read_spec(ctl: int) -> "tuple[dict, bytes]":
    """The spec line of the control pipe, and what the worker wrote after it."""
    buf = b""
    while b"\n" not in buf:
        b = os.read(ctl, 65536)
        if not b:
            raise ValueError("the worker closed the control pipe before it sent the command")
        buf += b
        if len(buf) > MAX_SPEC_BYTES:
            raise ValueError("the command's spec is over %d bytes" % MAX_SPEC_BYTES)
    line, rest = buf.split(b"\n", 1)
    spec = json.loads(line)
    ok = (isinstance(spec, dict) and isinstance(spec.get("argv"), list) and spec["argv"]
          and all(isinstance(a, str) for a in spec["argv"]) and isinstance(spec.get("path"), str)
          and isinstance(spec.get("env"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in spec["env"].items())
          and isinstance(spec.get("cwd"), str) and isinstance(spec.get("kill_grace"), (int, float))
          and spec["kill_grace"] > 0)
    if not ok:
        raise ValueError("the command's spec is not path, argv, env, cwd and kill_grace")
    return spec, rest


def _ignore(signum, frame) -> None:
    """Handled, not ignored: an ignored signal would stay ignored in the command."""


def main(args) -> int:
    """Run the shim (see the module's doc); return its exit code."""
    try:
        ctl, status, out, err = (int(a) for a in args)
        os.fstat(ctl), os.fstat(status), os.fstat(out), os.fstat(err)
    except (ValueError, OSError):
        sys.stderr.write("nodelane command shim: started by something other than the worker\n")
        return 2

    def fail(msg: str) -> int:
        try:
            os.write(status, (json.dumps({"error": msg}) + "\n").encode())
        except OSError:
            pass
        return 1

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _ignore)
    try:
        spec, pending = _read_spec(ctl)
    except ValueError as e:
        return fail(str(e))
    try:
        # Non-dumpable: the command, of the shim's user, cannot open the shim's /proc files (its
        # pipes to the worker among them).
        _prctl(_PR_SET_DUMPABLE, 0)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError) as e:
        return fail("the command shim: %s" % e)
    # SIGCHLD wakes the loop below through the wakeup pipe.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, _ignore)
    try:
        p = subprocess.Popen(spec["argv"], executable=spec["path"], env=spec["env"], cwd=spec["cwd"],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                             start_new_session=True)
    except OSError as e:
        return fail(str(e))
    except (ValueError, subprocess.SubprocessError) as e:
        return fail("%s: %s" % (spec["argv"][0], e))
    os.close(out)
    os.close(err)
    st = read_stat(p.pid)  # a child not reaped yet: its stat is there
    shim = Shim(status, p.pid, float(spec["kill_grace"]))
    shim.report(pid=p.pid, pgid=p.pid, start=st[4] if st else 0, session=st[3] if st else 0)
    p.returncode = 0  # the shim reaps it itself (Shim.reap): Popen must not

    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    while True:
        for line in pending.split(b"\n")[:-1]:
            if line.strip() == b"TERM":
                shim.terminate()
        pending = pending[pending.rfind(b"\n") + 1:][-64:]
        for key, _ in sel.select(TICK if shim.ending() else None):
            if key.data == "wake":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            try:
                b = os.read(ctl, 4096)
            except OSError:
                b = b""
            if not b:
                sel.unregister(ctl)
                shim.gone()
                continue
            pending += b
        if not shim.step():
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
