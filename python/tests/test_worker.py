"""The Worker against the real server: decorated handlers, results, failures, cancel, lease loss."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

import nodelane
from nodelane import Cancelled, ConfigError, JobContext, JobError, Result, Worker

from helpers import job_state, new_worker, running, unique, wait_for


def test_job_runs_end_to_end(server, operator, tmp_path):
    jt = unique("lora_train")
    # it verifies the completion from its answer: the answer waits for the proofs
    w = new_worker(server, identity=str(tmp_path / "node" / "identity.json"), wait_for_proofs=True)
    seen = {}
    art = tmp_path / "adapter.bin"
    art.write_bytes(b"weights" * 1000)

    @w.job(jt)
    def train(ctx: JobContext):
        seen.update(job_id=ctx.job_id, attempt=ctx.attempt, payload=ctx.payload, job_type=ctx.job_type)
        ctx.progress(0.5, "half way", {"loss": 0.5})
        for i in range(5):
            ctx.log("step %d" % i, {"i": i})
        ctx.flush()
        ctx.artifact("adapter", "adapter.bin", "file:///tmp/adapter.bin", path=str(art), metadata={"r": 8})
        ctx.log("done")
        return Result(output_uri="file:///tmp/out", metrics={"loss": 0.12}, final_message="trained")

    with running(w) as ends:
        jid = operator.dispatch(jt, {"epochs": 1})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    end = ends[0]
    assert end.outcome == "succeeded", end
    assert seen == {"job_id": jid, "attempt": 1, "payload": {"epochs": 1}, "job_type": jt}
    v = nodelane.verify_completion(end.answer, server.receipt_public_key, nodelane.DEFAULT_ORIGIN, job_id=jid,
                                   worker_id=w.identity.worker_id, metrics={"loss": 0.12})
    assert v.completed["output_uri"] == "file:///tmp/out"
    jv = operator.job(jid)
    assert jv["job"]["state"] == "succeeded"
    assert jv["result"]["final_message"] == "trained" and jv["result"]["metrics"] == {"loss": 0.12}
    logs = [e["message"] for e in jv["events"] if e["kind"] == "log"]
    assert logs == ["step 0", "step 1", "step 2", "step 3", "step 4", "done"]
    progress = [e for e in jv["events"] if e["kind"] != "log"]
    assert progress[0]["event_type"] == "progress"
    assert progress[0]["payload"] == {"fraction": 0.5, "metrics": {"loss": 0.5}}
    a = jv["artifacts"][0]
    assert a["checksum_sha256"] == hashlib.sha256(art.read_bytes()).hexdigest()
    assert a["size_bytes"] == 7000 and a["metadata"] == {"r": 8}
    # the identity file keeps the key and the token, readable by its owner only
    ident = tmp_path / "node" / "identity.json"
    assert ident.stat().st_mode & 0o777 == 0o600
    again = nodelane.Identity.load_or_create(str(ident))
    assert again.token == w.identity.token and again.signer.public_key == w.identity.signer.public_key


def test_failing_handler_fails_the_job(server, operator):
    jt = unique("fails")
    w = new_worker(server)

    @w.job(jt)
    def boom(ctx):
        raise JobError("out of memory", code="oom", retryable=False, payload={"vram_mb": 24576})

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "failed" and ends[0].answer["requeued"] is False
    job = operator.job(jid)["job"]
    assert job["state"] == "failed"
    assert job["last_error"]["code"] == "oom" and "out of memory" in job["last_error"]["message"]


def test_retryable_failure_queues_the_job_again(server, operator):
    jt = unique("flaky")
    w = new_worker(server)

    @w.job(jt, retry_on=(RuntimeError,))
    def flaky(ctx):
        raise RuntimeError("the GPU fell off the bus")  # retryable: the handler opted in

    with running(w) as ends:
        jid = operator.dispatch(jt, {}, max_attempts=3)["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "failed" and ends[0].answer["requeued"] is True
    job = operator.job(jid)["job"]
    assert job["state"] == "queued" and job["attempt"] == 2, job
    assert job["last_error"]["code"] == "handler_error"
    assert "RuntimeError: the GPU fell off the bus" in job["last_error"]["message"]


def test_operator_cancel_reaches_the_handler(server, operator):
    jt = unique("cancel")
    w = new_worker(server)
    started = threading.Event()
    saw = {}

    @w.job(jt)
    def long(ctx):
        started.set()
        try:
            while True:
                ctx.sleep(0.1)
        except Cancelled as e:
            saw["reason"] = e.reason
            saw["cancelled"] = ctx.cancelled
            raise

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        assert started.wait(30)
        operator.cancel(jid)
        wait_for(lambda: ends, 30, "the job to end")
    assert saw == {"reason": "canceled", "cancelled": True}
    assert ends[0].outcome == "canceled"
    assert job_state(operator, jid) == "canceled"


def test_cancel_seen_in_a_status_answer(server, operator):
    jt = unique("cancel_status")
    # heartbeats too rare to carry the cancel: the status answer's cancel_requested must
    w = new_worker(server, heartbeat_interval=60)
    started = threading.Event()

    @w.job(jt)
    def long(ctx):
        started.set()
        while not ctx.cancelled:
            ctx.status("progress", "working")
            time.sleep(0.1)
        return None  # returns normally: complete then answers 409 job_canceled

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        assert started.wait(30)
        operator.cancel(jid)
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "canceled" and ends[0].error.code == "job_canceled"
    assert job_state(operator, jid) == "canceled"


def test_lease_loss_stops_the_handler(server, operator):
    jt = unique("lost")
    # heartbeats too rare to carry lost_jobs, and the local expiry watchdog off: the 409
    # lease_lost of the handler's own status call is what tells the worker
    w = new_worker(server, heartbeat_interval=60)
    w._watchdogs = lambda: None
    saw = {}

    @w.job(jt)
    def forever(ctx):
        t0 = time.monotonic()
        with pytest.raises(nodelane.LeaseLost):
            while True:
                ctx.status("progress", "still here")
                time.sleep(0.3)
        saw.update(reason=ctx.reason, cancelled=ctx.cancelled, after=time.monotonic() - t0)
        ctx.check()

    with running(w) as ends:
        # a max runtime of 2 s: then the server revokes the lease (409 lease_lost, lost_jobs)
        jid = operator.dispatch(jt, {}, requirements={"max_runtime_seconds": 2})["job"]["id"]
        wait_for(lambda: ends, 40, "the job to end")
    assert saw["reason"] == "lease_lost" and saw["cancelled"] and saw["after"] < 20
    assert ends[0].outcome == "lost"
    job = operator.job(jid)["job"]
    assert job["state"] == "failed" and job["last_error"]["code"] == "max_runtime_exceeded"


def test_lost_jobs_of_a_heartbeat_stop_the_handler(server, operator):
    jt = unique("lost_hb")
    w = new_worker(server)
    w._watchdogs = lambda: None  # only the heartbeat's lost_jobs can tell
    saw = {}

    @w.job(jt)
    def forever(ctx):
        ctx.cancel_event.wait(60)
        saw["reason"] = ctx.reason
        ctx.check()

    with running(w) as ends:
        operator.dispatch(jt, {}, requirements={"max_runtime_seconds": 2})
        wait_for(lambda: ends, 40, "the job to end")
    assert saw["reason"] == "lease_lost" and ends[0].outcome == "lost"


def test_a_lease_about_to_expire_stops_the_handler_first(server, operator):
    jt = unique("expiring")
    w = new_worker(server, heartbeat_interval=60)  # only the worker's own watchdog can tell
    saw = {}

    @w.job(jt)
    def forever(ctx):
        t0 = time.monotonic()
        ctx.cancel_event.wait(60)
        saw.update(reason=ctx.reason, after=time.monotonic() - t0)
        ctx.check()

    with running(w) as ends:
        # expires_at is capped at accept + 4 s: the worker stops the job before then (its
        # margin, a fifth of the lease's 4 s), before the server revokes the lease
        jid = operator.dispatch(jt, {}, requirements={"max_runtime_seconds": 4})["job"]["id"]
        wait_for(lambda: ends, 40, "the job to end")
    assert saw["reason"] == "lease_expiring" and saw["after"] < 4
    assert ends[0].outcome == "lost"
    # it was handed back (release) before the server revoked it: queued again, no attempt used
    job = operator.job(jid)["job"]
    assert job["state"] == "queued" and job["attempt"] == 1, job


def test_bad_input_to_the_sdk(server):
    w = Worker(server.url)
    for bad in ("", "has space", "tab\t", "x" * 129, None, 7, "ctl\x01"):
        with pytest.raises(ConfigError):
            w.job(bad)
    w.job("x" * 128)(lambda ctx: None)
    w.job("ok_type")(lambda ctx: None)
    with pytest.raises(ConfigError, match="has a handler already"):
        w.job("ok_type")(lambda ctx: None)
    with pytest.raises(ConfigError, match="not callable"):
        w.handle("other", "not a function")
    with pytest.raises(ConfigError, match="no handler"):
        Worker(server.url).run(install_signal_handlers=False)
    with pytest.raises(ConfigError, match="provisioning_token"):
        w.run(install_signal_handlers=False)  # no token, nothing to register with
    for kw in ({"max_jobs": 0}, {"wait_seconds": 61}, {"log_batch_size": 1001}, {"drain_timeout": -1},
               {"heartbeat_interval": 0}, {"max_buffered_logs": 0}):
        with pytest.raises(ConfigError):
            Worker(server.url, **kw)
    with pytest.raises(ConfigError):
        Worker("ftp://example.com")
    with pytest.raises(ConfigError):
        Worker("http://127.0.0.1:1/?q=1")
    with pytest.raises(ConfigError):
        JobError("x", code="")


def test_oversized_logs_and_payloads_are_bounded(server, operator):
    jt = unique("biglogs")
    w = new_worker(server, max_buffered_logs=50, log_batch_size=1000, log_flush_interval=60)
    saw = {}

    @w.job(jt)
    def chatty(ctx):
        ctx.log("x" * 100_000, {"blob": "y" * 100_000})  # over 16 KiB each: cut, replaced
        ctx.log("é" * 20_000)  # cut on a character boundary
        for i in range(200):  # over the buffer of 50: the oldest are dropped
            ctx.log("line %d" % i)
        saw["buffered"] = ctx.buffered_logs
        with pytest.raises(ConfigError):
            ctx.progress(1.5)
        with pytest.raises(ConfigError):
            ctx.status("")
        with pytest.raises(ConfigError):
            ctx.artifact("adapter", "", "s3://x")
        ctx.status("progress", "m" * 100_000, {"big": "z" * 100_000})  # bounded, accepted
        return {"lines": 202}

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "succeeded", ends[0]
    assert saw["buffered"] == 50
    jv = operator.job(jid)
    logs = [e["message"] for e in jv["events"] if e["kind"] == "log"]
    assert logs[0] == "line 150"
    assert "152 log lines dropped" in logs[-1]
    assert len(logs) == 51
    st = [e for e in jv["events"] if e["kind"] != "log"][0]
    assert st["payload"] == {"truncated": True} and len(st["message"].encode()) <= 16 << 10
    assert jv["result"]["metrics"] == {"lines": 202}


def test_jobs_run_concurrently_up_to_max_jobs(server, operator):
    jt = unique("parallel")
    w = new_worker(server, max_jobs=2)
    lock = threading.Lock()
    now = {"running": 0, "most": 0}

    @w.job(jt)
    def work(ctx):
        with lock:
            now["running"] += 1
            now["most"] = max(now["most"], now["running"])
        ctx.sleep(1.0)
        with lock:
            now["running"] -= 1

    for _ in range(4):  # queued first: the first lease asks for two and gets two
        operator.dispatch(jt, {})
    with running(w) as ends:
        wait_for(lambda: len(ends) == 4, 60, "four jobs to end")
    assert now["most"] == 2
    assert [e.outcome for e in ends] == ["succeeded"] * 4


def test_a_missed_heartbeat_deadline_stops_the_jobs(start_server):
    from faultproxy import FaultProxy
    s = start_server("-heartbeat-interval", "1s", "-offline-after", "2s")
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "offline"}), "activate", 200)
    # the first two heartbeats get through; every later one is refused 503 by the proxy
    proxy = FaultProxy(s.port, "/workers/heartbeat", "503", count=10_000, retry_after=0, skip=2)
    jt = unique("offline")
    w = new_worker(s, url=proxy.url, heartbeat_interval=0.3, max_attempts=1)
    saw = {}

    @w.job(jt)
    def forever(ctx):
        ctx.cancel_event.wait(60)
        saw["reason"] = ctx.reason
        ctx.check()

    op.dispatch(jt, {})  # queued first: leased at once, before the worker goes offline
    with running(w) as ends:
        wait_for(lambda: ends, 30, "the job to end")
    proxy.close()
    assert saw["reason"] == "offline" and ends[0].outcome == "lost"


def test_the_worker_renews_its_token(server, operator):
    jt = unique("renew")
    w = new_worker(server, token_renew_before=40 * 86400)
    w.job(jt)(lambda ctx: {"ok": 1})
    with running(w) as ends:
        first = w.identity.token
        # as if the 30-day token had been received 100 days before it expires: a third of
        # that lifetime (33 days) is more than the 30 days left, so the next heartbeat renews
        w.identity.token_received_at -= 70 * 86400
        wait_for(lambda: w.identity.token != first, 10, "the token to be renewed")
        operator.dispatch(jt, {})
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "succeeded"


def test_drain_cuts_the_long_poll(server, operator):
    jt = unique("idle")
    w = new_worker(server, wait_seconds=30)
    w.job(jt)(lambda ctx: None)
    with running(w):
        time.sleep(1.0)  # the lease long-poll is in flight now
        t0 = time.monotonic()
        w.drain()
    assert time.monotonic() - t0 < 10  # not the 30 s of the long-poll
    # the cut long-poll leases nothing afterwards
    jid = operator.dispatch(jt, {})["job"]["id"]
    time.sleep(1.5)
    job = operator.job(jid)["job"]
    assert job["state"] == "queued" and job["leased_at"] is None, job
