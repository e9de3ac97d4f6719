"""Worker: a node's runtime, which runs decorated handlers for the jobs it leases.

    worker = Worker("http://127.0.0.1:8080", identity="/var/lib/node/identity.json",
                    provisioning_token=token)

    @worker.job("lora_train")
    def train(ctx: JobContext) -> Result:
        for step in range(100):
            ctx.check()                       # raises Cancelled once the job must stop
            ctx.progress(step / 100, "training", {"loss": 0.1})
            ctx.log("step %d" % step)
        return Result(output_uri="s3://bucket/adapter", metrics={"loss": 0.1})

    worker.run()                              # until SIGTERM: then drains

The worker registers (once: the token is kept in the identity file and renewed
before it expires); on every later run it calls POST /workers/start instead,
with what it is now (its handlers' job types, GPUs, tags, governor limits):
the control plane records the change, and, since a process that just started
holds no job, at once ends the leases a previous run of it still held (they
are queued again) instead of waiting for their expiry. It heartbeats in a
thread (listing the jobs it holds until their final report was answered, with
leases_through, the time of the newest lease answer it processed), keeps a
control long-poll (POST /workers/signals) open in another, long-polls for jobs
while it has free slots (up to max_jobs), accepts them, and runs each handler
in its own thread with a JobContext (an async handler as a task on the worker's
event loop). A handler's return completes the job; an exception fails it (a
JobError as it says; any other for good unless the handler's retry_on names its
class), with its traceback in the job's logs, where what the handler prints or
logs goes too (see capture). ctx.run runs a command in a process group of its
own on the GPUs the job takes (see process, gpus).
The job's context is cancelled when an operator cancels the job (the signals'
or the heartbeat's cancel_jobs, a status answer's cancel_requested), when its
lease is lost (409 lease_lost, lost_jobs), when the lease could not be
extended before it expires, when no heartbeat got through before the control
plane's deadline, and when the worker drains. On SIGTERM, drain(), or an
operator's drain request, the worker stops leasing, lets running jobs finish
for drain_timeout seconds, then cancels them and releases those whose handlers
did not return, and run() returns. A ban ends it as a refused credential does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from . import artifacts, capture
from . import gpus as _gpus
from . import process as _process
from .artifacts import Stop
from .client import USER_AGENT, Abort, Client, unix_seconds
from .errors import (APIError, ArtifactStorageOff, Cancelled, ConfigError, JobError, LeaseLost, NodelaneError,
                     TransportError)
from .identity import Identity

#: Defaults of Worker's settings (seconds, or counts), as the Go runner's.
DEFAULT_WAIT_SECONDS = 20
DEFAULT_IDLE_POLL = 5.0
DEFAULT_LEASE_MARGIN = 30.0
DEFAULT_DRAIN_TIMEOUT = 25.0
DEFAULT_DRAIN_GRACE = 3.0
DEFAULT_REPORT_PATIENCE = 600.0
DEFAULT_LOG_FLUSH_INTERVAL = 2.0
DEFAULT_LOG_BATCH_SIZE = 200
DEFAULT_MAX_BUFFERED_LOGS = 20000
DEFAULT_TOKEN_RENEW_BEFORE = 72 * 3600.0
#: ctx.run's grace between SIGTERM and SIGKILL of a process group, in seconds.
DEFAULT_KILL_GRACE = 10.0
#: How long the control long-poll (POST /workers/signals) waits, in seconds.
DEFAULT_SIGNALS_WAIT = 25

#: The server's limits (PROTOCOL.md §5.14) that a JobContext keeps to.
MAX_MESSAGE_BYTES = 16 << 10
MAX_PAYLOAD_BYTES = 16 << 10
MAX_LOG_ENTRIES = 1000
MAX_JOB_TYPE_BYTES = 128
MAX_NAME_BYTES = 255
#: A log message longer than this many bytes is cut and marked "...(truncated)".
MAX_LOG_MESSAGE = MAX_MESSAGE_BYTES - 32
#: The most bytes of log lines one request carries.
MAX_LOG_BATCH_BYTES = 256 << 10

#: Output a handler prints or logs (and a ctx.run process's lines) is logged
#: at most this many lines a second, with bursts of OUTPUT_BURST; lines beyond
#: are dropped, and a line says how many, as the Go command runner does.
OUTPUT_LINES_PER_SECOND = _process.LINE_RATE
OUTPUT_BURST = _process.LINE_BURST
#: The most bytes of a failure's message (the fail route's error_message).
MAX_FAIL_MESSAGE = 4096

#: Why a job's context was cancelled (JobContext.reason, Cancelled.reason).
CANCELED = "canceled"
LEASE_LOST = "lease_lost"
LEASE_EXPIRING = "lease_expiring"
OFFLINE = "offline"
DRAINED = "drained"

#: The codes that mean this node cannot go on with its credential.
_AUTH_FATAL = {"missing_credential", "invalid_token", "token_expired", "token_revoked", "bad_signature",
               "worker_banned", "insufficient_scope"}
_TOKEN_DEAD = {"token_expired", "token_revoked", "invalid_token", "not_found"}

_log = logging.getLogger("nodelane.worker")


def check_job_type(job_type: Any) -> str:
    """Return job_type if it is a valid job type name, else raise ConfigError.

    A job type is 1 to 128 bytes of UTF-8 without whitespace or control characters.
    """
    if not isinstance(job_type, str) or not job_type:
        raise ConfigError("a job type is a non-empty string, not %r" % (job_type,))
    if len(job_type.encode("utf-8")) > MAX_JOB_TYPE_BYTES:
        raise ConfigError("job type %r is over %d bytes" % (job_type[:40], MAX_JOB_TYPE_BYTES))
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in job_type):
        raise ConfigError("job type %r holds whitespace or a control character" % job_type)
    return job_type


def object_payload(v: Any) -> Optional[Dict[str, Any]]:
    """A value for a payload field, which must be a JSON object of at most 16 KiB.

    None stays None; a non-object is wrapped as {"value": v}; a value that is
    not JSON becomes {"error": ...}; one over the limit becomes {"truncated": true}.
    """
    if v is None:
        return None
    if not isinstance(v, dict):
        v = {"value": v}
    try:
        b = json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        return {"error": "payload not encodable: %s" % e}
    if len(b) > MAX_PAYLOAD_BYTES:
        return {"truncated": True}
    return json.loads(b)


def _cut(s: str, limit: int, mark: str = "...(truncated)") -> str:
    b = s.encode("utf-8")
    if len(b) <= limit:
        return s
    return b[:limit].decode("utf-8", "ignore") + mark


@dataclass
class Result:
    """What a handler's job completes with: all optional. A handler may also return a dict (metrics)."""

    output_uri: Optional[str] = None
    metrics: Optional[Dict[str, Any]] = None
    final_message: Optional[str] = None


@dataclass
class JobEnd:
    """How a job ended for this worker, given to Worker's on_job_end.

    outcome is one of "succeeded", "failed" (a fail was reported; the job may be
    queued again), "canceled", "released" (handed back), "lost" (the lease was
    lost) and "abandoned" (its result could not be reported). answer is the
    complete or fail answer, when there was one.
    """

    job: Dict[str, Any]
    outcome: str
    error: Optional[BaseException] = None
    answer: Optional[Dict[str, Any]] = None


class JobContext:
    """What a handler gets: the job, and the means to report on it and to learn it must stop.

    Its methods may be called from any thread. `cancelled` (and the Event
    `cancel_event`) turns true once the job must stop; `reason` says why.
    """

    def __init__(self, worker: "Worker", grant: Dict[str, Any]):
        self._w = worker
        self.job: Dict[str, Any] = grant["job"]
        self.lease_token: str = grant["lease_token"]
        self.lease_id: Optional[str] = grant.get("lease_id")
        #: Set once the job must stop.
        self.cancel_event = threading.Event()
        self.reason: Optional[str] = None
        self._mu = threading.Lock()
        self._lost = False
        self._cancel_seen = False  # the control plane said its cancel was requested
        self._claimed = False
        self._expires_at: Optional[float] = None  # server clock
        self._ttl = 0.0
        # results
        self._output: Result = Result()
        # logs
        self._seq_base = 0
        self._n = 0
        self._pending: List[Dict[str, Any]] = []
        self._pending_bytes = 0
        self._dropped = 0
        self._send_mu = threading.Lock()
        self._kick = threading.Event()
        # artifact bytes: transfers stop with the job; uploads in flight hold its completion
        self._transfers = Stop(self.cancel_event, lambda: self.reason)
        self._uploads = 0
        self._uploads_done = threading.Condition(self._mu)
        self._scratch: Optional[str] = None
        #: The local path of the checkpoint this attempt resumes from (a grant's resume_from,
        #: downloaded and verified before the handler runs), or None.
        self.resume_from: Optional[str] = None
        # captured output (print, logging): a token bucket, and the lines it dropped
        self._out_tokens = float(OUTPUT_BURST)
        self._out_at = time.monotonic()
        self._out_dropped = 0
        # an async handler's task and its loop, cancelled when the job must stop
        self._task: Optional["asyncio.Task[Any]"] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # ctx.run: the GPUs the job holds (None until taken), and the runs so far
        self._devices: Optional[List[str]] = None
        self._runs = 0

    # -- the job ------------------------------------------------------------

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.job["id"]

    @property
    def job_type(self) -> str:
        """The job's type."""
        return self.job["job_type"]

    @property
    def payload(self) -> Dict[str, Any]:
        """The job's input ({} when none)."""
        return self.job.get("payload") or {}

    @property
    def attempt(self) -> int:
        """The current attempt, from 1."""
        return int(self.job.get("attempt") or 1)

    # -- stopping -----------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether the job must stop (see reason)."""
        return self.cancel_event.is_set()

    def check(self) -> None:
        """Raise Cancelled if the job must stop; else return at once."""
        if self.cancel_event.is_set():
            raise Cancelled(self.reason or CANCELED)

    def sleep(self, seconds: float) -> None:
        """Wait up to seconds, and raise Cancelled as soon as the job must stop."""
        self.cancel_event.wait(seconds)
        self.check()

    async def asleep(self, seconds: float) -> None:
        """sleep() for an async handler: wait on the event loop, and raise Cancelled once the job must stop."""
        self.check()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if self.cancelled:
                raise Cancelled(self.reason or CANCELED) from None
            raise
        self.check()

    def _stop(self, reason: str) -> None:
        with self._mu:
            if self.reason is None:
                self.reason = reason
            task, loop = self._task, self._loop
        self.cancel_event.set()
        self._transfers.stop()  # cut the uploads and downloads in flight
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)  # an async handler stops at its next await

    def _cancel(self) -> None:
        """The control plane says the job's cancel was requested: stop it, and remember it was said."""
        with self._mu:
            self._cancel_seen = True
        self._stop(CANCELED)

    def _lose(self) -> None:
        with self._mu:
            first = not self._lost
            self._lost = True
        if first:
            self._w.log.warning("lease lost: job %s", self.job_id)
        self._stop(LEASE_LOST)

    @property
    def lost(self) -> bool:
        """Whether the job's lease was lost."""
        with self._mu:
            return self._lost

    def _claim(self) -> bool:
        with self._mu:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def _extend(self, expires_at: Optional[str]) -> None:
        if not expires_at:
            return
        exp = unix_seconds(expires_at)
        if exp is None:
            return
        with self._mu:
            if self._expires_at is not None and exp <= self._expires_at:
                return
            self._ttl = max(self._ttl, exp - self._w.client.server_now())
            self._expires_at = exp

    def _margin(self) -> float:
        return min(self._w.lease_margin, self._ttl / 5)

    def _left(self) -> Optional[float]:
        """Seconds until the lease's margin, on the server's clock, or None when unknown."""
        with self._mu:
            if self._expires_at is None:
                return None
            return self._expires_at - self._margin() - self._w.client.server_now()

    def _deadline(self) -> float:
        """The lease's expiry as time.monotonic(), or report_patience from now when unknown."""
        with self._mu:
            exp = self._expires_at
        if exp is None:
            return time.monotonic() + self._w.report_patience
        return time.monotonic() + (exp - self._w.client.server_now())

    # -- reporting ----------------------------------------------------------

    def _report(self, fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        try:
            ans = fn()
        except LeaseLost:
            self._lose()
            raise
        self._extend(ans.get("expires_at"))
        if ans.get("cancel_requested"):
            self._cancel()
        return ans

    def status(self, event_type: str, message: str = "", payload: Any = None) -> Dict[str, Any]:
        """Report a status event (POST .../status), which also extends the lease.

        payload must be a JSON object (anything else is wrapped as {"value": ...}).
        If the answer says the job's cancel was requested, the context is
        cancelled. Raises LeaseLost (and cancels) when the lease is gone.
        """
        if not isinstance(event_type, str) or not event_type or len(event_type.encode("utf-8")) > MAX_NAME_BYTES:
            raise ConfigError("event_type is 1 to %d bytes" % MAX_NAME_BYTES)
        if not isinstance(message, str):
            raise ConfigError("message is a string")
        msg = _cut(message, MAX_MESSAGE_BYTES - 32)
        return self._report(lambda: self._w.client.status(self.job_id, self.lease_token, event_type, msg,
                                                          object_payload(payload)))

    def progress(self, fraction: Optional[float] = None, message: str = "",
                 metrics: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Report progress: a status event "progress" with {"fraction": f, "metrics": {...}}.

        fraction, when given, is a number from 0 to 1.
        """
        payload: Dict[str, Any] = {}
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
                raise ConfigError("progress fraction is a number from 0 to 1, not %r" % (fraction,))
            payload["fraction"] = fraction
        if metrics is not None:
            if not isinstance(metrics, dict):
                raise ConfigError("progress metrics is a dict")
            payload["metrics"] = metrics
        return self.status("progress", message, payload)

    def log(self, message: str, payload: Any = None) -> None:
        """Buffer a log line; never blocks on the network.

        Lines are sent in batches every log_flush_interval, when a batch is
        full, on flush(), and before the job's result; each has a seq the server
        stores once, so a batch sent twice is stored once. A message over 16 KiB
        is cut, a payload over 16 KiB replaced by {"truncated": true}. At most
        max_buffered_logs lines wait; beyond, the oldest are dropped and a line
        says how many.
        """
        if not isinstance(message, str):
            message = str(message)
        message = _cut(message, MAX_LOG_MESSAGE)
        entry = {"message": message, "payload": object_payload(payload)}
        size = _entry_size(entry)
        with self._mu:
            self._n += 1
            entry["seq"] = self._seq_base + self._n
            self._pending.append(entry)
            self._pending_bytes += size
            while len(self._pending) > self._w.max_buffered_logs:
                self._pending_bytes -= _entry_size(self._pending.pop(0))
                self._dropped += 1
            full = len(self._pending) >= self._w.log_batch_size or self._pending_bytes >= MAX_LOG_BATCH_BYTES
        if full:
            self._kick.set()

    def _capture_line(self, message: str, payload: Dict[str, Any]) -> None:
        """Log a line the handler printed or logged, at most OUTPUT_LINES_PER_SECOND a second."""
        with self._mu:
            now = time.monotonic()
            self._out_tokens = min(float(OUTPUT_BURST),
                                   self._out_tokens + (now - self._out_at) * OUTPUT_LINES_PER_SECOND)
            self._out_at = now
            if self._out_tokens < 1:
                self._out_dropped += 1
                return
            self._out_tokens -= 1
            dropped, self._out_dropped = self._out_dropped, 0
        if dropped:
            self.log("%d output lines dropped: over the limit of %d lines per second" % (
                dropped, OUTPUT_LINES_PER_SECOND), {"warning": "output_dropped"})
        self.log(message, payload)

    def _output_dropped(self) -> None:
        """Log how many captured lines were dropped and not yet said (at the job's end)."""
        with self._mu:
            dropped, self._out_dropped = self._out_dropped, 0
        if dropped:
            self.log("%d output lines dropped: over the limit of %d lines per second" % (
                dropped, OUTPUT_LINES_PER_SECOND), {"warning": "output_dropped"})

    @property
    def buffered_logs(self) -> int:
        """How many log lines wait to be sent."""
        with self._mu:
            return len(self._pending)

    def flush(self) -> None:
        """Send the buffered log lines now; lines that could not be sent stay buffered."""
        with self._send_mu:
            while True:
                with self._mu:
                    if self._dropped:
                        self._n += 1
                        e = {"seq": self._seq_base + self._n, "payload": None,
                             "message": "%d log lines dropped: the buffer was full" % self._dropped}
                        self._pending.append(e)
                        self._pending_bytes += _entry_size(e)
                        self._dropped = 0
                    n, size = 0, 0
                    while (n < len(self._pending) and n < self._w.log_batch_size
                           and (n == 0 or size + _entry_size(self._pending[n]) <= MAX_LOG_BATCH_BYTES)):
                        size += _entry_size(self._pending[n])
                        n += 1
                    batch = [dict(e) for e in self._pending[:n]]
                if n == 0:
                    return
                try:
                    ans = self._w.client.logs(self.job_id, self.lease_token, batch)
                    self._extend(ans.get("expires_at"))
                except LeaseLost:
                    self._lose()
                    raise
                except APIError as e:
                    if e.code not in ("invalid_request", "payload_too_large"):
                        raise
                    self._w.log.error("log lines refused, dropped: job %s: %s", self.job_id, e)
                last = batch[-1]["seq"]
                with self._mu:
                    i = 0
                    while i < len(self._pending) and self._pending[i]["seq"] <= last:
                        self._pending_bytes -= _entry_size(self._pending[i])
                        i += 1
                    del self._pending[:i]

    def artifact(self, artifact_type: str, name: str, uri: str, path: Optional[str] = None,
                 checksum_sha256: Optional[str] = None, size_bytes: Optional[int] = None,
                 metadata: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Report an artifact; with path, its SHA-256 and size are computed from the local file.

        Returns {"artifact_id", "receipt_id"}.
        """
        for field, v in (("artifact_type", artifact_type), ("name", name)):
            if not isinstance(v, str) or not v or len(v.encode("utf-8")) > MAX_NAME_BYTES:
                raise ConfigError("%s is 1 to %d bytes" % (field, MAX_NAME_BYTES))
        if not isinstance(uri, str) or not uri or len(uri.encode("utf-8")) > 2048:
            raise ConfigError("uri is 1 to 2048 bytes")
        if path is not None:
            h = hashlib.sha256()
            size_bytes = 0
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    size_bytes += len(chunk)
            checksum_sha256 = h.hexdigest()
        md = object_payload(metadata)
        return self._report(lambda: self._w.client.artifact(
            self.job_id, self.lease_token, artifact_type, name, uri, checksum_sha256=checksum_sha256,
            size_bytes=size_bytes, metadata=md, idempotency_key=idempotency_key))

    def upload(self, path: str, name: Optional[str] = None, kind: str = "file",
               metadata: Optional[Dict[str, Any]] = None, uri: Optional[str] = None) -> Dict[str, Any]:
        """Upload a file's bytes to the control plane's artifact store and record it as an artifact of
        the job; return once the bytes are stored and checked: {"artifact_id", "receipt_id", "stored", ...}.

        name defaults to the file's base name; kind is the artifact_type ("checkpoint"
        for one a later attempt resumes from, see resume_from). The file is read in
        blocks (hashed, then each part read once for its digest and once as it is
        sent), never held whole in memory; a part whose connection fails is sent
        again, alone (see Worker's upload_part_attempts). It must not change
        until upload returns.

        uri, when given, is where else the file is known (file://, s3://...),
        recorded as the artifact's uri beside its stored bytes.

        The job completes only after the uploads it started have ended, and a
        cancel, lease loss or drain cuts them (Cancelled). Raises
        ArtifactStorageOff when the control plane stores no bytes, unless uri
        is given: the artifact is then reported as metadata only, as
        artifact() does (uri, the file's SHA-256 and size; "stored": False).
        ArtifactMismatch means the stored bytes were not those hashed (the file
        changed): nothing was recorded.
        """
        if name is None:
            name = os.path.basename(path)
        for field, v in (("kind", kind), ("name", name)):
            if not isinstance(v, str) or not v or len(v.encode("utf-8")) > MAX_NAME_BYTES:
                raise ConfigError("%s is 1 to %d bytes" % (field, MAX_NAME_BYTES))
        if uri is not None and (not isinstance(uri, str) or not uri or len(uri.encode("utf-8")) > 2048):
            raise ConfigError("uri is 1 to 2048 bytes")
        md = object_payload(metadata)
        with self._mu:
            self._uploads += 1
        try:
            return artifacts.upload_file(self._w.client, self.job_id, self.lease_token, path, name=name,
                                         artifact_type=kind, metadata=md, uri=uri, stop=self._transfers,
                                         part_attempts=self._w.upload_part_attempts, on_answer=self._answered)
        except LeaseLost:
            self._lose()
            raise
        except ArtifactStorageOff as e:
            if uri is None:
                raise
            self._w._storage_off(e)
            ans = self.artifact(kind, name, uri, path=path, metadata=metadata)
            ans["stored"] = False
            return ans
        finally:
            with self._mu:
                self._uploads -= 1
                self._uploads_done.notify_all()

    def _answered(self, ans: Dict[str, Any]) -> None:
        self._extend(ans.get("expires_at"))
        if ans.get("cancel_requested"):
            self._cancel()

    def _wait_uploads(self) -> None:
        """Wait until the uploads started from any thread have ended (stored, failed or cut)."""
        with self._mu:
            while self._uploads:
                self._uploads_done.wait(1.0)

    @property
    def scratch_dir(self) -> str:
        """A directory of this job's attempt (0700, under Worker's scratch_dir), removed when the job ends."""
        with self._mu:
            if self._scratch is None:
                if self._w.scratch_dir:
                    os.makedirs(self._w.scratch_dir, mode=0o700, exist_ok=True)
                self._scratch = tempfile.mkdtemp(prefix="nodelane-%s-" % _safe(self.job_id),
                                                 dir=self._w.scratch_dir)
            return self._scratch

    def _fetch_resume(self) -> None:
        """Download and verify the checkpoint the job's resume_from names into scratch_dir, if any."""
        rf = self.job.get("resume_from")
        if not isinstance(rf, dict) or not rf.get("artifact_id"):
            return
        d = os.path.join(self.scratch_dir, "resume")  # apart from what the handler writes in scratch_dir
        os.makedirs(d, mode=0o700, exist_ok=True)
        dest = os.path.join(d, _safe(rf.get("name") or "") or "checkpoint")
        self._w.log.info("job %s: downloading checkpoint %s (%s bytes) to resume from", self.job_id,
                         rf.get("artifact_id"), rf.get("size_bytes"))
        try:
            self.resume_from = artifacts.download_file(self._w.client, self.job_id, self.lease_token, rf, dest,
                                                       stop=self._transfers)
        except LeaseLost:
            self._lose()
            raise
        except Cancelled:
            raise
        except NodelaneError as e:
            raise JobError("the checkpoint to resume from (%s) could not be fetched: %s" % (
                rf.get("artifact_id"), e), code="resume_unavailable", retryable=True) from e

    def _cleanup(self) -> None:
        with self._mu:
            d, self._scratch = self._scratch, None
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)

    def set_output(self, output_uri: Optional[str] = None, metrics: Optional[Dict[str, Any]] = None,
                   final_message: Optional[str] = None) -> None:
        """Set what the completion reports if the handler returns None."""
        self._output = Result(output_uri, metrics, final_message)

    # -- subprocesses ---------------------------------------------------------

    @property
    def gpus(self) -> List[str]:
        """The GPUs this job holds, as CUDA_VISIBLE_DEVICES ids ("0", "1", ...).

        They are taken from the worker's GPUs at the first ctx.run (or the first
        read of this property, which takes the job's requirements.gpu_count) and
        held until the job ends: no other job gets them meanwhile. Taking waits,
        as long as the job may run, for enough to be free.
        """
        return self._take_gpus(None)

    def _take_gpus(self, n: Optional[int]) -> List[str]:
        if n is None:
            n = int((self.job.get("requirements") or {}).get("gpu_count") or 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError("gpus is a number of GPUs, 0 or more, not %r" % (n,))
        with self._mu:
            held = self._devices
        if held is not None:
            if n > len(held):
                raise ConfigError("job %s holds %d GPUs and asks for %d: a job takes its GPUs once, at its "
                                  "first ctx.run (or ctx.gpus)" % (self.job_id, len(held), n))
            return held[:n]
        got = self._w._pool.acquire(n, self.cancel_event, lambda: self.reason, on_wait=lambda: self.log(
            "waiting for %d free GPUs (the worker has %d)" % (n, len(self._w.devices)), {"warning": "gpus_busy"}))
        with self._mu:
            self._devices = list(got)
        return list(got)

    def _release_gpus(self) -> None:
        with self._mu:
            held, self._devices = self._devices, None
        if held:
            self._w._pool.release(held)

    def run(self, argv: "List[str] | Tuple[str, ...]", gpus: Optional[int] = None, timeout: Optional[float] = None,
            env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None, *,
            retry_on_exit: "Tuple[int, ...] | List[int]" = (), kill_grace: Optional[float] = None
            ) -> "_process.RunResult":
        """Run a command for the job, as cmd/worker runs a job's command (docs/COMMANDS.md §2–§5).

        argv runs in a process group of its own, under a small supervising
        process (the shim) that kills the group when this worker dies, with
        stdin /dev/null, in cwd (default: a fresh run directory in
        scratch_dir), with a scrubbed environment: PATH, HOME and LANG, the
        NODELANE_* variables of COMMANDS.md §2 (the payload as a file, a
        fresh output directory, the checkpoint to resume from), the
        CUDA_VISIBLE_DEVICES of the gpus it takes (default: the job's
        requirements.gpu_count; see ctx.gpus) with CUDA_DEVICE_ORDER=PCI_BUS_ID,
        and env on top (which may not set those names). The worker's own
        variables and secrets are not passed.

        Every line it prints goes to the job's logs (100 lines a second, bursts
        of 1,000); `nodelane:progress {json}` lines report progress and
        `nodelane:artifact {json}` lines upload a file of the output directory
        (COMMANDS.md §3). Exit 0 returns a RunResult (result.json's object as
        its metrics); any other end raises JobError with COMMANDS.md §4's code:
        exit_N (retryable when N is in retry_on_exit), signal_SIGNAME
        (retryable), timeout, start_failed, bad_result, artifact_not_reported.
        When the job must stop (cancel, lost lease, drain) or timeout passes,
        the group gets SIGTERM, then SIGKILL kill_grace seconds later (the
        Worker's kill_grace by default), and run raises Cancelled (JobError
        timeout). It returns only once the whole group is gone.
        """
        if env is not None:
            if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise ConfigError("env is a dict of str to str")
            for k in env:
                if _process.reserved(k):
                    raise ConfigError("env may not set %s: the worker sets it" % k)
        devices = self._take_gpus(gpus)
        with self._mu:
            self._runs += 1
            n = self._runs
        d = os.path.join(self.scratch_dir, "run-%d" % n)
        out = os.path.join(d, "output")
        os.makedirs(out, mode=0o700)
        payload_path = os.path.join(d, "payload.json")
        with open(os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(self.job.get("payload"), f)
        extra = {"NODELANE_JOB_ID": self.job_id, "NODELANE_JOB_TYPE": self.job_type,
                 "NODELANE_ATTEMPT": str(self.attempt), "NODELANE_PAYLOAD": payload_path,
                 "NODELANE_OUTPUT_DIR": out, "CUDA_VISIBLE_DEVICES": ",".join(devices)}
        if self.resume_from:
            extra["NODELANE_RESUME_FROM"] = os.path.abspath(self.resume_from)
        extra.update(env or {})
        try:
            return _process.run_command(
                list(argv), sink=_RunSink(self), stop=self.cancel_event, stop_reason=lambda: self.reason,
                env=_process.scrubbed_env(extra), cwd=cwd or d, output_dir=out, timeout=timeout,
                kill_grace=self._w.kill_grace if kill_grace is None else kill_grace,
                retry_on_exit=tuple(retry_on_exit), registry=self._w._running,
                record={"job_id": self.job_id, "attempt": self.attempt})
        finally:
            try:
                os.remove(payload_path)
            except OSError:
                pass

    async def arun(self, argv: "List[str] | Tuple[str, ...]", gpus: Optional[int] = None,
                   timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
                   cwd: Optional[str] = None, **kw: Any) -> "_process.RunResult":
        """run() in a thread, for an async handler."""
        return await asyncio.to_thread(self.run, argv, gpus, timeout, env, cwd, **kw)

    # -- async counterparts of the calls that block --------------------------

    async def astatus(self, event_type: str, message: str = "", payload: Any = None) -> Dict[str, Any]:
        """status() in a thread, for an async handler."""
        return await asyncio.to_thread(self.status, event_type, message, payload)

    async def aprogress(self, fraction: Optional[float] = None, message: str = "",
                        metrics: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """progress() in a thread, for an async handler."""
        return await asyncio.to_thread(self.progress, fraction, message, metrics)

    async def aflush(self) -> None:
        """flush() in a thread, for an async handler."""
        await asyncio.to_thread(self.flush)

    async def aartifact(self, artifact_type: str, name: str, uri: str, **kw: Any) -> Dict[str, Any]:
        """artifact() in a thread, for an async handler."""
        return await asyncio.to_thread(self.artifact, artifact_type, name, uri, **kw)

    async def aupload(self, path: str, name: Optional[str] = None, kind: str = "file",
                      metadata: Optional[Dict[str, Any]] = None, uri: Optional[str] = None) -> Dict[str, Any]:
        """upload() in a thread, for an async handler."""
        return await asyncio.to_thread(self.upload, path, name, kind, metadata, uri)

    def _flush_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._kick.wait(self._w.log_flush_interval)
            self._kick.clear()
            if stop.is_set():
                return
            try:
                self.flush()
            except NodelaneError as e:
                self._w.log.debug("log flush failed; the lines stay buffered: %s", e)


class _RunSink:
    """What ctx.run's process reports, given to its job: logs, progress, artifact uploads."""

    def __init__(self, ctx: JobContext):
        self._ctx = ctx

    def log(self, message: str, payload: Optional[Dict[str, Any]]) -> None:
        self._ctx.log(message, payload)

    def progress(self, fraction: Optional[float], message: str, metrics: Optional[Dict[str, Any]]) -> None:
        try:
            self._ctx.progress(fraction, message, metrics)
        except LeaseLost:
            pass  # the context is stopped: the run ends
        except NodelaneError as e:
            self._ctx._w.log.warning("progress of job %s not reported: %s", self._ctx.job_id, e)

    def upload(self, path: str, name: str, kind: str, metadata: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        # uri: where the file is on the box, recorded as metadata only when the control plane stores no bytes
        return self._ctx.upload(path, name=name, kind=kind, metadata=metadata, uri="file://" + path)


def _safe(name: str) -> str:
    """name reduced to a file name: its base name, letters, digits and ._- only, at most 100 bytes."""
    base = os.path.basename(name.replace("\\", "/"))
    out = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in base)[:100]
    return "" if out.strip(".") == "" else out


def _entry_size(e: Dict[str, Any]) -> int:
    return len(e["message"].encode("utf-8")) + len(json.dumps(e.get("payload"))) + 48


Handler = Callable[[JobContext], Any]


@dataclass(frozen=True)
class _Spec:
    """A registered handler: the function, whether it is async, and the exceptions it retries on."""

    fn: Handler
    is_async: bool
    retry_on: Optional[Tuple[Type[BaseException], ...]]


def _is_async(fn: Any) -> bool:
    """Whether fn is an async def function (or an object whose __call__ is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _retry_classes(retry_on: Any, what: str) -> Tuple[Type[BaseException], ...]:
    """retry_on as a tuple of exception classes, or ConfigError."""
    if isinstance(retry_on, type):
        retry_on = (retry_on,)
    try:
        classes = tuple(retry_on)
    except TypeError:
        raise ConfigError("%s is a tuple of exception classes, not %r" % (what, retry_on)) from None
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise ConfigError("%s is a tuple of exception classes; %r is not one" % (what, c))
    return classes


def _invoke(ctx: JobContext, fn: Handler, is_async: bool, loop: Optional[asyncio.AbstractEventLoop]) -> Any:
    """Call a handler as the job's: its print and logging output go to ctx (see capture).

    An async handler runs as a task on loop, and this thread waits for it; the
    task is cancelled when the job must stop, which raises Cancelled here. A
    plain handler that returns an awaitable (an async function called but not
    awaited) fails the job: nothing of what it meant to do has run.
    """
    if is_async:
        if loop is None:
            raise ConfigError("an async handler needs the worker's event loop")
        fut = asyncio.run_coroutine_threadsafe(_run_async(ctx, fn, loop), loop)
        try:
            return fut.result()
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            raise Cancelled(ctx.reason or CANCELED) from None
    with capture.job(ctx):
        result = fn(ctx)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never run: no "was never awaited" warning
        raise JobError("the handler of job type %s returned %s instead of a result: it was never awaited, "
                       "so none of its work ran; define the handler with `async def` and the worker awaits "
                       "it on its event loop" % (ctx.job_type, type(result).__name__),
                       code="handler_returned_coroutine", retryable=False)
    return result


async def _run_async(ctx: JobContext, fn: Handler, loop: asyncio.AbstractEventLoop) -> Any:
    with capture.job(ctx):
        with ctx._mu:
            ctx._task, ctx._loop = asyncio.current_task(), loop
            stopped = ctx.reason is not None  # a _stop before this saw no task to cancel
        try:
            if stopped:
                raise Cancelled(ctx.reason or CANCELED)
            return await fn(ctx)
        finally:
            with ctx._mu:
                ctx._task = None


def _failure(ctx: JobContext, err: BaseException, retry_on: Tuple[Type[BaseException], ...]
             ) -> "tuple[str, bool, str, Optional[Dict[str, Any]]]":
    """The fail report of a handler's exception: (code, retryable, message, payload).

    A JobError says its own; any other exception is handler_error, retryable
    only when it is one of retry_on, and its message is the exception and the
    end of its traceback (within MAX_FAIL_MESSAGE bytes).
    """
    if isinstance(err, JobError):
        return err.code, err.retryable, _cut(str(err), MAX_FAIL_MESSAGE, ""), object_payload(err.payload)
    head = _cut("%s: %s" % (type(err).__name__, err), 1024)
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()
    room = MAX_FAIL_MESSAGE - len(head.encode("utf-8")) - 2
    b = tb.encode("utf-8")
    if len(b) > room:
        mark = "...(earlier lines cut)\n"
        tb = mark + b[len(b) - (room - len(mark)):].decode("utf-8", "ignore")
    return "handler_error", isinstance(err, retry_on), head + "\n\n" + tb, None


def _log_exception(ctx: JobContext, err: BaseException) -> None:
    """Put a handler's exception, with its traceback, into the job's logs."""
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()
    payload: Dict[str, Any] = {"level": "ERROR", "exception": type(err).__name__}
    if isinstance(err, JobError):
        payload.update(code=err.code, retryable=err.retryable)
    ctx.log(tb, payload)


class Worker:
    """A worker node's runtime: register, heartbeat, lease, run handlers, report, drain.

    url is the control plane's base URL. identity is an Identity, a path to an
    identity file (created 0600 when missing), or None for an in-memory one.
    provisioning_token (node:register) is needed only when the identity has no
    worker token yet, or its token can no longer be renewed. registration holds
    the register body's fields (node_id, name, capabilities with gpus, tags,
    governor_limits, ...); capabilities.job_types defaults to the handlers'
    types, governor_limits.max_jobs to max_jobs. They are sent on every run
    (register, or start for a node with a token), so a new handler, tag or
    limit takes effect at the next run. signals_wait is how long the control
    long-poll waits (1 to 60 s; None: no long-poll, signals come with
    heartbeats only). scratch_dir is where each job's JobContext.scratch_dir
    is made (a checkpoint it resumes from is downloaded there; the system's
    temporary directory by default); upload_part_attempts bounds the tries of
    one part of an upload (JobContext.upload). wait_for_proofs makes each
    completion wait for its receipts' proofs, so that JobEnd.answer carries
    them; by default it is answered at once without them (§5.8). Times are
    seconds.
    """

    def __init__(self, url: str, identity: "Identity | str | None" = None, *,
                 provisioning_token: Optional[str] = None, registration: Optional[Dict[str, Any]] = None,
                 max_jobs: int = 1, wait_seconds: int = DEFAULT_WAIT_SECONDS,
                 idle_poll: float = DEFAULT_IDLE_POLL, heartbeat_interval: Optional[float] = None,
                 lease_margin: float = DEFAULT_LEASE_MARGIN, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
                 drain_grace: float = DEFAULT_DRAIN_GRACE, report_patience: float = DEFAULT_REPORT_PATIENCE,
                 log_flush_interval: float = DEFAULT_LOG_FLUSH_INTERVAL,
                 log_batch_size: int = DEFAULT_LOG_BATCH_SIZE, max_buffered_logs: int = DEFAULT_MAX_BUFFERED_LOGS,
                 token_renew_before: float = DEFAULT_TOKEN_RENEW_BEFORE,
                 signals_wait: Optional[int] = DEFAULT_SIGNALS_WAIT,
                 supported_gpu_skus: Optional[List[str]] = None,
                 scratch_dir: Optional[str] = None,
                 upload_part_attempts: int = artifacts.DEFAULT_PART_ATTEMPTS,
                 wait_for_proofs: bool = False,
                 metrics: Optional[Callable[[], Dict[str, Any]]] = None,
                 on_job_end: Optional[Callable[[JobEnd], None]] = None,
                 nvidia_smi: Optional[str] = "nvidia-smi", kill_grace: float = DEFAULT_KILL_GRACE,
                 running_file: Optional[str] = None, capture_output: bool = True,
                 log_level: int = logging.INFO, retry_on: Any = (),
                 client: Optional[Client] = None, logger: Optional[logging.Logger] = None,
                 **client_options: Any):
        if not 1 <= max_jobs <= 256:
            raise ConfigError("max_jobs is 1 to 256")
        if not 0 <= wait_seconds <= 60:
            raise ConfigError("wait_seconds is 0 to 60")
        if not 1 <= log_batch_size <= MAX_LOG_ENTRIES:
            raise ConfigError("log_batch_size is 1 to %d" % MAX_LOG_ENTRIES)
        if max_buffered_logs < 1:
            raise ConfigError("max_buffered_logs is at least 1")
        for name, v in (("idle_poll", idle_poll), ("lease_margin", lease_margin),
                        ("drain_timeout", drain_timeout), ("drain_grace", drain_grace),
                        ("report_patience", report_patience), ("log_flush_interval", log_flush_interval),
                        ("token_renew_before", token_renew_before)):
            if v < 0:
                raise ConfigError("%s is negative" % name)
        if upload_part_attempts < 1:
            raise ConfigError("upload_part_attempts is at least 1")
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ConfigError("heartbeat_interval must be positive")
        if signals_wait is not None and (isinstance(signals_wait, bool) or not 1 <= signals_wait <= 60):
            raise ConfigError("signals_wait is 1 to 60 seconds, or None for no control long-poll")
        if isinstance(kill_grace, bool) or not isinstance(kill_grace, (int, float)) or not kill_grace > 0:
            raise ConfigError("kill_grace is a positive number of seconds")
        if nvidia_smi is not None and (not isinstance(nvidia_smi, str) or not nvidia_smi):
            raise ConfigError("nvidia_smi is the nvidia-smi to run, or None for no discovery")
        if isinstance(log_level, bool) or not isinstance(log_level, int):
            raise ConfigError("log_level is a logging level (an int such as logging.INFO)")
        self.retry_on = _retry_classes(retry_on, "retry_on")
        if running_file is None and isinstance(identity, str):
            running_file = identity + ".running.json"
        if isinstance(identity, str):
            identity = Identity.load_or_create(identity)
        self.client = client or Client(url, identity, **client_options)
        self.identity = self.client.identity
        self.provisioning_token = provisioning_token
        self.registration = dict(registration or {})
        self.max_jobs = max_jobs
        self.wait_seconds = wait_seconds
        self.idle_poll = idle_poll
        self.heartbeat_interval = heartbeat_interval
        self.lease_margin = lease_margin
        self.drain_timeout = drain_timeout
        self.drain_grace = drain_grace
        self.report_patience = report_patience
        self.log_flush_interval = log_flush_interval
        self.log_batch_size = log_batch_size
        self.max_buffered_logs = max_buffered_logs
        self.token_renew_before = token_renew_before
        self.signals_wait = signals_wait
        self.supported_gpu_skus = supported_gpu_skus
        self.scratch_dir = scratch_dir
        self.upload_part_attempts = upload_part_attempts
        self.wait_for_proofs = wait_for_proofs
        self.metrics = metrics
        self.on_job_end = on_job_end
        self.nvidia_smi = nvidia_smi
        self.kill_grace = float(kill_grace)
        self.running_file = running_file
        self.capture_output = capture_output
        self.log_level = log_level
        self.log = logger or _log
        #: The GPU devices (CUDA_VISIBLE_DEVICES ids) ctx.run hands out, set by run().
        self.devices: List[str] = []
        self._pool: Any = None
        self._running: Any = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

        self._handlers: Dict[str, _Spec] = {}
        self._mu = threading.Lock()
        self._jobs: Dict[str, JobContext] = {}
        self._started = False
        self._draining = False
        self._drain_event = threading.Event()
        self._hard = threading.Event()  # reports still being retried stop
        self._slot = threading.Event()
        self._changed = threading.Condition(self._mu)
        self._hb_kick = threading.Event()
        self._hb_stop = threading.Event()
        self._hb_interval = 30.0
        self._offline_at: Optional[float] = None  # time.monotonic()
        self._fatal: Optional[BaseException] = None
        self._lease_abort: Optional[Abort] = None
        self._renew_mu = threading.Lock()
        # Under _mu with _jobs: the server_time of the newest lease (or register/start) answer
        # processed, and the grants refused (released) whose release was not answered yet.
        self._leases_through: Optional[str] = None
        self._releasing: Dict[str, Dict[str, Any]] = {}
        self._hb_capabilities: Optional[Dict[str, Any]] = None  # for a control plane without start
        self._drain_requested = False  # the operator's drain request, as last signalled
        self._signals_abort: Optional[Abort] = None
        self._signals_jobs: "set[str]" = set()  # the jobs the open long-poll watches
        self._signals_restart = False
        self._storage_off_logged = False
        #: The answer of run()'s start (or register), for a caller to look at.
        self.start_answer: Optional[Dict[str, Any]] = None
        #: Set once run() registered or started, and leases.
        self.ready = threading.Event()

    # -- handlers -----------------------------------------------------------

    def job(self, job_type: str, retry_on: Any = None) -> Callable[[Handler], Handler]:
        """Decorator: run the function for every job of job_type. It gets a JobContext.

        Its return value completes the job: None (with what ctx.set_output set),
        a Result, or a dict taken as the metrics. An exception fails it: a
        JobError as it says, any other for good unless it is an instance of
        one of retry_on (a tuple of exception classes; default: the Worker's
        retry_on), which fails it as retryable. An `async def` function runs
        on the worker's event loop and is awaited.
        """
        check_job_type(job_type)

        def register(fn: Handler) -> Handler:
            """Register fn as the handler of job_type and return it unchanged."""
            self.handle(job_type, fn, retry_on=retry_on)
            return fn
        return register

    def handle(self, job_type: str, fn: Handler, retry_on: Any = None) -> None:
        """Run fn for every job of job_type (the decorator's form without decoration)."""
        check_job_type(job_type)
        if not callable(fn):
            raise ConfigError("the handler of %s is not callable" % job_type)
        classes = None if retry_on is None else _retry_classes(retry_on, "retry_on of " + job_type)
        with self._mu:
            if self._started:
                raise ConfigError("handlers are added before run()")
            if job_type in self._handlers:
                raise ConfigError("job type %s has a handler already" % job_type)
            self._handlers[job_type] = _Spec(fn, _is_async(fn), classes)

    @property
    def job_types(self) -> List[str]:
        """The job types with a handler, sorted."""
        with self._mu:
            return sorted(self._handlers)

    def jobs(self) -> List[str]:
        """The ids of the jobs this worker holds now."""
        with self._mu:
            return sorted(self._jobs)

    # -- lifecycle ----------------------------------------------------------

    def drain(self) -> None:
        """Stop leasing, let running jobs finish (up to drain_timeout), then return from run()."""
        self._drain_event.set()

    def run(self, install_signal_handlers: bool = True) -> None:
        """Run until drain() or SIGTERM/SIGINT (when called from the main thread), then drain.

        Raises at once if the worker cannot register, and after stopping its
        jobs if the server refuses its credential for good (revoked, banned).
        """
        with self._mu:
            if self._started:
                raise ConfigError("Worker.run called twice")
            if not self._handlers:
                raise ConfigError("the worker has no handler")
            self._started = True
            types = sorted(self._handlers)
        reg = self.registration
        caps = dict(reg.get("capabilities") or {})
        if not caps.get("job_types"):
            caps["job_types"] = types
        reg["capabilities"] = caps
        if not _process.make_undumpable() and sys.platform.startswith("linux"):
            self.log.warning("could not mark the worker non-dumpable: a command of the same user could read "
                             "its memory, and its token")
        self._reap()
        self._setup_gpus(caps)
        if self.supported_gpu_skus is None:
            skus = [g.get("sku") for g in caps.get("gpus") or [] if isinstance(g, dict) and g.get("sku")]
            self.supported_gpu_skus = sorted(set(skus)) or None

        self._ensure_registered()

        old_handlers = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, lambda s, f: self.drain())
        loop_thread: Optional[threading.Thread] = None
        if any(h.is_async for h in self._handlers.values()):
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=self._loop.run_forever, name="nodelane-asyncio", daemon=True)
            loop_thread.start()
        if self.capture_output:
            capture.install(self.log_level)
        try:
            hb = threading.Thread(target=self._heartbeat_loop, name="nodelane-heartbeat", daemon=True)
            hb.start()
            sig: Optional[threading.Thread] = None
            if self.signals_wait:
                sig = threading.Thread(target=self._signals_loop, name="nodelane-signals", daemon=True)
                sig.start()
            threading.Thread(target=self._watchdog_loop, name="nodelane-watchdog", daemon=True).start()
            lease = threading.Thread(target=self._lease_loop, args=(types,), name="nodelane-lease", daemon=True)
            lease.start()
            self.ready.set()
            while not self._drain_event.wait(0.2):
                pass
            with self._mu:
                self._draining = True
                fatal = self._fatal
                abort = self._lease_abort
            if abort is not None:
                abort.abort()
            lease.join(self.client.timeout + self.wait_seconds)
            self._hb_kick.set()
            if fatal is not None:
                self.log.error("stopping: the server refuses this worker: %s", fatal)
                self._stop_jobs(DRAINED)
                self._wait_idle(self.drain_grace)
            else:
                self.log.info("draining %d jobs (timeout %.0fs)", len(self.jobs()), self.drain_timeout)
                if not self._wait_idle(self.drain_timeout):
                    self.log.warning("drain timeout: stopping the jobs still running: %s", self.jobs())
                    self._stop_jobs(DRAINED)
                    self._wait_idle(self.drain_grace)
            self._force_release()
            self._hard.set()
            self._wait_idle(self.drain_grace)
            self._hb_stop.set()
            self._hb_kick.set()
            with self._mu:
                sabort = self._signals_abort
            if sabort is not None:
                sabort.abort()
            hb.join(self.client.timeout * self.client.max_attempts)
            if sig is not None:
                sig.join(self.client.timeout)
            if fatal is None:
                with self._mu:
                    held = sorted(set(self._jobs) | set(self._releasing))
                    through = self._leases_through
                try:
                    self.client.heartbeat("draining", held, self._metrics(), leases_through=through)
                except NodelaneError as e:
                    self.log.warning("final heartbeat: %s", e)
        finally:
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
            if self.capture_output:
                capture.uninstall(self.log_level)
            if self._loop is not None and loop_thread is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                loop_thread.join(5)
                if not loop_thread.is_alive():
                    self._loop.close()
        if fatal is not None:
            raise fatal

    def _reap(self) -> None:
        """Kill what ctx.run processes a previous run of this worker left (running_file), before it registers."""
        if self.running_file is None:
            return
        _process.RunningFile.reap(self.running_file, self.log)
        self._running = _process.RunningFile(self.running_file)

    def _setup_gpus(self, caps: Dict[str, Any]) -> None:
        """Decide the worker's GPUs: those registration names, else those nvidia-smi lists.

        Named GPUs are the devices "0", "1", ... in their order. Without
        named GPUs, nvidia_smi runs once and its GPUs are registered; with no
        nvidia-smi on PATH (or nvidia_smi None) the worker registers none, and
        says so: it never invents one. A named nvidia_smi that is absent or
        fails is an error.
        """
        if "gpus" in caps:
            self.devices = [str(i) for i in range(len(caps.get("gpus") or []))]
        elif self.nvidia_smi is None:
            self.devices = []
            caps["gpus"] = []
        else:
            try:
                found = _gpus.discover(self.nvidia_smi)
            except _gpus.NoNvidiaSMI:
                if self.nvidia_smi != "nvidia-smi":
                    raise
                self.log.warning("no nvidia-smi on PATH and no GPUs named in registration's capabilities.gpus: "
                                 "registering no GPU (a CPU-only worker)")
                found = []
            for d in found:
                self.log.info("GPU found: index %d, %s, %s, %d MiB", d.index, d.uuid, d.name, d.memory_mb)
            caps["gpus"] = [d.gpu() for d in found]
            self.devices = [str(d.index) for d in found]
        self._pool = _gpus.GPUPool(self.devices)

    def _storage_off(self, err: APIError) -> None:
        """Log, once per worker, that the control plane stores no artifact bytes."""
        with self._mu:
            first, self._storage_off_logged = not self._storage_off_logged, True
        if first:
            self.log.warning("the control plane stores no artifact bytes (%s): uploads with a uri are reported "
                             "as metadata only", err.message or err.code)

    def _set_fatal(self, err: BaseException) -> None:
        with self._mu:
            if self._fatal is None:
                self._fatal = err
        self._drain_event.set()

    # -- registration and the token ----------------------------------------

    def _ensure_registered(self) -> None:
        """Register (a node without a token) or start (one with a token), saying it holds no job.

        A process that just started holds nothing: the control plane ends at
        once every lease it thinks this worker still holds (a previous run's),
        and records what the worker is now (its job types, GPUs, tags, limits).
        """
        if not self.identity.token:
            self._register(initial=True)
            return
        self._maybe_renew()
        self._start_call()

    def _fields(self) -> "tuple[str, Dict[str, Any]]":
        """The node id, and the register (and start) body's other fields: what this worker is now."""
        reg = dict(self.registration)
        node_id = reg.pop("node_id", None) or self.identity.node_id or socket.gethostname()
        reg.setdefault("name", node_id)
        reg.setdefault("hostname", socket.gethostname())
        reg.setdefault("role", "worker")
        reg.setdefault("version", USER_AGENT)
        limits = dict(reg.get("governor_limits") or {})
        limits.setdefault("max_jobs", self.max_jobs)
        reg["governor_limits"] = limits
        reg.pop("public_key", None)
        reg.pop("current_jobs", None)
        return node_id, reg

    def _register(self, initial: bool = False) -> None:
        """Register; initial (at run's start) says it holds no job, so the server ends a previous run's.

        A registration later on (a token that could not be renewed) lists
        nothing: the jobs held go on under their lease tokens.
        """
        if not self.provisioning_token:
            raise ConfigError("the identity has no worker token: give a provisioning_token to register")
        node_id, reg = self._fields()
        if initial:
            reg["current_jobs"] = []
        ans = self.client.register(self.provisioning_token, node_id, **reg)
        self.log.info("registered %s as %s", node_id, ans["worker_id"])
        if initial:
            self.start_answer = ans
            self._log_ended(ans.get("ended_jobs"), "a previous run of this worker held")
            with self._mu:
                self._note_server_time(ans.get("server_time"))

    def _start_call(self) -> None:
        """POST /workers/start with what this worker is now and current_jobs [] (it holds nothing yet).

        A token the server no longer takes is renewed, or the node registers
        again. A control plane older than the route (404) gets the capabilities
        with the first heartbeat instead.
        """
        _, fields = self._fields()
        renewed = False
        while True:
            used = self.identity.token
            sent = time.monotonic()
            try:
                ans = self.client.start([], **fields)
                break
            except APIError as e:
                if e.code == "token_expired" and not renewed:
                    renewed = True
                    self._renew(used)
                    continue
                if e.code in _TOKEN_DEAD and e.code != "not_found" and self.provisioning_token:
                    self.log.warning("the worker token is refused (%s): registering again", e.code)
                    self._register(initial=True)
                    return
                if e.status == 404 and e.code == "not_found":
                    self.log.warning("the control plane has no POST /workers/start (older than this SDK): "
                                     "the capabilities go with the first heartbeat, and the jobs a previous "
                                     "run held end only at their lease's expiry")
                    self._hb_capabilities = fields.get("capabilities")
                    return
                raise
        self.start_answer = ans
        self._sighted(sent, ans)
        with self._mu:
            self._note_server_time(ans.get("server_time"))
        what = "updated (receipt %s)" % ans.get("receipt_id") if ans.get("changed") else "unchanged"
        self.log.info("started as %s: registration %s", ans.get("worker_id") or self.identity.worker_id, what)
        if ans.get("status") == "pending" or ans.get("pending_job_types") or ans.get("pending_tags"):
            self.log.warning("awaiting an operator's approval: status %s, job types %s, tags %s",
                             ans.get("status"), ans.get("pending_job_types") or [], ans.get("pending_tags") or [])
        self._log_ended(ans.get("ended_jobs"), "a previous run of this worker held")

    def _log_ended(self, ended: Any, what: str) -> None:
        if ended:
            self.log.warning("the control plane ended %d jobs %s: %s", len(ended), what, ", ".join(map(str, ended)))

    def _note_server_time(self, st: Any) -> None:
        """Keep st as leases_through if it is the newest answer's time seen. Call with _mu held."""
        t = unix_seconds(st) if isinstance(st, str) else None
        if t is None:
            return
        cur = unix_seconds(self._leases_through) if self._leases_through else None
        if cur is None or t >= cur:
            self._leases_through = st

    def _sighted(self, sent: float, ans: Dict[str, Any]) -> None:
        """Take the heartbeat deadline and interval of an answer that counts as a heartbeat, sent at sent."""
        st, dl = unix_seconds(ans.get("server_time") or ""), unix_seconds(ans.get("heartbeat_deadline") or "")
        if st is not None and dl is not None and dl > st:
            window = dl - st
            with self._mu:
                self._offline_at = sent + window - min(self.lease_margin, window / 5)
        if ans.get("next_heartbeat_seconds"):
            self._hb_interval = float(ans["next_heartbeat_seconds"])

    def _maybe_renew(self) -> None:
        exp = self.identity.token_expires_at
        if exp is None:
            return
        left = exp.timestamp() - self.client.server_now()
        got = self.identity.token_received_at
        before = self.token_renew_before
        if got is not None:
            before = min(before, (exp.timestamp() - got) / 3)
        if left > before:
            return
        self._renew(self.identity.token)

    def _renew(self, used: Optional[str]) -> None:
        """Get a new token: renew the one used, or register again when it can no longer be renewed."""
        with self._renew_mu:
            if self.identity.token != used:
                return  # another thread renewed it meanwhile
            try:
                self.client.renew_token()
                self.log.info("worker token renewed")
            except APIError as e:
                if e.code in _TOKEN_DEAD and self.provisioning_token:
                    self._register()
                else:
                    raise

    # -- heartbeats ----------------------------------------------------------

    def _metrics(self) -> Optional[Dict[str, Any]]:
        if self.metrics is None:
            return None
        try:
            return object_payload(self.metrics())
        except Exception as e:  # a metrics callback must not stop heartbeats
            return {"error": "metrics: %s" % e}

    def _heartbeat_loop(self) -> None:
        failures = 0
        next_at = time.monotonic()
        while not self._hb_stop.is_set():
            now = time.monotonic()
            if now < next_at and not self._hb_kick.is_set():
                self._hb_kick.wait(min(next_at - now, 0.25))
                continue
            self._hb_kick.clear()
            if self._hb_stop.is_set():
                return
            used = self.identity.token
            interval = self.heartbeat_interval or self._hb_interval
            try:
                self._heartbeat_once()
                failures = 0
                next_at = time.monotonic() + (self.heartbeat_interval or self._hb_interval)
                try:
                    self._maybe_renew()
                except NodelaneError as e:
                    self.log.warning("token renewal failed: %s", e)
            except APIError as e:
                if e.code == "token_expired":
                    try:
                        self._renew(used)
                        continue
                    except NodelaneError as e2:
                        self._set_fatal(e2)
                        return
                if e.code in _AUTH_FATAL:
                    self._set_fatal(e)
                    return
                failures += 1
                self.log.warning("heartbeat failed (%d): %s", failures, e)
                next_at = time.monotonic() + min(interval, min(2 ** failures, 15) + 0.5)
            except (TransportError, ValueError, TypeError, KeyError, AttributeError) as e:
                failures += 1
                self.log.warning("heartbeat failed (%d): %r", failures, e)
                next_at = time.monotonic() + min(interval, min(2 ** failures, 15) + 0.5)
            next_at = min(next_at, time.monotonic() + self._lease_urgency())

    def _lease_urgency(self) -> float:
        d = 3600.0
        for ctx in self._tasks():
            if ctx.cancelled and ctx.reason != DRAINED:
                continue  # stopping: no extension helps it (a canceled lease is never extended)
            left = ctx._left()
            if left is not None:
                d = min(d, left / 3)
        return max(d, 0.1)

    def _tasks(self) -> List[JobContext]:
        with self._mu:
            return list(self._jobs.values())

    def _heartbeat_once(self) -> None:
        with self._mu:
            # one snapshot of the jobs held and of the newest lease answer processed: a job granted
            # after leases_through is never ended for being missing from current_jobs
            listed = dict(self._jobs)
            held = sorted(set(listed) | set(self._releasing))
            through = self._leases_through
            caps = self._hb_capabilities
            status = "draining" if self._draining else ("busy" if listed else "idle")
        sent = time.monotonic()
        ans = self.client.heartbeat(status, held, self._metrics(), capabilities=caps, leases_through=through)
        if caps is not None:
            self._hb_capabilities = None
        self._sighted(sent, ans)
        for lease in ans.get("leases") or []:
            ctx = listed.get(lease.get("job_id"))
            if ctx is not None:
                ctx._extend(lease.get("expires_at"))
        self._apply_signals(ans, listed)
        ended = ans.get("ended_jobs") or []
        self._log_ended(ended, "this worker did not list")
        for jid in ended:
            if jid in listed:
                listed[jid]._lose()

    def _apply_signals(self, ans: Dict[str, Any], listed: Dict[str, JobContext]) -> None:
        """Act on the lost_jobs, cancel_jobs and drain of a heartbeat's or a signals answer."""
        for jid in ans.get("lost_jobs") or []:
            if jid in listed:
                listed[jid]._lose()
        for jid in ans.get("cancel_jobs") or []:
            if jid in listed:
                listed[jid]._cancel()
        drain = ans.get("drain")
        if isinstance(drain, bool):
            with self._mu:
                was, self._drain_requested = self._drain_requested, drain
            if drain and not was:
                self.log.warning("the operator asked this worker to drain")
                self.drain()
            elif was and not drain:
                self.log.info("the operator's drain request was withdrawn (this run drains on)")

    # -- signals: the control long-poll --------------------------------------

    def _signals_loop(self) -> None:
        """Keep POST /workers/signals open until the worker stops, so cancels, losses and drains arrive in seconds."""
        failures = 0
        while not self._hb_stop.is_set():
            abort = Abort()
            with self._mu:
                listed = {j: c for j, c in self._jobs.items() if not c.lost}
                known = sorted(j for j, c in listed.items() if c._cancel_seen)
                draining = self._drain_requested
                self._signals_abort = abort
                self._signals_jobs = set(listed)
                self._signals_restart = False
            if self._hb_stop.is_set():
                return
            used = self.identity.token
            t0 = time.monotonic()
            try:
                ans = self.client.signals(int(self.signals_wait or DEFAULT_SIGNALS_WAIT), sorted(listed), known,
                                          draining, abort=abort)
                failures = 0
            except APIError as e:
                if self._hb_stop.is_set():
                    return
                if self._signals_restarted(abort):
                    continue
                if e.code == "token_expired":
                    try:
                        self._renew(used)
                        continue
                    except NodelaneError as e2:
                        self._set_fatal(e2)
                        return
                if e.code in _AUTH_FATAL:
                    self._set_fatal(e)
                    return
                if e.status == 404 and e.code == "not_found":
                    self.log.warning("the control plane has no POST /workers/signals: cancels and drains "
                                     "arrive with heartbeats")
                    return
                failures += 1
                self.log.warning("signals failed (%d): %s", failures, e)
                self._hb_stop.wait(min(2 ** failures, 30) * (0.5 + random.random() / 2))
                continue
            except (TransportError, ValueError, TypeError, KeyError, AttributeError) as e:
                if self._hb_stop.is_set():
                    return
                if self._signals_restarted(abort):
                    continue
                failures += 1
                self.log.warning("signals failed (%d): %r", failures, e)
                self._hb_stop.wait(min(2 ** failures, 30) * (0.5 + random.random() / 2))
                continue
            finally:
                with self._mu:
                    if self._signals_abort is abort:
                        self._signals_abort = None
            self._apply_signals(ans, listed)
            if time.monotonic() - t0 < 0.5 and not self._signals_restarted(abort):
                self._hb_stop.wait(0.25)  # an answer at once: never a busy loop

    def _signals_restarted(self, abort: Abort) -> bool:
        """Whether the long-poll of abort was cut to watch new jobs (not a failure)."""
        with self._mu:
            return abort.aborted and self._signals_restart

    def _watch_new_jobs(self) -> None:
        """Cut the open long-poll if it does not watch every job held, so that the next one does."""
        with self._mu:
            abort = self._signals_abort
            if abort is None or set(self._jobs) <= self._signals_jobs:
                return
            self._signals_restart = True
        abort.abort()

    def _watchdog_loop(self) -> None:
        """Check the watchdogs four times a second, apart from heartbeats that may be slow, until stopped."""
        while not self._hb_stop.wait(0.25):
            self._watchdogs()

    def _watchdogs(self) -> None:
        """Stop the jobs whose lease runs out unextended, and all jobs once the worker is offline."""
        with self._mu:
            offline = self._offline_at is not None and time.monotonic() >= self._offline_at
        for ctx in self._tasks():
            if ctx.cancelled:
                continue
            if offline:
                self.log.warning("no heartbeat got through before the deadline: stopping job %s", ctx.job_id)
                ctx._stop(OFFLINE)
                continue
            left = ctx._left()
            if left is not None and left <= 0:
                self.log.warning("lease about to expire without renewal: stopping job %s", ctx.job_id)
                ctx._stop(LEASE_EXPIRING)

    # -- leasing -------------------------------------------------------------

    def _free_slots(self) -> int:
        with self._mu:
            return self.max_jobs - len(self._jobs)

    def _lease_loop(self, types: List[str]) -> None:
        failures = 0
        while not self._drain_event.is_set():
            free = self._free_slots()
            if free <= 0:
                self._slot.wait(0.5)
                self._slot.clear()
                continue
            abort = Abort()
            with self._mu:
                if self._draining:
                    return
                self._lease_abort = abort
            start, used = time.monotonic(), self.identity.token
            try:
                ans = self.client.lease(self.wait_seconds, max_jobs=min(free, 32), supported_job_types=types,
                                        supported_gpu_skus=self.supported_gpu_skus, accept=True, abort=abort)
                failures = 0
            except (NodelaneError, ValueError, TypeError, KeyError, AttributeError) as e:
                if self._drain_event.is_set():
                    return
                if isinstance(e, APIError) and e.code == "token_expired":
                    try:
                        self._renew(used)
                        continue
                    except NodelaneError as e2:
                        self._set_fatal(e2)
                        return
                if isinstance(e, APIError) and e.code in _AUTH_FATAL:
                    self._set_fatal(e)
                    return
                failures += 1
                self.log.warning("lease failed (%d): %s", failures, e)
                self._drain_event.wait(min(2 ** failures, 30) + 1)
                continue
            finally:
                with self._mu:
                    self._lease_abort = None
            self._start(ans.get("leases") or [], ans.get("server_time"))
            if not ans.get("leases") and time.monotonic() - start < self.wait_seconds / 2:
                self._drain_event.wait(self.idle_poll)

    def _start(self, grants: List[Dict[str, Any]], server_time: Optional[str]) -> None:
        """Take in one lease answer: its grants join the jobs held, and its server_time becomes
        leases_through, in one step under the lock (a heartbeat sees both or neither)."""
        run: List["tuple[JobContext, _Spec, Dict[str, Any]]"] = []
        refuse: List["tuple[Dict[str, Any], str]"] = []
        with self._mu:
            for grant in grants:
                job = grant.get("job") or {}
                jid = job.get("id")
                if not isinstance(jid, str) or not jid or not grant.get("lease_token"):
                    self.log.error("a grant without a job id or lease token: ignored")
                    continue
                if jid in self._jobs or jid in self._releasing:
                    self.log.error("the server leased job %s that this worker holds already", jid)
                    continue
                h = self._handlers.get(job.get("job_type"))
                if self._draining:
                    refuse.append((grant, "drain"))
                elif h is None:
                    refuse.append((grant, "no handler for job type %s" % job.get("job_type")))
                else:
                    ctx = JobContext(self, grant)
                    self._jobs[jid] = ctx
                    run.append((ctx, h, grant))
                    continue
                self._releasing[jid] = grant  # held until its release is answered
            self._note_server_time(server_time)
            self._changed.notify_all()
        for grant, reason in refuse:
            job = grant["job"]
            try:
                self.client.release(job["id"], grant["lease_token"], reason)
            except NodelaneError as e:
                self.log.warning("releasing job %s not run (%s): %s", job.get("id"), reason, e)
            with self._mu:
                self._releasing.pop(job["id"], None)
                self._changed.notify_all()
            self._ended(JobEnd(job, "released"))
        for ctx, h, grant in run:
            self._launch(ctx, h, grant)
        if run:
            self._watch_new_jobs()

    def _launch(self, ctx: JobContext, h: _Spec, grant: Dict[str, Any]) -> None:
        job = ctx.job
        deadline = grant.get("expires_at")
        if job.get("state") != "running" and grant.get("accept_by"):
            exp, by = unix_seconds(deadline or ""), unix_seconds(grant["accept_by"])
            if exp is None or (by is not None and by < exp):
                deadline = grant["accept_by"]
        ctx._extend(deadline)
        threading.Thread(target=self._run_job, args=(ctx, h), name="nodelane-job-" + ctx.job_id,
                         daemon=True).start()

    def _remove(self, ctx: JobContext) -> None:
        with self._mu:
            if self._jobs.get(ctx.job_id) is ctx:
                del self._jobs[ctx.job_id]
                self._changed.notify_all()
        self._slot.set()

    def _wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._mu:
            while self._jobs:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _stop_jobs(self, reason: str) -> None:
        for ctx in self._tasks():
            ctx._stop(reason)

    def _force_release(self) -> None:
        """Release the jobs whose handlers did not return in time; their threads report nothing."""
        for ctx in self._tasks():
            if not ctx._claim():
                continue  # reporting its own end
            ctx._stop(DRAINED)
            end = JobEnd(ctx.job, "released", Cancelled(DRAINED))
            try:
                self.client.release(ctx.job_id, ctx.lease_token, "drain")
            except LeaseLost:
                pass
            except NodelaneError as e:
                self.log.warning("releasing job %s at drain: %s", ctx.job_id, e)
                end.outcome, end.error = "abandoned", e
            self._remove(ctx)
            self._ended(end)

    def _ended(self, end: JobEnd) -> None:
        self.log.info("job %s (%s) ended: %s", end.job.get("id"), end.job.get("job_type"), end.outcome)
        if self.on_job_end is not None:
            try:
                self.on_job_end(end)
            except Exception:
                self.log.exception("on_job_end")

    # -- one job -------------------------------------------------------------

    def _persist(self, ctx: JobContext, what: str, settled_by_409: bool,
                 fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        """Call fn until it succeeds, fails for good, the lease is lost or runs out, or the worker stops.

        With settled_by_409 (fail, release), a 409 after an attempt that went
        unanswered means that attempt did the work.
        """
        start = time.monotonic()
        unanswered = False
        renewals = 0
        attempt = 0
        while True:
            attempt += 1
            used = self.identity.token
            try:
                return fn()
            except APIError as e:
                if settled_by_409 and (unanswered or e.unanswered) and e.code in ("lease_lost", "invalid_transition"):
                    self.log.info("an earlier unanswered %s of job %s did it", what, ctx.job_id)
                    return {}
                if isinstance(e, LeaseLost):
                    ctx._lose()
                    raise
                if e.code == "token_expired" and renewals < 2:
                    renewals += 1
                    try:
                        self._renew(used)
                        continue
                    except NodelaneError:
                        pass
                if not e.temporary or ctx.lost or self._hard.is_set():
                    raise
                unanswered = unanswered or e.unanswered
                err: NodelaneError = e
            except TransportError as e:
                if ctx.lost or self._hard.is_set():
                    raise
                unanswered = True
                err = e
            d = min(2 ** attempt, 15) + 0.2
            now = time.monotonic()
            if now + d > ctx._deadline() or now + d > start + self.report_patience:
                raise err
            self.log.warning("retrying %s of job %s in %.1fs: %s", what, ctx.job_id, d, err)
            if self._hard.wait(d):
                raise err

    def _run_job(self, ctx: JobContext, handler: _Spec) -> None:
        end = JobEnd(ctx.job, "")
        try:
            self._run_job_inner(ctx, handler, end)
        finally:
            ctx.cancel_event.set()
            ctx._release_gpus()
            ctx._cleanup()
            self._remove(ctx)
            if end.outcome:
                self._ended(end)

    def _run_job_inner(self, ctx: JobContext, handler: _Spec, end: JobEnd) -> None:
        if ctx.job.get("state") != "running":
            try:
                acc = self._persist(ctx, "accept", False,
                                    lambda: self.client.accept(ctx.job_id, ctx.lease_token))
            except NodelaneError as e:
                if not ctx._claim():
                    return
                end.outcome, end.error = "lost", e
                if not isinstance(e, LeaseLost) and getattr(e, "code", "") != "invalid_transition":
                    try:  # not ours to run (blocked by the envelope, or out of reach): hand it back
                        self.client.release(ctx.job_id, ctx.lease_token, "not accepted: %s" % getattr(e, "code", ""))
                        end.outcome = "released"
                    except NodelaneError:
                        pass
                return
            if acc.get("job"):
                ctx.job = acc["job"]
                end.job = ctx.job
            ctx._extend(acc.get("expires_at"))
        if ctx.job.get("cancel_requested"):
            ctx._cancel()
        with self._mu:
            draining = self._draining
        if draining:
            ctx._stop(DRAINED)  # leased just before the drain: hand it back unstarted
        ctx._seq_base = int(self.client.server_now() * 1_000_000)

        stop_flusher = threading.Event()
        flusher = threading.Thread(target=ctx._flush_loop, args=(stop_flusher,), daemon=True,
                                   name="nodelane-logs-" + ctx.job_id)
        flusher.start()
        result: Any = None
        herr: Optional[BaseException] = None
        if ctx.cancelled:
            herr = Cancelled(ctx.reason or CANCELED)
        else:
            try:
                ctx._fetch_resume()
                result = _invoke(ctx, handler.fn, handler.is_async, self._loop)
            except Exception as e:  # the handler's failure is the job's
                herr = e
                if not isinstance(e, (Cancelled, JobError)):
                    self.log.warning("handler of job %s raised %s: %s", ctx.job_id, type(e).__name__, e)
                if not isinstance(e, Cancelled):
                    _log_exception(ctx, e)
            ctx._wait_uploads()  # an upload the handler started in another thread is part of the job
            ctx._output_dropped()
        stop_flusher.set()
        ctx._kick.set()
        flusher.join()

        if not ctx._claim():
            return  # the drain released it
        end.error = herr
        reason = ctx.reason
        if ctx.lost:
            end.outcome = "lost"
            return
        if reason in (LEASE_EXPIRING, OFFLINE) and herr is not None:
            end.outcome = "lost"
            try:
                self.client.release(ctx.job_id, ctx.lease_token, "lease could not be renewed"
                                    if reason == LEASE_EXPIRING else "no heartbeat got through before the deadline")
            except NodelaneError:
                pass
            return
        try:
            self._persist(ctx, "logs", False, lambda: ctx.flush() or {})
        except NodelaneError as e:
            if ctx.lost:
                end.outcome, end.error = "lost", e
                return
            self.log.warning("log lines of job %s not delivered: %s", ctx.job_id, e)

        if herr is None:
            out = ctx._output
            if isinstance(result, Result):
                out = result
            elif isinstance(result, dict):
                out = Result(ctx._output.output_uri, result, ctx._output.final_message)
            elif result is not None:
                out = Result(ctx._output.output_uri, {"value": result}, ctx._output.final_message)
            try:
                end.answer = self._persist(ctx, "complete", False, lambda: self.client.complete(
                    ctx.job_id, ctx.lease_token, output_uri=out.output_uri, metrics=object_payload(out.metrics),
                    final_message=out.final_message, wait_for_proofs=self.wait_for_proofs))
                end.outcome = "succeeded"
            except NodelaneError as e:
                end.error = e
                if isinstance(e, APIError) and e.code == "job_canceled":
                    end.outcome = "canceled"  # its cancel was requested: the server ended it canceled
                else:
                    end.outcome = "lost" if ctx.lost else "abandoned"
            return
        if reason == DRAINED:
            try:
                self._persist(ctx, "release", True,
                              lambda: self.client.release(ctx.job_id, ctx.lease_token, "drain"))
                end.outcome = "released"
            except NodelaneError as e:
                end.outcome, end.error = ("lost" if ctx.lost else "abandoned"), e
            return
        retry_on = self.retry_on if handler.retry_on is None else handler.retry_on
        code, retryable, message, payload = _failure(ctx, herr, retry_on)
        end.outcome = "failed"
        if reason == CANCELED:
            code, retryable, payload = "canceled", False, None
            message = "%s: %s" % (type(herr).__name__, herr)
            end.outcome = "canceled"
        try:
            end.answer = self._persist(ctx, "fail", True, lambda: self.client.fail(
                ctx.job_id, ctx.lease_token, code, message, retryable, payload))
        except NodelaneError as e:
            end.outcome, end.error = ("lost" if ctx.lost else "abandoned"), e
