"""GPUs: find a node's NVIDIA GPUs with nvidia-smi, name their SKU, and hand them out to jobs.

discover() runs

    nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits

as the Go worker does (cmd/internal/gpu: Discover), with the same bounds and
the same rules: within a time limit (DEFAULT_TIMEOUT), at most
MAX_OUTPUT_BYTES of output, at most MAX_DEVICES GPUs, one line each with
exactly the four fields; a value nvidia-smi cannot give ("[N/A]", "[Not
Supported]", any other "[...]", "N/A") counts as absent, but every GPU must
have an index and a UUID, each listed once. Anything else it writes is refused
(GPUError, naming the line): a GPU is never invented. sku() turns a name into
the SKU the control plane matches jobs against (gpu.SKU). GPUPool hands out the
device ids a worker writes into CUDA_VISIBLE_DEVICES, never one another job holds.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set

from .errors import Cancelled, ConfigError, NodelaneError

#: How long one run of nvidia-smi may take, in seconds: it can hang on a wedged driver.
DEFAULT_TIMEOUT = 10.0
#: The most bytes nvidia-smi may write on its standard output: far above what MAX_DEVICES lines take.
MAX_OUTPUT_BYTES = 256 << 10
#: The most GPUs one answer may list: the GPUs a registration may carry (wire.MaxGPUs).
MAX_DEVICES = 64
#: The most bytes of a GPU's UUID ("GPU-" and 36 characters in practice).
MAX_UUID_BYTES = 64
#: The SKU of a GPU whose name says nothing a SKU holds.
UNKNOWN_SKU = "unknown"
#: The most bytes of a SKU made from a name.
MAX_SKU_BYTES = 64

#: The fields discover() asks for, in order.
DISCOVER_QUERY = "index,uuid,name,memory.total"

_MAX_INT32 = 2 ** 31 - 1
_MAX_STDERR = 512
# Go's unicode.IsSpace, which strings.TrimSpace trims.
_SPACE = " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
         "\u2028\u2029\u202f\u205f\u3000"
_INDEX = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+")
_SPECIAL = {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan"}
_UUID_OK = re.compile(r"[A-Za-z0-9._/-]*")


class GPUError(NodelaneError):
    """nvidia-smi failed, hung, wrote too much, or answered something other than what was asked.

    line is the answer's line the error is about (from 1; 0 when it is about the
    whole answer or not about the answer), text that line cut to 100 bytes.
    """

    def __init__(self, message: str, line: int = 0, text: str = ""):
        super().__init__(message)
        self.line = line
        self.text = text


class NoNvidiaSMI(GPUError, ConfigError):
    """There is no nvidia-smi to run: none on PATH, or none at the path given.

    A GPUError (discovery failed) and a ConfigError (the node's setup): a worker
    without nvidia-smi names its GPUs itself, or has none.
    """


@dataclass(frozen=True)
class Device:
    """One GPU as nvidia-smi lists it."""

    #: nvidia-smi's index of the GPU (PCI bus order).
    index: int
    #: The GPU's UUID ("GPU-..."); CUDA_VISIBLE_DEVICES accepts it, whatever CUDA_DEVICE_ORDER says.
    uuid: str
    #: The product name ("NVIDIA GeForce RTX 4090"), "" when nvidia-smi cannot tell.
    name: str
    #: The total memory in MiB, 0 when nvidia-smi cannot tell.
    memory_mb: int

    def gpu(self) -> Dict[str, object]:
        """The device as a registration's capabilities.gpus carries it: {"sku", "vram_mb"}."""
        return {"sku": sku(self.name), "vram_mb": self.memory_mb}


_DROP_WORDS = {"nvidia", "geforce", "tesla", "quadro", "gpu", "generation", "pcie", "sxm"}
_MEMORY_WORD = re.compile(r"[0-9]+gb|hbm[0-9a-z]*|gddr[0-9a-z]*|sxm[0-9]+")
_NOT_WORD = re.compile(r"[^a-z0-9]+")


def sku(name: str) -> str:
    """The short SKU of a GPU name as nvidia-smi reports it ("NVIDIA GeForce RTX 4090" -> "rtx-4090").

    Exactly the Go worker's gpu.SKU: the name lower-cased and split at every
    character that is not a letter or a digit; the vendor and brand words
    (NVIDIA, GeForce, Tesla, Quadro), "GPU", "Generation", the board's
    interface (PCIe, SXM, SXM4, ...) and its memory (80GB, HBM3, GDDR6X, ...)
    left out; the rest joined with "-". At most MAX_SKU_BYTES (cut at a
    word); UNKNOWN_SKU when nothing is left.
    """
    if not isinstance(name, str):
        raise ConfigError("a GPU name is a string, not %r" % (name,))
    out = ""
    for w in _NOT_WORD.split(name.lower()):
        if not w or w in _DROP_WORDS or _MEMORY_WORD.fullmatch(w):
            continue
        n = len(w) + (1 if out else 0)
        if not out and n > MAX_SKU_BYTES:
            w, n = w[:MAX_SKU_BYTES], MAX_SKU_BYTES
        if len(out) + n > MAX_SKU_BYTES:
            break
        out = out + "-" + w if out else w
    return out or UNKNOWN_SKU


def discover(nvidia_smi: str = "nvidia-smi", timeout: float = DEFAULT_TIMEOUT) -> List[Device]:
    """The GPUs nvidia-smi lists, in its order; [] when it ran and listed none.

    nvidia_smi is a program looked up on PATH (no slash) or a path. Raises
    NoNvidiaSMI when there is none, and GPUError when it fails, does not answer
    within timeout seconds, writes over MAX_OUTPUT_BYTES, or answers anything
    but what was asked (the error names the line).
    """
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ConfigError("timeout is a positive number of seconds, not %r" % (timeout,))
    out = _run(_look_path(nvidia_smi), DISCOVER_QUERY, float(timeout))
    devices: List[Device] = []
    seen_index: Set[int] = set()
    seen_uuid: Set[str] = set()
    for n, text, fields in _lines(out, 4):
        index, uuid = _id(n, text, fields, seen_index, seen_uuid)
        devices.append(Device(index=index, uuid=uuid, name=_field(fields[2]),
                              memory_mb=_number(n, text, fields[3], "memory.total")))
    return devices


def _look_path(nvidia_smi: str) -> str:
    """The nvidia-smi to run, as Go's exec.LookPath finds it; NoNvidiaSMI when there is none."""
    if not isinstance(nvidia_smi, str):
        raise ConfigError("nvidia_smi is a program name or a path, not %r" % (nvidia_smi,))
    name = nvidia_smi or "nvidia-smi"
    if "/" not in name:
        found = shutil.which(name)
        if found is None:
            raise NoNvidiaSMI("no nvidia-smi: %s is not on PATH" % name)
        return found
    if not os.path.exists(name):
        raise NoNvidiaSMI("no nvidia-smi: %s does not exist" % name)
    return name


def _run(bin_path: str, query: str, timeout: float) -> bytes:
    """nvidia-smi's standard output for query; its own process group is killed on a timeout or a flood."""
    try:
        proc = subprocess.Popen([bin_path, "--query-gpu=" + query, "--format=csv,noheader,nounits"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as e:
        raise GPUError("%s: %s" % (bin_path, e)) from e
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    why = ""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map() and not why:
            left = deadline - time.monotonic()
            if left <= 0:
                why = "timeout"
                break
            for key, _ in sel.select(left):
                b = os.read(key.fd, 65536)
                if not b:
                    sel.unregister(key.fileobj)
                elif key.data is out:
                    out += b
                    if len(out) > MAX_OUTPUT_BYTES:
                        why = "flood"
                elif len(err) < _MAX_STDERR:
                    err += b[:_MAX_STDERR - len(err)]
        if not why:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = "timeout"
    if why:
        # The whole group: a shell's child (a sleep) would hold the pipes.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    if why == "flood":
        raise GPUError("%s: nvidia-smi output too large: over %d bytes" % (bin_path, MAX_OUTPUT_BYTES))
    if why == "timeout":
        raise GPUError("%s did not answer within %gs" % (bin_path, timeout))
    if proc.returncode != 0:
        if proc.returncode < 0:
            what = "killed by %s" % _signal_name(-proc.returncode)
        else:
            what = "exit status %d" % proc.returncode
        msg = _first_line(bytes(err)) or _first_line(bytes(out))  # nvidia-smi says "No devices were found" on stdout
        raise GPUError("%s: %s%s" % (bin_path, what, ": " + msg if msg else ""))
    return bytes(out)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return "signal %d" % n


def _first_line(b: bytes) -> str:
    """The first non-blank line of b, printable, cut to 200 bytes."""
    for line in b.decode("utf-8", "replace").split("\n"):
        line = line.strip(_SPACE)
        if line:
            line = "".join(c for c in line if c >= " " and c != "\x7f")
            return _cut_bytes(line, 200)
    return ""


def _cut_bytes(s: str, n: int) -> str:
    return s.encode("utf-8")[:n].decode("utf-8", "ignore")


def _lines(out: bytes, nfields: int) -> List["tuple[int, str, List[str]]"]:
    """The answer's non-blank lines, as (number from 1, text cut to 100 bytes, fields trimmed)."""
    lines = []
    for n, raw in enumerate(out.decode("utf-8", "replace").split("\n"), start=1):
        text = raw.strip(_SPACE)
        if not text:
            continue
        if len(lines) == MAX_DEVICES:
            raise GPUError("nvidia-smi answer: more than %d GPUs listed" % MAX_DEVICES)
        short = _cut_bytes(text, 100)
        fields = text.split(",")
        if len(fields) != nfields:
            raise _parse_error(n, short, "%d fields, want %d (%s)" % (len(fields), nfields, DISCOVER_QUERY))
        lines.append((n, short, [f.strip(_SPACE) for f in fields]))
    return lines


def _parse_error(n: int, text: str, msg: str) -> GPUError:
    return GPUError("nvidia-smi answer, line %d (%s): %s" % (n, json.dumps(text, ensure_ascii=False), msg),
                    line=n, text=text)


def _field(v: str) -> str:
    """A field's value, "" when nvidia-smi could not give it."""
    if v == "N/A" or (v.startswith("[") and v.endswith("]")):
        return ""
    return v


def _number(n: int, text: str, raw: str, name: str) -> int:
    """A field as a whole number from 0 to 2^31-1, 0 when absent; a fraction is rounded (half away from 0)."""
    v = _field(raw)
    if v == "":
        return 0
    f = _parse_float(v)
    if f is None or math.isnan(f) or f < 0 or f > _MAX_INT32:
        raise _parse_error(n, text, "%s %s is not a number from 0 to %d" % (name, json.dumps(v), _MAX_INT32))
    return int(math.floor(f + 0.5))


def _parse_float(v: str) -> Optional[float]:
    """v as Go's strconv.ParseFloat reads it (decimal, hexadecimal with an exponent, inf, nan), else None."""
    try:
        if _DECIMAL.fullmatch(v) or v.lower() in _SPECIAL:
            return float(v)
        if _HEX_FLOAT.fullmatch(v):
            return float.fromhex(v)
    except (ValueError, OverflowError):
        return None
    return None


def _id(n: int, text: str, fields: List[str], seen_index: Set[int], seen_uuid: Set[str]) -> "tuple[int, str]":
    """A line's index (field 0) and UUID (field 1), each required and listed once in an answer."""
    v = _field(fields[0])
    index = int(v) if _INDEX.fullmatch(v) else -1
    if index < 0 or index > _MAX_INT32:
        raise _parse_error(n, text, "index %s is not a number from 0 to %d" % (json.dumps(v), _MAX_INT32))
    if index in seen_index:
        raise _parse_error(n, text, "index %d is listed twice" % index)
    uuid = _field(fields[1])
    if uuid == "":
        raise _parse_error(n, text, "no uuid")
    if len(uuid.encode("utf-8")) > MAX_UUID_BYTES:
        raise _parse_error(n, text, "uuid is over %d bytes" % MAX_UUID_BYTES)
    if not _UUID_OK.fullmatch(uuid):
        raise _parse_error(n, text, "uuid %s holds a character other than a letter, a digit or -_./"
                           % json.dumps(uuid, ensure_ascii=False))
    if uuid in seen_uuid:
        raise _parse_error(n, text, "uuid %s is listed twice" % uuid)
    seen_index.add(index)
    seen_uuid.add(uuid)
    return index, uuid


class GPUPool:
    """The GPU device ids a worker hands out to its jobs ("0", "1", ... or UUIDs), never one to two holders.

    acquire() takes n free devices, in the order given, waiting while other
    jobs hold them; release() gives them back. Thread-safe.
    """

    #: How often a waiting acquire() looks at its stop event, in seconds.
    STOP_POLL = 0.1

    def __init__(self, devices: Sequence[str]):
        if isinstance(devices, str):
            raise ConfigError("devices is a list of device ids, not a string")
        self._all: List[str] = []
        for d in devices:
            if not isinstance(d, str) or not d or "," in d or "\x00" in d:
                raise ConfigError("GPU device id %r is not a string, or is empty or holds a comma" % (d,))
            if d in self._all:
                raise ConfigError("GPU device id %r is given twice" % d)
            self._all.append(d)
        self._free = {d: True for d in self._all}
        self._cond = threading.Condition()

    def __len__(self) -> int:
        """How many devices the pool has."""
        return len(self._all)

    @property
    def devices(self) -> List[str]:
        """Every device id, in the order given."""
        return list(self._all)

    def free(self) -> int:
        """How many devices are free now."""
        with self._cond:
            return sum(1 for f in self._free.values() if f)

    def acquire(self, n: int, stop: threading.Event, reason: Callable[[], Optional[str]],
                on_wait: Optional[Callable[[], None]] = None) -> List[str]:
        """Take n free devices (in the pool's order) and return their ids; acquire(0, ...) takes none.

        Waits while fewer than n are free, calling on_wait once first (to log
        that the job waits). Raises Cancelled(reason()) when stop is set before
        they are taken (checked within STOP_POLL seconds), and ConfigError at
        once when n is negative or more than the pool has.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > len(self._all):
            raise ConfigError("%r GPUs wanted; this worker has %d" % (n, len(self._all)))
        waited = False
        while True:
            if stop.is_set():
                raise Cancelled(reason() or "canceled")
            with self._cond:
                got = [d for d in self._all if self._free[d]][:n]
                if len(got) == n:
                    for d in got:
                        self._free[d] = False
                    return got
                if waited:
                    self._cond.wait(self.STOP_POLL)
                    continue
            waited = True
            if on_wait is not None:
                on_wait()

    def release(self, devices: Sequence[str]) -> None:
        """Give back the devices acquire() returned (each once: a device given back twice could then
        be held twice). An id the pool does not have is a ConfigError."""
        with self._cond:
            for d in devices:
                if d not in self._free:
                    raise ConfigError("GPU device id %r is not one of this pool's" % (d,))
            for d in devices:
                self._free[d] = True
            self._cond.notify_all()
