"""Run a job's command as a process group of its own, under the command shim (docs/COMMANDS.md §2–§5).

run_command starts argv through the shim (nodelane/_shim.py, a supervising
process in a session of its own), in a new process group with stdin
/dev/null and the environment it is given (scrubbed_env builds one: §2). It
reads the command's stdout and stderr as they come: every line becomes a log
line of the job (sink.log, {"stream": "stdout"|"stderr"}), cut at
MAX_LINE_BYTES, at most LINE_RATE a second with bursts of LINE_BURST (the
rest dropped and counted, never blocking the command), except the stdout
lines `nodelane:progress {json}` and `nodelane:artifact {json}` (§3), which
are reported in order by a thread of their own: progress through
sink.progress (at most MAX_PENDING_PROGRESS waiting; beyond, the newest
waiting one is replaced), artifacts through sink.upload, one at a time, while
the command runs. Its exit maps as §4 says: 0 returns a RunResult, anything
else raises JobError with the Go runner's error codes.

The whole group stops, SIGTERM then SIGKILL kill_grace later (sent by the
shim, to the group and to every process that left it), when `stop` is set
(cancel, lease lost, drain: run_command then raises Cancelled) or the timeout
passes; when the command exits on its own, whatever it left is killed at
once; when the worker dies, by any signal, the shim sees its control pipe end
and does the same (§5.1). RunningFile is the state file a restarted worker
reads to kill what a worker killed together with its shim left (§5.2).

Linux only: process groups, /proc, a child subreaper.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from . import _shim
from .errors import Cancelled, ConfigError, JobError

#: A longer output line is cut at this many bytes and ends with TRUNCATED_MARK.
MAX_LINE_BYTES = (16 << 10) - 64
TRUNCATED_MARK = " ...(truncated)"
#: Output lines logged per second, and the burst beyond it (a token bucket shared by stdout and stderr).
LINE_RATE = 100
LINE_BURST = 1000
#: The most artifacts one run reports.
MAX_ARTIFACTS = 1000
#: The most progress reports waiting to be sent; beyond, the newest waiting one is replaced.
MAX_PENDING_PROGRESS = 64
#: The most bytes of a progress line's metrics, an artifact's metadata, and result.json.
MAX_PAYLOAD_BYTES = 16 << 10
MAX_RESULT_BYTES = 16 << 10
#: The most bytes of an artifact's name and kind.
MAX_NAME_BYTES = 255
#: The most bytes of the last stderr line a failure's message quotes.
MAX_LAST_STDERR = 512
#: How long the pipes are still read once the process group is gone (a process that left it may hold them).
READ_GRACE = 2.0
#: How long the shim may take to start the command, in seconds.
START_TIMEOUT = 30.0
#: How long past kill_grace and the shim's own SIGKILL wait the worker waits for the shim before it
#: kills the shim and the group itself.
SHIM_SLACK = 10.0
#: How often the runner looks at its stop event, in seconds.
STOP_POLL = 0.1
#: The PATH a command gets when the worker has none.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The most env_pass names.
MAX_PASS_THROUGH = 256
#: The most bytes of a state file reap reads.
MAX_STATE_BYTES = 1 << 20
PROGRESS_PREFIX = "nodelane:progress"
ARTIFACT_PREFIX = "nodelane:artifact"

_SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim.py")
_log = logging.getLogger("nodelane.process")


class Sink(Protocol):
    """What run_command reports into: a JobContext, or a test's recorder. Called from two threads."""

    def log(self, message: str, payload: Optional[dict]) -> None:
        """Keep a log line of the job; must never block."""

    def progress(self, fraction: Optional[float], message: str, metrics: Optional[dict]) -> None:
        """Report progress (a status event); may block on the network, and may raise (it is advisory)."""

    def upload(self, path: str, name: str, kind: str, metadata: Optional[dict]) -> dict:
        """Store a file of the output directory as an artifact; return once stored, raise on failure
        (Cancelled when the job must stop). path is the file's real path (links resolved), just found to be
        a regular file inside the output directory; name and kind are 1 to 255 bytes."""


@dataclass
class RunResult:
    """A command that exited 0: its output directory, and the metrics of its result.json (None without one)."""

    returncode: int
    output_dir: str
    metrics: Optional[Dict[str, Any]] = None


def make_undumpable() -> bool:
    """Mark this process non-dumpable (Linux prctl PR_SET_DUMPABLE 0), as cmd/worker marks itself.

    A command that runs as the same user can then neither ptrace it nor read
    its memory or environment through /proc, where its tokens are. Returns
    whether it was done (False off Linux, or when prctl fails).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(ctypes.c_int(4), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def reserved(name: str) -> bool:
    """The variables the worker sets itself, which no pass-through may name."""
    return name.startswith("NODELANE_") or name in (
        "PATH", "HOME", "LANG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def _check_var(name: Any, value: Any = "") -> None:
    if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
        raise ConfigError("%r is not an environment variable name" % (name,))
    if not isinstance(value, str) or "\x00" in value:
        raise ConfigError("the value of %s is not a string without NUL" % name)


def scrubbed_env(extra: Mapping[str, str], pass_through: Sequence[str] = ()) -> Dict[str, str]:
    """A command's environment (COMMANDS.md §2): only PATH (the worker's, or DEFAULT_PATH), HOME and LANG
    when the worker has them, the pass_through names it has, and extra (the NODELANE_* variables and
    CUDA_VISIBLE_DEVICES the caller sets), with CUDA_DEVICE_ORDER=PCI_BUS_ID and, unless extra sets
    it, CUDA_VISIBLE_DEVICES="" (no GPU).

    A pass_through name the worker sets itself (PATH, HOME, LANG, NODELANE_*, CUDA_VISIBLE_DEVICES,
    CUDA_DEVICE_ORDER) is a ConfigError, and so is NODELANE_PROVISIONING_TOKEN in extra: nothing of the
    worker's own environment passes unless named.
    """
    if isinstance(pass_through, str):
        raise ConfigError("pass_through is a list of names, not a string")
    if len(pass_through) > MAX_PASS_THROUGH:
        raise ConfigError("pass_through has %d names, at most %d" % (len(pass_through), MAX_PASS_THROUGH))
    for n in pass_through:
        _check_var(n)
        if reserved(n):
            raise ConfigError("pass_through name %s is set by the worker itself" % n)
    for k, v in extra.items():
        _check_var(k, v)
    if "NODELANE_PROVISIONING_TOKEN" in extra:
        raise ConfigError("the provisioning token never passes to a command")
    if extra.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
        raise ConfigError("CUDA_DEVICE_ORDER is PCI_BUS_ID, so that CUDA numbers the GPUs as nvidia-smi does")
    env = {"PATH": os.environ.get("PATH", DEFAULT_PATH)}
    for n in ["HOME", "LANG"] + list(pass_through):
        if n in os.environ:
            env[n] = os.environ[n]
    env.update(extra)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


# -- what the command prints ----------------------------------------------------

class _BadLine(ValueError):
    """A progress or artifact line that is not valid: logged as a plain line with a warning."""


@dataclass
class _Progress:
    fraction: Optional[float]
    message: str
    metrics: Optional[Dict[str, Any]]


@dataclass
class _Artifact:
    path: str
    name: str
    kind: str
    metadata: Optional[Dict[str, Any]]


def _has_prefix(line: str, prefix: str) -> bool:
    """line starts with prefix followed by a blank or the end ("nodelane:progressbar" is a log line)."""
    return line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)] in " \t")


def _not_json(s: str) -> Any:
    raise ValueError("%s is not JSON" % s)


def _finite(s: str) -> float:
    f = float(s)
    if math.isinf(f):
        raise ValueError("number %s is out of range" % s)
    return f


_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _strict(prefix: str, text: str, fields: Collection[str]) -> Dict[str, Any]:
    """The JSON object of a line: no unknown field, no text after it (null reads as {})."""
    s = text.strip(" \t\r\n")
    try:
        v, end = _DECODER.raw_decode(s)
    except ValueError as e:
        raise _BadLine("%s: bad JSON: %s" % (prefix, e)) from None
    if s[end:].strip(" \t\r\n"):
        raise _BadLine("%s: bad JSON: text after the object" % prefix)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _BadLine("%s: bad JSON: not an object" % prefix)
    for k in v:
        if k not in fields:
            raise _BadLine("%s: bad JSON: unknown field %s" % (prefix, json.dumps(k)))
    return v


def _object(prefix: str, name: str, v: Any) -> Optional[Dict[str, Any]]:
    """An optional JSON object field of at most MAX_PAYLOAD_BYTES."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _BadLine("%s: %s is not a JSON object" % (prefix, name))
    if len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise _BadLine("%s: %s is over %d bytes" % (prefix, name, MAX_PAYLOAD_BYTES))
    return v


def _string(prefix: str, d: Dict[str, Any], name: str) -> str:
    v = d.get(name)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise _BadLine("%s: bad JSON: %s is not a string" % (prefix, name))
    return v


def _is_local(path: str) -> bool:
    """Go's filepath.IsLocal on Unix: not empty, not absolute, no ".." that leads out."""
    if path == "" or path.startswith("/"):
        return False
    if any(p in (".", "..") for p in path.split("/")):
        path = os.path.normpath(path)
    return path != ".." and not path.startswith("../")


def parse_line(line: str) -> "Optional[_Progress | _Artifact]":
    """What a stdout line reports: a progress, an artifact, or None for a log line; _BadLine when a line
    with either prefix is not valid (COMMANDS.md §3)."""
    if _has_prefix(line, PROGRESS_PREFIX):
        d = _strict(PROGRESS_PREFIX, line[len(PROGRESS_PREFIX):], ("fraction", "message", "metrics"))
        f = d.get("fraction")
        if f is not None:
            if isinstance(f, bool) or not isinstance(f, (int, float)):
                raise _BadLine("%s: bad JSON: fraction is not a number" % PROGRESS_PREFIX)
            if not 0 <= f <= 1:
                raise _BadLine("%s: fraction %s is not between 0 and 1" % (PROGRESS_PREFIX, f))
            f = float(f)
        return _Progress(f, _string(PROGRESS_PREFIX, d, "message"),
                         _object(PROGRESS_PREFIX, "metrics", d.get("metrics")))
    if _has_prefix(line, ARTIFACT_PREFIX):
        d = _strict(ARTIFACT_PREFIX, line[len(ARTIFACT_PREFIX):], ("name", "path", "kind", "metadata"))
        path = _string(ARTIFACT_PREFIX, d, "path")
        if not path:
            raise _BadLine("%s: path is required" % ARTIFACT_PREFIX)
        if not _is_local(path) or "\x00" in path:
            raise _BadLine("%s: path %s is not a relative path inside NODELANE_OUTPUT_DIR"
                           % (ARTIFACT_PREFIX, json.dumps(path)))
        name = _string(ARTIFACT_PREFIX, d, "name") or os.path.basename(path.rstrip("/"))
        kind = _string(ARTIFACT_PREFIX, d, "kind") or "file"
        if len(name.encode("utf-8")) > MAX_NAME_BYTES or len(kind.encode("utf-8")) > MAX_NAME_BYTES:
            raise _BadLine("%s: name and kind are at most %d bytes" % (ARTIFACT_PREFIX, MAX_NAME_BYTES))
        return _Artifact(path, name, kind, _object(ARTIFACT_PREFIX, "metadata", d.get("metadata")))
    return None


class _Lines:
    """Splits a stream's bytes into lines cut at `limit` bytes, holding at most `limit` bytes."""

    def __init__(self, limit: int, emit: Callable[[str, bool], None]):
        self._limit = limit
        self._emit = emit
        self._buf = bytearray()
        self._truncated = False

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream; emit every line they end."""
        start = 0
        while True:
            i = data.find(b"\n", start)
            if i < 0:
                self._add(data[start:])
                return
            self._add(data[start:i + 1])
            self._end()
            start = i + 1

    def close(self) -> None:
        """The stream ended: emit what is left of a last line without a line end."""
        if self._buf:
            self._end()

    def _add(self, chunk: bytes) -> None:
        room = self._limit - len(self._buf)
        if len(chunk) > room:
            if room > 0:
                self._buf += chunk[:room]
            self._truncated = self._truncated or bool(chunk[max(room, 0):].rstrip(b"\r\n"))
        else:
            self._buf += chunk

    def _end(self) -> None:
        b = bytes(self._buf).rstrip(b"\r\n")
        truncated = self._truncated
        self._buf.clear()
        self._truncated = False
        if truncated:
            line = _decode_cut(b)
        else:
            line = b.decode("utf-8", "replace")
        self._emit(line, truncated)


def _decode_cut(b: bytes) -> str:
    """Bytes cut at a limit, decoded: a character the cut split is dropped."""
    i = len(b)
    while i > 0 and i > len(b) - 4 and (b[i - 1] & 0xC0) == 0x80:
        i -= 1
    if i > 0 and b[i - 1] >= 0xC0:
        need = 2 if b[i - 1] < 0xE0 else 3 if b[i - 1] < 0xF0 else 4
        if len(b) - (i - 1) < need:
            b = b[:i - 1]
    return b.decode("utf-8", "replace")


def _cut_text(s: str, limit: int) -> str:
    b = s.encode("utf-8")
    if len(b) <= limit:
        return s
    return b[:limit].decode("utf-8", "ignore") + "..."


class _Bucket:
    """A token bucket of log lines: rate a second, bursts of burst; counts the lines it refuses."""

    def __init__(self, rate: float, burst: int):
        self.rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._dropped = 0

    def take(self) -> "tuple[bool, int]":
        """Whether a line may be logged; if so, how many were dropped since the last one logged."""
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            self._dropped += 1
            return False, 0
        self._tokens -= 1
        d, self._dropped = self._dropped, 0
        return True, d

    def flush(self) -> int:
        """The lines dropped since the last one logged, forgotten."""
        d, self._dropped = self._dropped, 0
        return d


class _Queue:
    """The progress and artifact reports not sent yet, in order, bounded (see MAX_PENDING_PROGRESS,
    MAX_ARTIFACTS)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: "collections.deque[_Progress | _Artifact]" = collections.deque()
        self._progress = 0
        self._artifacts = 0
        self._closed = False

    def push(self, ev: "_Progress | _Artifact") -> bool:
        """Add a report; False when refused (over MAX_ARTIFACTS artifacts)."""
        with self._cond:
            if isinstance(ev, _Artifact):
                if self._artifacts >= MAX_ARTIFACTS:
                    return False
                self._artifacts += 1
                self._items.append(ev)
            elif self._progress >= MAX_PENDING_PROGRESS and isinstance(self._items[-1], _Progress):
                self._items[-1] = ev
            else:
                self._progress += 1
                self._items.append(ev)
            self._cond.notify()
        return True

    def close(self) -> None:
        """No more reports: next() returns None once the queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def next(self, stop: threading.Event) -> "Optional[_Progress | _Artifact]":
        """The oldest report, waiting for one; None once closed and empty, or once stop is set."""
        with self._cond:
            while True:
                if stop.is_set():
                    return None
                if self._items:
                    ev = self._items.popleft()
                    if isinstance(ev, _Progress):
                        self._progress -= 1
                    return ev
                if self._closed:
                    return None
                self._cond.wait(STOP_POLL)


# -- files of the output directory ---------------------------------------------

def _open_inside(root: str, rel: str, what: str) -> "tuple[int, str]":
    """Open the regular file rel of directory root, read-only, and return its fd and real path.

    A path that leads out of root, by ".." or a symbolic link, is refused, and so is
    anything but a regular file (a FIFO does not block the open). The path is resolved
    once, then opened component by component without following a link, so a link
    swapped in meanwhile is refused too. Raises ValueError, or OSError (no such file).
    """
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, rel))
    if full == real_root or os.path.commonpath([real_root, full]) != real_root:
        raise ValueError("%s %s leads out of NODELANE_OUTPUT_DIR" % (what, json.dumps(rel)))
    parts = os.path.relpath(full, real_root).split(os.sep)
    dfd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for p in parts[:-1]:
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("%s %s is not a regular file" % (what, json.dumps(rel)))
    return fd, full


def _read_result(output_dir: str) -> Optional[Dict[str, Any]]:
    """output_dir/result.json as a dict, None when there is none; JobError bad_result when it is not a JSON
    object of at most MAX_RESULT_BYTES (or not a regular file inside the directory)."""
    try:
        fd, _ = _open_inside(output_dir, "result.json", "result.json")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JobError("result.json: %s" % (e.strerror or e), code="bad_result", retryable=False) from None
    except ValueError as e:
        raise JobError(str(e), code="bad_result", retryable=False) from None
    with os.fdopen(fd, "rb") as f:
        b = f.read(MAX_RESULT_BYTES + 1)
    if len(b) > MAX_RESULT_BYTES:
        raise JobError("result.json is over %d bytes" % MAX_RESULT_BYTES, code="bad_result", retryable=False)
    try:
        v = _DECODER.decode(b.decode("utf-8"))
    except ValueError:
        v = None
    if not isinstance(v, dict):
        raise JobError("result.json is not a JSON object", code="bad_result", retryable=False)
    return v


# -- the process ------------------------------------------------------------------

def _kill(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except OSError:
        pass  # gone (ESRCH), or a member changed its credentials (EPERM): nothing more to do


class _Started:
    """A command started through the shim: the worker's ends of the shim's pipes, and who is who."""

    def __init__(self, proc: subprocess.Popen, ctl: int, status: int, out: int, err: int):
        self.proc = proc
        self.ctl = ctl
        self.status = status
        self.out = out
        self.err = err
        self.status_buf = b""
        st = _shim.read_stat(proc.pid)
        self.shim_pid = proc.pid
        self.shim_start = st[4] if st else 0
        self.pgid = 0
        self.leader_start = 0
        self.session = 0

    def close(self, wait: float) -> None:
        """Close the worker's ends of the pipes (each once) and reap the shim.

        A shim that still runs (the run ended by an error of the worker's) ends the command, as when the
        worker dies, on the end of its control pipe; after wait seconds the worker kills it and the group.
        """
        for name in ("ctl", "status", "out", "err"):
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            _kill(self.proc.pid, signal.SIGKILL)
            if self.pgid > 0:
                _kill(self.pgid, signal.SIGKILL, group=True)
            self.proc.wait()


def _start(path: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, kill_grace: float) -> _Started:
    """Start the shim, hand it the command, and wait for it to say the command started."""
    spec = (json.dumps({"path": path, "argv": list(argv), "env": dict(env), "cwd": cwd, "kill_grace": kill_grace})
            + "\n").encode("utf-8")
    if len(spec) > _shim.MAX_SPEC_BYTES:
        raise ConfigError("the command's argv and environment are over %d bytes" % _shim.MAX_SPEC_BYTES)
    ctl_r, ctl_w = os.pipe()
    st_r, st_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    theirs = (ctl_r, st_w, out_w, err_w)
    try:
        # A session of its own: a signal to the worker's group (Ctrl-C) does not take the shim with it.
        # -I -S: no PYTHON* variable, no site-packages: the shim needs the standard library only.
        proc = subprocess.Popen([sys.executable, "-I", "-S", _SHIM_PATH] + [str(fd) for fd in theirs],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=theirs,
                                start_new_session=True, env=_shim_env(), cwd="/")
    except OSError as e:
        for fd in (ctl_w, st_r, out_r, err_r):
            os.close(fd)
        raise JobError("starting the command shim (%s): %s" % (sys.executable, e), code="start_failed",
                       retryable=False) from None
    finally:
        for fd in theirs:
            os.close(fd)
    s = _Started(proc, ctl_w, st_r, out_r, err_r)
    try:
        view = memoryview(spec)
        while view:
            view = view[os.write(ctl_w, view):]
    except OSError:
        pass  # the shim is gone: its status says why, or its end does
    line = _status_line(s, time.monotonic() + START_TIMEOUT)
    msg = None
    if line is None:
        msg = "the command shim ended before it started the command"
    elif "error" in line:
        msg = str(line["error"])
    elif not isinstance(line.get("pgid"), int) or line["pgid"] <= 0:
        msg = "the command shim said %r" % (line,)
    if msg is not None:
        _kill(proc.pid, signal.SIGKILL)
        s.close(_shim.SIGKILL_WAIT)
        if line is None and proc.returncode:
            msg += " (exit status %d)" % proc.returncode
        raise JobError("starting %s: %s" % (argv[0], msg), code="start_failed", retryable=False)
    s.pgid = line["pgid"]
    s.leader_start = int(line.get("start") or 0)
    s.session = int(line.get("session") or 0)
    return s


def _shim_env() -> Dict[str, str]:
    """The shim's own environment: none of the worker's but what its Python may need to start (a
    libpython found through LD_LIBRARY_PATH). The command's goes through the control pipe."""
    return {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}


def _status_line(s: _Started, deadline: float) -> Optional[Dict[str, Any]]:
    """The next status line of the shim, read until deadline; None at its end (or past the deadline)."""
    while b"\n" not in s.status_buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        with selectors.DefaultSelector() as sel:
            sel.register(s.status, selectors.EVENT_READ)
            if not sel.select(left):
                continue
        b = os.read(s.status, 4096)
        if not b:
            return None
        s.status_buf += b
        if len(s.status_buf) > 1 << 16:
            return None
    line, s.status_buf = s.status_buf.split(b"\n", 1)
    try:
        v = json.loads(line)
    except ValueError:
        v = {"error": "the command shim said %r" % line[:200]}
    return v if isinstance(v, dict) else {"error": "the command shim said %r" % line[:200]}


def _program(argv0: str, env: Mapping[str, str], cwd: str) -> str:
    """The program argv0 names: a path (relative to cwd) when it holds a slash, else looked up on the
    command's PATH. JobError start_failed when there is none."""
    if "/" in argv0:
        return os.path.normpath(os.path.join(cwd, argv0))
    found = shutil.which(argv0, path=env.get("PATH", DEFAULT_PATH))
    if found is None:
        raise JobError("starting %s: no executable %s on the command's PATH" % (argv0, argv0),
                       code="start_failed", retryable=False)
    return os.path.abspath(found)


class _Run:
    """One run of a command: its reading loop (the caller's thread) and its report thread."""

    def __init__(self, sink: Sink, stop: threading.Event, output_dir: str):
        self.sink = sink
        self.stop = stop
        self.output_dir = output_dir
        self.bucket = _Bucket(LINE_RATE, LINE_BURST)
        self.queue = _Queue()
        self.mu = threading.Lock()
        self.last_stderr = ""
        self.not_reported: List[str] = []

    def dropped_message(self, n: int) -> str:
        return "%d output lines dropped: over the limit of %g lines per second" % (n, self.bucket.rate)

    def line(self, stream: str, line: str, truncated: bool) -> None:
        """One output line; never blocks."""
        payload: Dict[str, Any] = {"stream": stream}
        if stream == "stdout" and not truncated:
            try:
                ev = parse_line(line)
            except _BadLine as e:
                payload["warning"] = str(e)
            else:
                if ev is not None:
                    if self.queue.push(ev):
                        return
                    payload["warning"] = "over %d artifacts: not reported" % MAX_ARTIFACTS
        if truncated:
            line += TRUNCATED_MARK
            if _has_prefix(line, PROGRESS_PREFIX) or _has_prefix(line, ARTIFACT_PREFIX):
                payload["warning"] = "over %d bytes: not read" % MAX_LINE_BYTES
        if stream == "stderr" and line:
            with self.mu:
                self.last_stderr = _cut_text(line, MAX_LAST_STDERR)
        ok, dropped = self.bucket.take()
        if not ok:
            return
        if dropped:
            self.sink.log(self.dropped_message(dropped), None)
        self.sink.log(line, payload)

    def reports(self) -> None:
        """The report thread: send the progress and artifact reports in order until the queue is closed
        and empty, or the run must stop."""
        while True:
            ev = self.queue.next(self.stop)
            if ev is None:
                return
            if isinstance(ev, _Progress):
                self.progress(ev)
            else:
                self.artifact(ev)

    def progress(self, p: _Progress) -> None:
        msg = p.message
        if not msg and p.fraction is not None:
            msg = "%.0f%%" % (p.fraction * 100)
        try:
            self.sink.progress(p.fraction, msg, p.metrics)
        except Exception as e:  # advisory: the heartbeat keeps the lease
            _log.debug("progress not reported: %s", e)

    def artifact(self, a: _Artifact) -> None:
        try:
            fd, path = _open_inside(self.output_dir, a.path, "path")
            os.close(fd)
        except (OSError, ValueError) as e:
            msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            if isinstance(e, OSError):
                msg = "path %s: %s" % (json.dumps(a.path), msg)
            self.sink.log("artifact %s not reported: %s" % (a.name, msg), {"warning": "bad artifact"})
            return
        try:
            self.sink.upload(path, a.name, a.kind, a.metadata)
        except Cancelled:
            return
        except Exception as e:
            if self.stop.is_set():
                return
            code = getattr(e, "code", "")
            self.sink.log("artifact %s not reported: %s" % (a.name, code if isinstance(code, str) and code else e),
                          {"warning": "artifact not reported"})
            with self.mu:
                self.not_reported.append(a.name)


def run_command(argv: Sequence[str], *, sink: Sink, stop: threading.Event,
                stop_reason: Callable[[], Optional[str]], env: Dict[str, str], cwd: Optional[str],
                output_dir: str, timeout: Optional[float] = None, kill_grace: float = 10.0,
                retry_on_exit: Collection[int] = (), registry: Optional["RunningFile"] = None,
                record: Optional[Dict[str, Any]] = None) -> RunResult:
    """Run argv to its end under the command shim, reporting into sink, and return when its process
    group is gone and every artifact it printed was uploaded (module doc; COMMANDS.md §2–§5).

    env is the command's whole environment (see scrubbed_env); cwd its working directory (None:
    output_dir, which must exist); argv[0] without a slash is looked up on env's PATH, with one it is
    taken from cwd. timeout (seconds, None for none) stops the command as stop does; kill_grace is the
    time from SIGTERM to SIGKILL. With registry, the run is listed in it (with record, such as
    {"job_id": ..., "attempt": ...}) while it runs.

    Returns RunResult on exit 0. Raises Cancelled(stop_reason()) once stop was set; JobError with
    code "exit_N" (retryable when N is in retry_on_exit), "signal_SIGSEGV" and the like (a signal the
    runner did not send; retryable), "timeout", "start_failed", "bad_result" (result.json not a JSON
    object of at most 16 KiB) or "artifact_not_reported" (retryable); ConfigError for bad arguments
    or on another OS than Linux.
    """
    if not sys.platform.startswith("linux"):
        raise ConfigError("ctx.run needs Linux (process groups, /proc, a child subreaper), not %s" % sys.platform)
    if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
        raise ConfigError("argv is a non-empty list of strings, not %r" % (argv,))
    for a in argv:
        if not isinstance(a, str) or "\x00" in a:
            raise ConfigError("argv holds %r, not a string without NUL" % (a,))
    if not argv[0]:
        raise ConfigError("argv[0] is empty")
    if not isinstance(env, Mapping):
        raise ConfigError("env is a dict of strings")
    for k, v in env.items():
        _check_var(k, v)
    for name, v in (("timeout", timeout), ("kill_grace", kill_grace)):
        if v is None and name == "timeout":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ConfigError("%s is a positive number of seconds, not %r" % (name, v))
    retry = set()
    for c in retry_on_exit:
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 255:
            raise ConfigError("retry_on_exit holds %r, not an exit code from 1 to 255" % (c,))
        retry.add(c)
    if not isinstance(output_dir, str) or not os.path.isdir(output_dir):
        raise ConfigError("output_dir %r is not a directory" % (output_dir,))
    output_dir = os.path.abspath(output_dir)
    cwd = output_dir if cwd is None else cwd
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        raise ConfigError("cwd %r is not a directory" % (cwd,))
    cwd = os.path.abspath(cwd)
    if not sys.executable or getattr(sys, "frozen", False):
        raise ConfigError("ctx.run needs sys.executable to be a Python interpreter, which runs the command shim")
    if record is not None:
        try:
            json.dumps(dict(record))
        except (TypeError, ValueError) as e:
            raise ConfigError("record is a JSON object: %s" % e) from None
    if stop.is_set():
        raise Cancelled(stop_reason() or "canceled")

    r = _Run(sink, stop, output_dir)
    s = _start(_program(argv[0], env, cwd), argv, env, cwd, float(kill_grace))
    handle = None
    reporter = threading.Thread(target=r.reports, name="nodelane-run-reports", daemon=True)
    try:
        if registry is not None:
            handle = registry.add(dict(record or {}, pgid=s.pgid, leader_start=s.leader_start,
                                       session=s.session, shim_pid=s.shim_pid, shim_start=s.shim_start))
        reporter.start()
        why, status = _watch(r, s, stop, timeout, float(kill_grace))
    finally:
        s.close(float(kill_grace) + _shim.SIGKILL_WAIT + 1)
        if handle is not None:
            registry.remove(handle)
        d = r.bucket.flush()
        if d:
            sink.log(r.dropped_message(d), None)
        r.queue.close()
        if reporter.is_alive():
            reporter.join()

    if stop.is_set():
        raise Cancelled(stop_reason() or "canceled")
    if why == "timeout":
        raise JobError("the command ran over its timeout of %gs" % timeout, code="timeout", retryable=False)
    with r.mu:
        last, not_reported = r.last_stderr, list(r.not_reported)
    last = "; last stderr line: " + last if last else ""
    if status is None:
        raise JobError("the command shim ended before the command (was it killed?); the command's process "
                       "group was sent SIGKILL%s" % last, code="signal_SHIM_LOST", retryable=True)
    if "signal" in status:
        name = str(status["signal"])
        raise JobError("the command was killed by %s%s" % (name, last), code="signal_" + name, retryable=True)
    code = status.get("exit")
    if code != 0:
        raise JobError("the command exited with status %s%s" % (code, last), code="exit_%s" % code,
                       retryable=code in retry)
    if not_reported:
        raise JobError("%d artifacts could not be reported: %s" % (len(not_reported), ", ".join(not_reported[:10])),
                       code="artifact_not_reported", retryable=True)
    return RunResult(returncode=0, output_dir=output_dir, metrics=_read_result(output_dir))


def _watch(r: _Run, s: _Started, stop: threading.Event, timeout: Optional[float],
           grace: float) -> "tuple[str, Optional[Dict[str, Any]]]":
    """Read the command's output and the shim's status until the group is gone and the pipes ended (or
    READ_GRACE after the group is gone); stop the group on stop or timeout. Returns why it was stopped
    ("", "stop", "timeout") and the leader's status ({"exit": N} or {"signal": NAME}; None when the shim
    ended without saying)."""
    streams = {s.out: _Lines(MAX_LINE_BYTES, lambda l, t: r.line("stdout", l, t)),
               s.err: _Lines(MAX_LINE_BYTES, lambda l, t: r.line("stderr", l, t))}
    deadline = None if timeout is None else time.monotonic() + timeout
    why = ""
    termed_at: Optional[float] = None
    shim_gone_at: Optional[float] = None
    status = _take_status(s)  # the shim's first read may have brought the leader's end already
    exited_at = time.monotonic() if status is not None else None
    sel = selectors.DefaultSelector()
    try:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(s.status, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if termed_at is None and shim_gone_at is None:
                if stop.is_set():
                    why = "stop"
                elif deadline is not None and now >= deadline:
                    why = "timeout"
                if why:
                    termed_at = now
                    try:
                        os.write(s.ctl, b"TERM\n")  # the shim sends SIGTERM, and SIGKILL after the grace
                    except OSError:
                        pass  # the shim is gone: its end is read below
            if shim_gone_at is None:
                # The shim bounds its own waits; one that outlives them is stuck: the worker ends it all.
                since = termed_at + grace if termed_at is not None else exited_at
                if since is not None and now > since + _shim.SIGKILL_WAIT + SHIM_SLACK:
                    _log.warning("the command shim %d did not end: SIGKILL to it and to process group %d",
                                 s.shim_pid, s.pgid)
                    _kill(s.shim_pid, signal.SIGKILL)
                    _kill(s.pgid, signal.SIGKILL, group=True)
            elif not streams or now >= shim_gone_at + READ_GRACE:
                break
            wait = STOP_POLL
            if deadline is not None and termed_at is None:
                wait = max(0.0, min(wait, deadline - now))
            for key, _ in sel.select(wait):
                fd = key.fd
                try:
                    b = os.read(fd, 65536)
                except OSError:
                    b = b""
                if fd == s.status:
                    if b:
                        s.status_buf += b
                        if status is None:
                            status = _take_status(s)
                            exited_at = time.monotonic() if status is not None else None
                    else:
                        # The shim ended, and with it the group (it ends only once the group is gone).
                        sel.unregister(fd)
                        shim_gone_at = time.monotonic()
                        if status is None:
                            # Killed: whatever of the group is left, the worker ends itself.
                            _kill(s.pgid, signal.SIGKILL, group=True)
                elif b:
                    streams[fd].feed(b)
                else:
                    sel.unregister(fd)
                    streams.pop(fd).close()
        for lines in streams.values():  # pipes an escaped process holds: what was read of a last line
            lines.close()
    finally:
        sel.close()
    return why, status


def _take_status(s: _Started) -> Optional[Dict[str, Any]]:
    """The leader's end, {"exit": N} or {"signal": NAME}, if a whole status line of the shim's read says it;
    the lines read are taken off the buffer, which stays bounded."""
    while b"\n" in s.status_buf:
        line, s.status_buf = s.status_buf.split(b"\n", 1)
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict) and isinstance(v.get("exit"), int) and not isinstance(v["exit"], bool):
            return {"exit": v["exit"]}
        if isinstance(v, dict) and isinstance(v.get("signal"), str):
            return {"signal": v["signal"]}
    s.status_buf = s.status_buf[-(1 << 16):]
    return None


# -- restart reconciliation -----------------------------------------------------------

class RunningFile:
    """The state file of the commands running (COMMANDS.md §5.2): {"runs": [...]}, 0600, replaced atomically
    on every change, in the Go worker's format (job_id, attempt, pgid, leader_start, session, shim_pid,
    shim_start).

    run_command adds a run once its command started and removes it once its group is gone; a worker
    starting again calls reap() on the file before it registers, to kill what a previous run of it left.
    A file that cannot be written is logged: the run goes on (its shim still ends it if the worker dies).
    """

    def __init__(self, path: str):
        if not isinstance(path, str) or not path:
            raise ConfigError("the running file is a path")
        self.path = os.path.abspath(path)
        self._mu = threading.Lock()
        self._runs: Dict[int, Dict[str, Any]] = {}
        self._next = 0

    def add(self, entry: Mapping[str, Any]) -> int:
        """List a run; returns the handle remove() takes."""
        e = dict(entry)
        try:
            json.dumps(e)
        except (TypeError, ValueError) as err:
            raise ConfigError("a running file entry is JSON: %s" % err) from None
        with self._mu:
            self._next += 1
            self._runs[self._next] = e
            self._write()
            return self._next

    def remove(self, handle: int) -> None:
        """Take a run off the file."""
        with self._mu:
            if self._runs.pop(handle, None) is not None:
                self._write()

    def entries(self) -> List[Dict[str, Any]]:
        """The runs listed now."""
        with self._mu:
            return [dict(e) for e in self._runs.values()]

    def _write(self) -> None:
        runs = sorted(self._runs.values(), key=lambda e: e.get("pgid") or 0)
        d = os.path.dirname(self.path)
        tmp = None
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".", dir=d)  # 0600
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps({"runs": runs}) + "\n")
            os.replace(tmp, self.path)
        except OSError as e:
            _log.warning("the state file of the running commands could not be written: a restart after a crash "
                         "may not find them: %s: %s", self.path, e)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    @staticmethod
    def reap(path: str, log: logging.Logger, wait: float = 10.0) -> List[Dict[str, Any]]:
        """Kill what a previous run of the worker left behind, before this one registers or leases.

        For each run the file lists: SIGKILL to its shim and to every process of its group that still
        runs and is the same process (its start time is the recorded one's: a reused pid is never taken
        for it); each logged at WARNING. Waits until they are gone (zombies count as gone), at most wait
        seconds, else raises ConfigError naming the pids and the file (the file kept). Then removes the
        file and returns the runs it killed processes of, each with "pids". No file: [].
        """
        try:
            with open(path, "rb") as f:
                b = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ConfigError("the running file %s cannot be read: %s" % (path, e)) from None
        if len(b) > MAX_STATE_BYTES:
            raise ConfigError("the running file %s is over %d bytes" % (path, MAX_STATE_BYTES))
        runs = _parse_state(path, b)
        if runs and not sys.platform.startswith("linux"):
            raise ConfigError("the running file %s lists commands, and only Linux runs them" % path)
        killed: List[Dict[str, Any]] = []
        victims: List[Tuple[int, int]] = []
        for run in runs:
            pids = []
            for pid, start in _leftovers(run):
                if _kill_same(pid, start):
                    victims.append((pid, start))
                    pids.append(pid)
            if pids:
                killed.append(dict(run, pids=pids))
                log.warning("killed the processes a previous run of the worker left behind: job %s, attempt %s, "
                            "pgid %s, pids %s, shim_pid %s", run.get("job_id"), run.get("attempt"), run.get("pgid"),
                            " ".join(str(p) for p in pids), run.get("shim_pid") or None)
        deadline = time.monotonic() + wait
        while True:
            victims = [v for v in victims if not _gone(*v)]
            if not victims:
                break
            if time.monotonic() > deadline:
                raise ConfigError("processes of a previous run of the worker survive SIGKILL after %gs: pids %s (%s)"
                                  % (wait, " ".join(str(v[0]) for v in victims), path))
            time.sleep(0.02)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return killed


def _parse_state(path: str, b: bytes) -> List[Dict[str, Any]]:
    try:
        v = json.loads(b.decode("utf-8"))
    except ValueError as e:
        raise ConfigError("the running file %s is not JSON: %s" % (path, e)) from None
    runs = v.get("runs") if isinstance(v, dict) else None
    if runs is None and isinstance(v, dict):
        runs = []
    if not isinstance(runs, list):
        raise ConfigError("the running file %s holds no list of runs" % path)
    for run in runs:
        ok = isinstance(run, dict) and all(
            isinstance(run.get(k, 0), int) and not isinstance(run.get(k, 0), bool) and run.get(k, 0) >= 0
            for k in ("pgid", "leader_start", "session", "shim_pid", "shim_start"))
        if not ok:
            raise ConfigError("the running file %s holds a run that is not one: %r" % (path, run))
    return runs


def _leftovers(run: Dict[str, Any]) -> List[Tuple[int, int]]:
    """(pid, start) of the run's shim and of every process of its group that still runs."""
    out = []
    shim_pid = run.get("shim_pid", 0)
    if shim_pid > 0:
        st = _shim.read_stat(shim_pid)
        if st is not None and st[4] == run.get("shim_start", 0) and _shim._running(st):
            out.append((shim_pid, st[4]))
    pgid, leader_start, session = run.get("pgid", 0), run.get("leader_start", 0), run.get("session", 0)
    if pgid <= 1:
        return out
    st = _shim.read_stat(pgid)
    if st is not None and st[4] != leader_start:
        # The leader's pid is another process's: the group is gone (a pid is not reused while it names
        # a process group).
        return out
    for pid, st in _shim._procs():
        if st[2] == pgid and st[3] == session and st[4] >= leader_start and _shim._running(st) and pid != shim_pid:
            out.append((pid, st[4]))
    return out


def _kill_same(pid: int, start: int) -> bool:
    """SIGKILL to pid if it is still the process that started at start; False if gone or not signalled."""
    st = _shim.read_stat(pid)
    if st is None or st[4] != start:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


def _gone(pid: int, start: int) -> bool:
    """Whether the process runs no more: no process of that pid and start time, or a zombie."""
    st = _shim.read_stat(pid)
    return st is None or st[4] != start or not _shim._running(st)
