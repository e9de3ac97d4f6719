"""Helpers of the tests: a Worker running in a thread, waiting for a condition, unique names."""

from __future__ import annotations

import contextlib
import os
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
