"""Run a handler without a control plane, for a handler's own unit tests.

    from nodelane.testing import run_local

    def test_train():
        run = run_local(train, {"epochs": 2})
        assert run.outcome == "succeeded", run.message
        assert run.metrics["loss"] < 1
        assert [p["fraction"] for p in run.progress] == [0.5, 1.0]
        assert any("epoch 2" in line["message"] for line in run.logs)

run_local calls the handler as a Worker does (an `async def` one awaited on
an event loop, print and logging output captured, a traceback logged, the
same rules for a result and for an exception) with a context that records
what the handler reports instead of sending it: status events and progress,
log lines, artifacts and uploads (with the file's SHA-256 and size).
ctx.run runs its command for real, with the GPUs given to run_local as
its devices.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import capture
from . import gpus as _gpus
from .errors import Cancelled, ConfigError
from .worker import (CANCELED, DEFAULT_KILL_GRACE, DEFAULT_LEASE_MARGIN, DEFAULT_LOG_BATCH_SIZE,
                     DEFAULT_MAX_BUFFERED_LOGS, MAX_LOG_MESSAGE, MAX_MESSAGE_BYTES, MAX_NAME_BYTES, JobContext,
                     Result, _cut, _failure, _invoke, _is_async, _log_exception, _retry_classes, _safe,
                     object_payload)

_log = logging.getLogger("nodelane.testing")


@dataclass
class LocalRun:
    """What run_local saw of one run of a handler.

    outcome is "succeeded", "failed" or "canceled". For a success, result is
    what the job would complete with (a Result) and metrics its metrics; for
    a failure, error is the exception and code, retryable and message the
    fail report a Worker would send.
    """

    outcome: str = ""
    result: Optional[Result] = None
    error: Optional[BaseException] = None
    code: str = ""
    retryable: bool = False
    message: str = ""
    #: Log lines, in order: {"message": ..., "payload": ...}.
    logs: List[Dict[str, Any]] = field(default_factory=list)
    #: Status events, in order: {"event_type", "message", "payload"}.
    events: List[Dict[str, Any]] = field(default_factory=list)
    #: Artifacts reported or uploaded, in order: {"kind", "name", "uri", "sha256", "size_bytes", "metadata",
    #: "stored", "path"}.
    artifacts: List[Dict[str, Any]] = field(default_factory=list)
    #: The GPUs the job took (ctx.gpus).
    gpus: List[str] = field(default_factory=list)

    @property
    def metrics(self) -> Optional[Dict[str, Any]]:
        """The completion's metrics, or None."""
        return self.result.metrics if self.result is not None else None

    @property
    def progress(self) -> List[Dict[str, Any]]:
        """The progress events: {"fraction", "message", "metrics"} each (absent ones None)."""
        out = []
        for e in self.events:
            if e["event_type"] == "progress":
                p = e["payload"] or {}
                out.append({"fraction": p.get("fraction"), "message": e["message"], "metrics": p.get("metrics")})
        return out


class _Runtime:
    """What a JobContext takes of its worker, for run_local: settings and GPUs, no client."""

    def __init__(self, scratch_dir: Optional[str], devices: Sequence[str], kill_grace: float):
        self.client = None
        self.scratch_dir = scratch_dir
        self.kill_grace = kill_grace
        self.devices = list(devices)
        self._pool = _gpus.GPUPool(self.devices)
        self._running = None
        self.log = _log
        self.lease_margin = DEFAULT_LEASE_MARGIN
        self.max_buffered_logs = DEFAULT_MAX_BUFFERED_LOGS
        self.log_batch_size = DEFAULT_LOG_BATCH_SIZE
        self.log_flush_interval = 1.0
        self.report_patience = 60.0
        self.upload_part_attempts = 1

    def _storage_off(self, err: Any) -> None:
        pass


class LocalContext(JobContext):
    """A JobContext that records what the handler reports into a LocalRun instead of sending it."""

    def __init__(self, runtime: _Runtime, job: Dict[str, Any], run: LocalRun):
        super().__init__(runtime, {"job": job, "lease_token": "local"})  # type: ignore[arg-type]
        self._run = run
        self._rec = threading.Lock()

    def cancel(self, reason: str = CANCELED) -> None:
        """Stop the job as an operator's cancel (or reason) would: ctx.cancelled turns true."""
        self._stop(reason)

    def status(self, event_type: str, message: str = "", payload: Any = None) -> Dict[str, Any]:
        """Record a status event (JobContext.status)."""
        if not isinstance(event_type, str) or not event_type or len(event_type.encode("utf-8")) > MAX_NAME_BYTES:
            raise ConfigError("event_type is 1 to %d bytes" % MAX_NAME_BYTES)
        if not isinstance(message, str):
            raise ConfigError("message is a string")
        e = {"event_type": event_type, "message": _cut(message, MAX_MESSAGE_BYTES - 32),
             "payload": object_payload(payload)}
        with self._rec:
            self._run.events.append(e)
        return {"ok": True}

    def log(self, message: str, payload: Any = None) -> None:
        """Record a log line (JobContext.log), cut as the worker cuts it."""
        if not isinstance(message, str):
            message = str(message)
        with self._rec:
            self._run.logs.append({"message": _cut(message, MAX_LOG_MESSAGE), "payload": object_payload(payload)})

    def flush(self) -> None:
        """Nothing to send."""

    def artifact(self, artifact_type: str, name: str, uri: str, path: Optional[str] = None,
                 checksum_sha256: Optional[str] = None, size_bytes: Optional[int] = None,
                 metadata: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Record an artifact reported as metadata (JobContext.artifact)."""
        for f, v in (("artifact_type", artifact_type), ("name", name), ("uri", uri)):
            if not isinstance(v, str) or not v:
                raise ConfigError("%s is a non-empty string" % f)
        if path is not None:
            checksum_sha256, size_bytes = _digest(path)
        return self._record(kind=artifact_type, name=name, uri=uri, sha256=checksum_sha256, size_bytes=size_bytes,
                            metadata=object_payload(metadata), stored=False, path=path)

    def upload(self, path: str, name: Optional[str] = None, kind: str = "file",
               metadata: Optional[Dict[str, Any]] = None, uri: Optional[str] = None) -> Dict[str, Any]:
        """Record an upload (JobContext.upload): the file's SHA-256 and size, read now."""
        self.check()
        sha, size = _digest(path)
        return self._record(kind=kind, name=name or os.path.basename(path), uri=uri, sha256=sha, size_bytes=size,
                            metadata=object_payload(metadata), stored=True, path=path)

    def _record(self, **a: Any) -> Dict[str, Any]:
        with self._rec:
            self._run.artifacts.append(a)
            n = len(self._run.artifacts)
        return {"artifact_id": "local-artifact-%d" % n, "receipt_id": "", "stored": a["stored"]}


def _digest(path: str) -> "tuple[str, int]":
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def run_local(handler: Callable[[JobContext], Any], payload: Optional[Dict[str, Any]] = None, *,
              job_type: str = "local", attempt: int = 1, requirements: Optional[Dict[str, Any]] = None,
              gpus: Sequence[str] = (), resume_from: Optional[str] = None, scratch_dir: Optional[str] = None,
              retry_on: Any = (), kill_grace: float = DEFAULT_KILL_GRACE, capture_output: bool = True,
              log_level: int = logging.INFO, cancel_after: Optional[float] = None) -> LocalRun:
    """Run handler once on payload, as a Worker would, with no control plane; return what it reported.

    job_type, attempt and requirements are the job's; gpus are the devices
    ("0", "1", ...) ctx.gpus and ctx.run hand out (none by default);
    resume_from is the path ctx.resume_from gives. scratch_dir is where
    ctx.scratch_dir is made (a temporary directory, removed at the end, by
    default; one given is kept, for looking at what the handler wrote).
    retry_on is as the Worker's. cancel_after, in seconds, cancels the job
    that long after the handler starts, as an operator's cancel would.
    """
    classes = _retry_classes(retry_on, "retry_on")
    if not isinstance(attempt, int) or attempt < 1:
        raise ConfigError("attempt is 1 or more")
    job = {"id": "local-%s" % os.urandom(6).hex(), "job_type": job_type, "payload": payload, "attempt": attempt,
           "state": "running", "requirements": requirements or {}}
    run = LocalRun()
    tmp = None
    if scratch_dir is None:
        tmp = scratch_dir = tempfile.mkdtemp(prefix="nodelane-local-%s-" % _safe(job_type))
    ctx = LocalContext(_Runtime(scratch_dir, gpus, kill_grace), job, run)
    ctx.resume_from = resume_from
    loop: Optional[asyncio.AbstractEventLoop] = None
    loop_thread: Optional[threading.Thread] = None
    is_async = _is_async(handler)
    if is_async:
        loop = asyncio.new_event_loop()
        loop_thread = threading.Thread(target=loop.run_forever, name="nodelane-local-asyncio", daemon=True)
        loop_thread.start()
    timer = threading.Timer(cancel_after, ctx.cancel) if cancel_after is not None else None
    if capture_output:
        capture.install(log_level)
    try:
        if timer is not None:
            timer.start()
        try:
            result = _invoke(ctx, handler, is_async, loop)
        except Exception as e:
            run.error = e
            if not isinstance(e, Cancelled):
                _log_exception(ctx, e)
        ctx._wait_uploads()
        ctx._output_dropped()
        run.gpus = list(ctx._devices or [])
    finally:
        if timer is not None:
            timer.cancel()
        if capture_output:
            capture.uninstall(log_level)
        if loop is not None and loop_thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            loop_thread.join(5)
            loop.close()
        ctx.cancel_event.set()
        ctx._release_gpus()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if run.error is None:
        run.outcome = "succeeded"
        out = ctx._output
        if isinstance(result, Result):
            out = result
        elif isinstance(result, dict):
            out = Result(out.output_uri, result, out.final_message)
        elif result is not None:
            out = Result(out.output_uri, {"value": result}, out.final_message)
        run.result = out
    elif ctx.reason == CANCELED:
        run.outcome, run.code, run.retryable = "canceled", "canceled", False
        run.message = "%s: %s" % (type(run.error).__name__, run.error)
    else:
        run.outcome = "failed"
        run.code, run.retryable, run.message, _ = _failure(ctx, run.error, classes)
    return run
