"""How a handler runs, against the real server: async handlers on the worker's event loop, a coroutine
returned by mistake, tracebacks and print/logging output in the job's logs, retry_on."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Dict, List

import nodelane
from nodelane import Cancelled, JobContext

from helpers import new_worker, running, unique, wait_for


def job_logs(operator: nodelane.Operator, jid: str) -> List[Dict[str, Any]]:
    """The job's log events, in order."""
    return [e for e in operator.job(jid)["events"] if e["kind"] == "log"]


def test_an_async_handler_is_awaited_and_completes(server, operator):
    jt = unique("async")
    w = new_worker(server)
    loops = set()

    @w.job(jt)
    async def train(ctx: JobContext) -> Dict[str, Any]:
        loops.add(id(asyncio.get_running_loop()))
        for step in range(3):
            await ctx.asleep(0.01)
            await ctx.aprogress((step + 1) / 3, "step %d" % (step + 1), {"step": step + 1})
        return {"steps": 3}

    with running(w) as ends:
        jids = [operator.dispatch(jt, {})["job"]["id"] for _ in range(2)]
        wait_for(lambda: len(ends) == 2, 30, "both jobs to end")
    assert [e.outcome for e in ends] == ["succeeded", "succeeded"], [e.error for e in ends]
    assert len(loops) == 1  # one event loop per worker
    for jid in jids:
        jv = operator.job(jid)
        assert jv["job"]["state"] == "succeeded" and jv["result"]["metrics"] == {"steps": 3}
        fractions = [e["payload"]["fraction"] for e in jv["events"] if e.get("event_type") == "progress"]
        assert fractions == [1 / 3, 2 / 3, 1.0]


def test_a_sync_handler_returning_a_coroutine_fails_the_job(server, operator):
    jt = unique("coro")
    w = new_worker(server)
    ran = threading.Event()

    async def work(ctx: JobContext) -> None:
        ran.set()

    w.handle(jt, lambda ctx: work(ctx))  # a plain function: the coroutine is never awaited

    with running(w) as ends:
        jid = operator.dispatch(jt, {}, max_attempts=3)["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "failed" and ends[0].answer["requeued"] is False
    job = operator.job(jid)["job"]
    assert job["state"] == "failed", job
    assert job["last_error"]["code"] == "handler_returned_coroutine"
    assert "async def" in job["last_error"]["message"]
    assert not ran.is_set()


def test_a_plain_exception_fails_once_with_its_traceback(server, operator):
    jt = unique("valueerror")
    w = new_worker(server)
    calls: List[int] = []

    def parse_config(payload: Dict[str, Any]) -> int:
        raise ValueError("lr must be positive, got %r" % payload["lr"])

    @w.job(jt)
    def train(ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        parse_config(ctx.payload)

    with running(w) as ends:
        jid = operator.dispatch(jt, {"lr": -1}, max_attempts=3)["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "failed" and ends[0].answer["requeued"] is False
    job = operator.job(jid)["job"]
    assert job["state"] == "failed" and job["attempt"] == 1 and calls == [1], job
    msg = job["last_error"]["message"]
    assert job["last_error"]["code"] == "handler_error"
    assert msg.startswith("ValueError: lr must be positive, got -1\n"), msg
    assert "Traceback (most recent call last)" in msg and "in parse_config" in msg
    tb = [e for e in job_logs(operator, jid) if (e.get("payload") or {}).get("exception") == "ValueError"]
    assert len(tb) == 1, job_logs(operator, jid)
    assert "in parse_config" in tb[0]["message"] and tb[0]["message"].endswith("ValueError: lr must be positive, got -1")
    assert tb[0]["payload"]["level"] == "ERROR"


def test_retry_on_makes_an_exception_retryable(server, operator):
    jt = unique("retry_on")
    w = new_worker(server, retry_on=(ConnectionError,))

    @w.job(jt)
    def fetch(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ConnectionResetError("the dataset mirror hung up")
        return None

    with running(w) as ends:
        jid = operator.dispatch(jt, {}, max_attempts=3)["job"]["id"]
        wait_for(lambda: len(ends) == 2, 30, "two attempts")
    assert [e.outcome for e in ends] == ["failed", "succeeded"]
    assert operator.job(jid)["job"]["attempt"] == 2


def test_print_and_logging_inside_a_handler_go_to_the_job_logs(server, operator):
    jt = unique("capture")
    w = new_worker(server)
    lib = logging.getLogger("trainer.data")

    @w.job(jt)
    def train(ctx: JobContext) -> None:
        print("epoch 1 loss 0.5")
        print("no newline at the end", end="")
        logging.info("root info from the handler")
        lib.warning("shard %d missing", 3)
        logging.debug("below the capture level")

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "succeeded"
    got = [(e["message"], e.get("payload")) for e in job_logs(operator, jid)]
    assert ("epoch 1 loss 0.5", {"stream": "stdout"}) in got, got
    assert ("no newline at the end", {"stream": "stdout"}) in got, got
    assert ("root info from the handler", {"level": "INFO", "logger": "root"}) in got, got
    assert ("shard 3 missing", {"level": "WARNING", "logger": "trainer.data"}) in got, got
    assert not any("below the capture level" in m for m, _ in got)
    # the worker's own records about the job are not the job's output
    assert not any(p and str(p.get("logger", "")).startswith("nodelane") for _, p in got)


def test_an_operator_cancel_cancels_an_async_handler_at_its_await(server, operator):
    jt = unique("async_cancel")
    w = new_worker(server)
    started = threading.Event()
    saw: Dict[str, Any] = {}

    @w.job(jt)
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            saw["reason"] = ctx.reason
            raise

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(started.is_set, 30, "the handler to start")
        operator.cancel(jid)
        wait_for(lambda: ends, 15, "the job to end")
    assert ends[0].outcome == "canceled" and isinstance(ends[0].error, Cancelled), ends[0]
    assert saw == {"reason": "canceled"}
    assert operator.job(jid)["job"]["state"] == "canceled"
