"""Helpers of the tests: a Worker running in a thread, a worker script in a process of its own, waiting
for a condition, unique names."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

import nodelane


def unique(prefix: str) -> str:
    """A job type or node id no other test uses."""
    return "%s_%s" % (prefix, os.urandom(4).hex())


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll cond until it returns a true value; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.1)


def sequenced_receipt(op: nodelane.Operator, receipt_id: str, timeout: float = 30.0) -> Dict[str, Any]:
    """GET /operator/receipts/{id} once the receipt has its proof and checkpoint:
    the sequencer signs them in the background, after the request that minted it."""
    def answer() -> Any:
        r = op.receipt(receipt_id)
        return r if r.get("proof") and r.get("checkpoint") else None
    return wait_for(answer, timeout, "receipt %s to be sequenced" % receipt_id)


def gone(pid: int) -> bool:
    """Whether pid runs no more: no such process, or a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return True
    return st[st.rindex(")") + 2] in "ZX"


def parent_of(pid: int) -> int:
    """The parent pid of a running process."""
    with open("/proc/%d/stat" % pid) as f:
        st = f.read()
    return int(st[st.rindex(")") + 2:].split()[1])


def job_state(op: nodelane.Operator, job_id: str) -> str:
    """The job's state as the operator sees it."""
    return op.job(job_id)["job"]["state"]


def new_worker(server: Any, node_prefix: str = "py", url: str = "", **kw: Any) -> nodelane.Worker:
    """A Worker of the test server (or of url, a proxy in front of it), quick to heartbeat, poll and flush."""
    node = unique(node_prefix)
    opts: Dict[str, Any] = dict(provisioning_token=server.provisioning_token, wait_seconds=2,
                                heartbeat_interval=0.5, log_flush_interval=0.2, drain_timeout=10, timeout=10,
                                registration={"node_id": node, "capabilities": {
                                    "gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}})
    opts.update(kw)
    return nodelane.Worker(url or server.url, **opts)


@contextlib.contextmanager
def running(worker: nodelane.Worker) -> Iterator[List[nodelane.JobEnd]]:
    """Run worker in a thread; yield the list its job ends are appended to; drain it at exit."""
    ends: List[nodelane.JobEnd] = []
    prev = worker.on_job_end
    worker.on_job_end = lambda e: (ends.append(e), prev and prev(e))
    errors: List[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as e:  # surfaced below
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_for(lambda: worker.ready.is_set() or errors, 30, "registration")
        if errors:
            raise errors[0]
        yield ends
    finally:
        worker.drain()
        t.join(60)
        assert not t.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


class ScriptWorker:
    """python3 SCRIPT SERVER_URL TOKEN_FILE ARGS… in a process of its own (a worker script of this
    directory that prints one JSON object a line, each with an "event"), those lines in a queue. The
    provisioning token goes in a 0600 file, never on the command line."""

    def __init__(self, server: Any, tmp_path: Any, script: str, *args: str, expect_timeout: float = 30):
        tok = tmp_path / "provisioning-token"
        tok.write_text(server.provisioning_token)
        tok.chmod(0o600)
        here = os.path.dirname(os.path.abspath(__file__))
        self.expect_timeout = expect_timeout
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(here, script), server.url, str(tok)] + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def expect(self, event: str, timeout: float = 0) -> Dict[str, Any]:
        """The next line whose event is event (earlier ones are dropped), within timeout seconds
        (expect_timeout when 0)."""
        timeout = timeout or self.expect_timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %s event within %.0fs; stderr: %s" % (event, timeout, self.stderr()))
            if e["event"] == event:
                return e

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is not gone within 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
