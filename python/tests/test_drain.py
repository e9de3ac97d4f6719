"""Drain on SIGTERM, with the worker as a separate process."""

from __future__ import annotations

import signal
import time

from helpers import ScriptWorker, job_state, unique


def test_sigterm_lets_the_running_job_finish(server, operator, tmp_path):
    jt = unique("drain")
    wp = ScriptWorker(server, tmp_path, "drain_worker.py", jt, "3", "20")
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
    wp = ScriptWorker(server, tmp_path, "drain_worker.py", jt, "600", "1")
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
