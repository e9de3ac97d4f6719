"""nodelane.testing.run_local: a handler run without a server, the README's example handler included."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from typing import Any, Dict

import pytest

from nodelane import Cancelled, ConfigError, JobContext, JobError, Result
from nodelane.testing import run_local

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


def readme_example() -> Dict[str, Any]:
    """The namespace of the README's example worker, run as a module (not as __main__)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- example-worker:[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert m, "the README's example worker block is marked <!-- example-worker: ... -->"
    ns: Dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(m.group(1), "README.md", "exec"), ns)
    return ns


def test_run_local_runs_the_readme_example_handler():
    run = run_local(readme_example()["train"], {"epochs": 2}, job_type="lora_train")
    assert run.outcome == "succeeded", run.message
    assert run.metrics == {"loss": 1 / 3}
    assert run.progress == [{"fraction": 0.5, "message": "epoch 1", "metrics": {"loss": 0.5}},
                            {"fraction": 1.0, "message": "epoch 2", "metrics": {"loss": 1 / 3}}]
    assert [(l["message"], l["payload"]) for l in run.logs] == [
        ("epoch 1: loss 0.5000", {"stream": "stdout"}), ("epoch 2: loss 0.3333", {"stream": "stdout"})]
    [a] = run.artifacts
    assert (a["kind"], a["name"], a["stored"]) == ("adapter", "adapter.safetensors", True)
    assert a["sha256"] == hashlib.sha256(b"weights").hexdigest() and a["size_bytes"] == 7


def test_a_job_error_and_a_plain_exception():
    def diverge(ctx: JobContext) -> None:
        raise JobError("loss is NaN", code="diverged", retryable=False, payload={"step": 7})

    run = run_local(diverge)
    assert (run.outcome, run.code, run.retryable, run.message) == ("failed", "diverged", False, "loss is NaN")

    def bug(ctx: JobContext) -> None:
        {}["missing"]

    run = run_local(bug)
    assert (run.outcome, run.code, run.retryable) == ("failed", "handler_error", False)
    assert run.message.startswith("KeyError: 'missing'\n\nTraceback (most recent call last)")
    assert isinstance(run.error, KeyError)
    assert run.logs[-1]["payload"] == {"level": "ERROR", "exception": "KeyError"}
    run = run_local(bug, retry_on=(LookupError,))
    assert run.retryable is True


def test_an_async_handler_and_a_coroutine_returned_by_mistake():
    async def score(ctx: JobContext) -> Result:
        await ctx.asleep(0)
        await ctx.aprogress(1.0, "done")
        logging.getLogger("eval").info("scored %d", 3)
        return Result(metrics={"acc": 0.9})

    run = run_local(score)
    assert run.outcome == "succeeded" and run.metrics == {"acc": 0.9}, run.message
    assert run.progress == [{"fraction": 1.0, "message": "done", "metrics": None}]
    assert run.logs == [{"message": "scored 3", "payload": {"level": "INFO", "logger": "eval"}}]

    run = run_local(lambda ctx: score(ctx))
    assert (run.outcome, run.code, run.retryable) == ("failed", "handler_returned_coroutine", False)
    assert run.progress == []


def test_cancel_after_stops_the_handler():
    def forever(ctx: JobContext) -> None:
        while True:
            ctx.sleep(60)

    run = run_local(forever, cancel_after=0.05)
    assert (run.outcome, run.code) == ("canceled", "canceled")
    assert isinstance(run.error, Cancelled) and run.error.reason == "canceled"

    async def forever_async(ctx: JobContext) -> None:
        await asyncio.sleep(3600)

    run = run_local(forever_async, cancel_after=0.05)
    assert run.outcome == "canceled" and isinstance(run.error, Cancelled)


def test_printed_output_is_bounded_like_a_commands():
    def chatty(ctx: JobContext) -> None:
        for i in range(5000):
            print("line %d" % i)

    run = run_local(chatty)
    lines = [l for l in run.logs if (l["payload"] or {}).get("stream") == "stdout"]
    dropped = [l for l in run.logs if (l["payload"] or {}).get("warning") == "output_dropped"]
    # a burst of 1,000, then 100 a second: far fewer than 5,000 in the time a loop of prints takes
    assert 1000 <= len(lines) < 2000, len(lines)
    assert lines[0]["message"] == "line 0" and lines[999]["message"] == "line 999"
    assert len(dropped) >= 1
    total = sum(int(l["message"].split()[0]) for l in dropped)
    assert total + len(lines) == 5000, (total, len(lines))


def test_gpus_are_taken_from_the_fake_box():
    def two(ctx: JobContext) -> Dict[str, Any]:
        return {"gpus": ctx.gpus}

    run = run_local(two, requirements={"gpu_count": 2}, gpus=("0", "1"))
    assert run.outcome == "succeeded" and run.metrics == {"gpus": ["0", "1"]} and run.gpus == ["0", "1"]
    run = run_local(two, requirements={"gpu_count": 3}, gpus=("0", "1"))
    assert run.outcome == "failed" and isinstance(run.error, ConfigError)


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError):
        run_local(lambda ctx: None, retry_on=("ValueError",))
    with pytest.raises(ConfigError):
        run_local(lambda ctx: None, attempt=0)


def test_a_record_nobody_else_handles_is_captured_once_and_still_printed(capsys):
    """With no logging configured (no handler but the capture's), a warning still reaches stderr through
    logging.lastResort, as without the capture, and the job's logs hold it once, not twice."""
    root = logging.getLogger()
    saved = root.handlers[:]
    for h in saved:
        root.removeHandler(h)
    try:
        run = run_local(lambda ctx: logging.getLogger("trainer").warning("disk almost full"))
    finally:
        for h in saved:
            root.addHandler(h)
    assert run.logs == [{"message": "disk almost full", "payload": {"level": "WARNING", "logger": "trainer"}}]
    assert "disk almost full" in capsys.readouterr().err
