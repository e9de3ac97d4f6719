"""Capture of a handler's print() output and logging records into its job's logs.

While a worker runs (or run_local), sys.stdout and sys.stderr are replaced by
tees that write everything to the streams they replace and, for a write made
inside a handler (its thread, or its asyncio task), also buffer the text and
give each whole line to the job. A handler on the root logger gives each
record made inside a handler, at or above the capture level, to the job.
Which job a write or a record belongs to is a context variable, set around
the handler's call: threads a handler starts itself do not carry it (Python
threads start with an empty context), asyncio tasks and asyncio.to_thread
do.

Installing is counted: several workers in one process share one tee and one
handler, and the last to leave restores what was there. When the root
logger's level is above the capture level (WARNING, Python's default), it is
lowered while installed, and every handler the root logger had gets a filter
that drops the records below the old level, so that what those handlers
print does not change; a record nobody else handles still goes to
logging.lastResort as it did.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Protocol, TextIO

#: The SDK's own loggers, whose records are never captured (a worker's
#: account of a job is not the job's output).
_OWN_LOGGER = "nodelane"


class Target(Protocol):
    """What captured lines are given to: a job's context."""

    def _capture_line(self, message: str, payload: Dict[str, Any]) -> None:
        """Take one captured line; never blocks."""


_current: "contextvars.ContextVar[Optional[Target]]" = contextvars.ContextVar("nodelane_job", default=None)

# Set while a record captured already is written to logging.lastResort (the
# stderr tee): the tee then does not capture its text a second time.
_passing_on = threading.local()


def current() -> Optional[Target]:
    """The job whose handler runs in this context, or None."""
    return _current.get()


@contextlib.contextmanager
def job(target: Target) -> Iterator[None]:
    """Make target the job of the current context until the block ends."""
    tok = _current.set(target)
    try:
        yield
    finally:
        _current.reset(tok)
        flush(target)


def flush(target: Target) -> None:
    """Give target the partial lines its handler wrote without a newline."""
    for tee in (_state.stdout, _state.stderr):
        if tee is not None:
            tee.flush_target(target)


class _Tee:
    """A text stream that writes to the stream it replaces and captures lines written inside a job."""

    #: A line longer than this many characters is given in pieces.
    MAX_LINE = 16 << 10

    def __init__(self, orig: TextIO, name: str):
        self._orig = orig
        self._name = name
        self._mu = threading.Lock()
        self._partial: Dict[int, "tuple[Target, str]"] = {}

    def write(self, s: str) -> int:
        n = self._orig.write(s)
        t = _current.get()
        if t is not None and s and not getattr(_passing_on, "on", False):
            lines: List[str] = []
            with self._mu:
                _, buf = self._partial.pop(id(t), (t, ""))
                buf += s
                while True:
                    i = buf.find("\n")
                    if i < 0 and len(buf) < self.MAX_LINE:
                        break
                    if i < 0 or i > self.MAX_LINE:
                        i = self.MAX_LINE
                        lines.append(buf[:i])
                        buf = buf[i:]
                    else:
                        lines.append(buf[:i])
                        buf = buf[i + 1:]
                if buf:
                    self._partial[id(t)] = (t, buf)
            for line in lines:
                t._capture_line(line.rstrip("\r"), {"stream": self._name})
        return n

    def flush_target(self, t: Target) -> None:
        with self._mu:
            _, buf = self._partial.pop(id(t), (t, ""))
        if buf:
            t._capture_line(buf, {"stream": self._name})

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._orig.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._orig, name)


class _Handler(logging.Handler):
    """Gives the records made inside a job to the job, and passes on those nobody else handles."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.capture_level = logging.INFO
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        t = _current.get()
        own = record.name == _OWN_LOGGER or record.name.startswith(_OWN_LOGGER + ".")
        if t is not None and not own and record.levelno >= self.capture_level and not getattr(self._local, "busy", False):
            self._local.busy = True
            try:
                msg = record.getMessage()
                if record.exc_info and record.exc_info[0] is not None:
                    msg += "\n" + logging.Formatter().formatException(record.exc_info)
                t._capture_line(msg, {"level": record.levelname, "logger": record.name})
            except Exception:
                self.handleError(record)
            finally:
                self._local.busy = False
        last = logging.lastResort
        if last is not None and record.levelno >= last.level and not self._handled_elsewhere(record):
            _passing_on.on = True
            try:
                last.handle(record)
            finally:
                _passing_on.on = False

    def _handled_elsewhere(self, record: logging.LogRecord) -> bool:
        """Whether a handler other than this one sees record (else Python would use lastResort)."""
        c: Optional[logging.Logger] = logging.getLogger(record.name)
        while c is not None:
            if any(h is not self for h in c.handlers):
                return True
            if not c.propagate:
                return False
            c = c.parent  # type: ignore[assignment]
        return False


class _BelowOldLevel(logging.Filter):
    """Drops the records below the root logger's level before capture lowered it."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class _State:
    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.users = 0
        self.stdout: Optional[_Tee] = None
        self.stderr: Optional[_Tee] = None
        self.handler: Optional[_Handler] = None
        self.old_level: Optional[int] = None
        self.filtered: List["tuple[logging.Handler, logging.Filter]"] = []
        self.levels: List[int] = []


_state = _State()


def install(level: int = logging.INFO) -> None:
    """Start capturing (or count one more user), with records at level or above captured."""
    with _state.mu:
        _state.users += 1
        _state.levels.append(level)
        lowest = min(_state.levels)
        if _state.users == 1:
            _state.stdout, _state.stderr = _Tee(sys.stdout, "stdout"), _Tee(sys.stderr, "stderr")
            sys.stdout, sys.stderr = _state.stdout, _state.stderr  # type: ignore[assignment]
            _state.handler = _Handler()
            logging.getLogger().addHandler(_state.handler)
        assert _state.handler is not None
        _state.handler.capture_level = lowest
        _lower_root(lowest)


def uninstall(level: int = logging.INFO) -> None:
    """Undo one install(level); the last restores the streams, the root logger and its handlers."""
    with _state.mu:
        if _state.users == 0:
            return
        _state.users -= 1
        if level in _state.levels:
            _state.levels.remove(level)
        if _state.users > 0:
            assert _state.handler is not None
            _state.handler.capture_level = min(_state.levels)
            return
        root = logging.getLogger()
        if _state.handler is not None:
            root.removeHandler(_state.handler)
        for h, f in _state.filtered:
            h.removeFilter(f)
        if _state.old_level is not None:
            root.setLevel(_state.old_level)
        if sys.stdout is _state.stdout and _state.stdout is not None:
            sys.stdout = _state.stdout._orig
        if sys.stderr is _state.stderr and _state.stderr is not None:
            sys.stderr = _state.stderr._orig
        _state.stdout = _state.stderr = _state.handler = None
        _state.old_level, _state.filtered = None, []


def _lower_root(level: int) -> None:
    """Lower the root logger to level, keeping its own handlers at what they saw. Call with _state.mu."""
    root = logging.getLogger()
    if root.level <= level:
        return
    if _state.old_level is None:
        _state.old_level = root.level
        for h in root.handlers:
            if h is not _state.handler:
                f = _BelowOldLevel(root.level)
                h.addFilter(f)
                _state.filtered.append((h, f))
    root.setLevel(level)


@contextlib.contextmanager
def installed(level: int = logging.INFO) -> Iterator[None]:
    """install(level) for the length of the block."""
    install(level)
    try:
        yield
    finally:
        uninstall(level)
