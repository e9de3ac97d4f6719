"""Drain on SIGTERM, with the worker as a separate process."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict

from helpers import job_state, unique

HERE = os.path.dirname(os.path.abspath(__file__))


class WorkerProcess:
    def __init__(self, server: Any, tmp_path: Any, job_type: str, job_seconds: float, drain_timeout: float):
        tok = tmp_path / "provisioning-token"
        tok.write_text(server.provisioning_token)
        tok.chmod(0o600)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "drain_worker.py"), server.url, str(tok), job_type,
             str(job_seconds), str(drain_timeout)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def expect(self, event: str, timeout: float = 30) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %s event; stderr: %s" % (event, self.stderr()))
            if e["event"] == event:
                return e

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_sigterm_lets_the_running_job_finish(server, operator, tmp_path):
    jt = unique("drain")
    wp = WorkerProcess(server, tmp_path, jt, job_seconds=3, drain_timeout=20)
    try:
        wp.expect("running")
        jid = operator.dispatch(jt, {})["job"]["id"]
        assert wp.expect("started")["job"] == jid
        t0 = time.monotonic()
        wp.proc.send_signal(signal.SIGTERM)
        # a job dispatched while the worker drains is not leased by it
        later = operator.dispatch(jt, {})["job"]["id"]
        end = wp.expect("ended")
        assert (end["job"], end["outcome"]) == (jid, "succeeded")
        wp.expect("exited")
        assert wp.proc.wait(timeout=30) == 0, wp.stderr()
        assert time.monotonic() - t0 < 15
        assert job_state(operator, jid) == "succeeded"
        assert operator.job(jid)["result"]["metrics"] == {"worked": 3.0}
        time.sleep(2)
        job = operator.job(later)["job"]
        assert job["state"] == "queued" and job["attempt"] == 1 and job["leased_at"] is None, job
    finally:
        wp.kill()


def test_drain_timeout_cancels_and_releases(server, operator, tmp_path):
    jt = unique("drain_timeout")
    wp = WorkerProcess(server, tmp_path, jt, job_seconds=600, drain_timeout=1)
    try:
        wp.expect("running")
        jid = operator.dispatch(jt, {})["job"]["id"]
        assert wp.expect("started")["job"] == jid
        t0 = time.monotonic()
        wp.proc.send_signal(signal.SIGTERM)
        end = wp.expect("ended")
        assert (end["job"], end["outcome"]) == (jid, "released")
        assert wp.proc.wait(timeout=30) == 0, wp.stderr()
        assert time.monotonic() - t0 < 10
        job = operator.job(jid)["job"]
        assert job["state"] == "queued" and job["attempt"] == 1, job  # a release uses no attempt
    finally:
        wp.kill()
