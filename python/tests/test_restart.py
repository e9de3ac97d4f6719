"""Restarts and signals against the real server: what a crash does to a job, capabilities that
follow the box, and the control long-poll (cancel, drain, ban within seconds)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import nodelane
from nodelane import APIError, Client, Identity, Signer

from helpers import ScriptWorker, job_state, new_worker, running, sequenced_receipt, unique, wait_for

GPUS = {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}


def test_sigkill_and_restart_requeues_the_job_at_once(server, operator, tmp_path):
    """kill -9 mid-job, then a restart with the same identity: the job runs again within seconds
    (not at its lease's expiry), and completes exactly once."""
    jt = unique("crash")
    ident, node = str(tmp_path / "identity.json"), unique("py-crash")
    first = ScriptWorker(server, tmp_path, "restart_worker.py", ident, node, jt)
    try:
        first.expect("started")
        jid = operator.dispatch(jt, {"block_first": True}, max_attempts=3)["job"]["id"]
        e = first.expect("job")
        assert (e["job"], e["attempt"]) == (jid, 1)
        first.proc.kill()  # SIGKILL: no release, no final heartbeat
        first.proc.wait(timeout=10)
        assert job_state(operator, jid) == "running"
        t0 = time.monotonic()
        second = ScriptWorker(server, tmp_path, "restart_worker.py", ident, node, jt)
        try:
            started = second.expect("started")["answer"]
            # the start says the process holds nothing: the server ends the dead process's lease
            assert started["ended_jobs"] == [jid], started
            e = second.expect("job", 15)
            assert (e["job"], e["attempt"]) == (jid, 2)
            end = second.expect("ended", 15)
            assert (end["job"], end["outcome"]) == (jid, "succeeded")
            assert time.monotonic() - t0 < 15
        finally:
            second.stop()
    finally:
        first.stop()
    jv = operator.job(jid)
    job = jv["job"]
    assert job["state"] == "succeeded" and job["attempt"] == 2, job
    assert jv["result"]["metrics"] == {"attempt": 2}  # the second attempt's, the only one completed
    assert job["last_error"]["code"] == "worker_restarted", job


def test_registering_again_requeues_what_the_old_process_held(server, operator):
    """A node that lost its token registers again with the same key: current_jobs [] ends its old leases."""
    jt = unique("rereg")
    node = unique("py-rereg")
    old = Client(server.url, Signer())
    old.register(server.provisioning_token, node, capabilities=dict(GPUS, job_types=[jt]))
    jid = operator.dispatch(jt, {})["job"]["id"]
    assert old.lease(wait_seconds=5, accept=True)["job"]["id"] == jid
    # the same key, its token lost: the worker registers again
    w = new_worker(server, identity=Identity(old.signer), registration={"node_id": node, "capabilities": GPUS})
    ran: List[int] = []
    w.job(jt)(lambda ctx: ran.append(ctx.attempt))
    with running(w) as ends:
        wait_for(lambda: ends, 20, "the job to run again")
    assert w.start_answer["ended_jobs"] == [jid]
    assert ran == [2] and ends[0].outcome == "succeeded"


def test_a_heartbeat_ends_what_the_worker_does_not_hold_but_spares_later_grants(server, operator):
    jt = unique("through")
    c = Client(server.url, Signer())
    c.register(server.provisioning_token, unique("py-through"), capabilities=dict(GPUS, job_types=[jt]),
               governor_limits={"max_jobs": 2})
    j1 = operator.dispatch(jt, {})["job"]["id"]
    a1 = c.lease(wait_seconds=5)
    assert a1["job"]["id"] == j1 and a1["server_time"]
    j2 = operator.dispatch(jt, {})["job"]["id"]
    a2 = c.lease(wait_seconds=5)
    assert a2["job"]["id"] == j2
    # the worker says it holds nothing, having processed only the first lease answer
    ans = c.heartbeat("idle", [], leases_through=a1["server_time"])
    assert ans["ended_jobs"] == [j1]
    job = operator.job(j1)["job"]
    assert job["state"] == "queued" and job["last_error"]["code"] == "not_held", job
    assert job_state(operator, j2) == "leased"  # granted after leases_through: spared
    ans = c.heartbeat("idle", [j2], leases_through=a2["server_time"])
    assert ans["ended_jobs"] == [] and [lz["job_id"] for lz in ans["leases"]] == [j2]


def test_capabilities_follow_the_box(server, operator, tmp_path):
    """Run a worker, stop it, add a job type (and a tag, and max_jobs): the next run can lease it."""
    old_t, new_t = unique("cap_old"), unique("cap_new")
    ident = str(tmp_path / "identity.json")
    node = unique("py-caps")
    w1 = new_worker(server, identity=ident, registration={"node_id": node, "capabilities": GPUS})
    w1.job(old_t)(lambda ctx: None)
    with running(w1):
        pass
    w2 = new_worker(server, identity=ident, max_jobs=2,
                    registration={"node_id": node, "capabilities": GPUS, "tags": ["lab"]})
    w2.job(old_t)(lambda ctx: None)
    w2.job(new_t)(lambda ctx: {"new": True})
    with running(w2) as ends:
        jid = operator.dispatch(new_t, {}, requirements={"tags": ["lab"]})["job"]["id"]
        wait_for(lambda: ends, 20, "the new job type to be leased")
    assert ends[0].outcome == "succeeded" and ends[0].job["id"] == jid
    ans = w2.start_answer
    assert ans["changed"] is True and ans["receipt_id"], ans
    assert w2.identity.worker_id == w1.identity.worker_id  # the same worker: no new node_id needed
    # the worker_updated receipt, verified offline: old and new
    rec = nodelane.verify_receipt_response(sequenced_receipt(operator, ans["receipt_id"]), server.receipt_public_key)
    assert rec["kind"] == "worker_updated", rec
    assert rec["job_types"] == " ".join(sorted([old_t, new_t])) and rec["old_job_types"] == old_t
    assert rec["tags"] == "lab" and rec["max_jobs"] == 2 and rec["old_max_jobs"] == 1


def test_an_operator_cancel_reaches_the_handler_within_two_seconds(server, operator):
    """With a heartbeat interval of an hour, the control long-poll carries the cancel."""
    jt = unique("sig_cancel")
    w = new_worker(server, heartbeat_interval=3600)
    started, stopped = threading.Event(), threading.Event()
    saw: Dict[str, Any] = {}

    @w.job(jt)
    def long(ctx):
        started.set()
        ctx.cancel_event.wait(60)  # a silent handler: no status call to learn it from
        saw["reason"] = ctx.reason
        stopped.set()
        ctx.check()

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        assert started.wait(30)
        t0 = time.monotonic()
        operator.cancel(jid)
        assert stopped.wait(2), "the cancel did not reach the handler within 2 s"
        took = time.monotonic() - t0
        wait_for(lambda: ends, 20, "the job to end")
    assert saw["reason"] == "canceled" and took < 2
    assert ends[0].outcome == "canceled" and job_state(operator, jid) == "canceled"


def test_an_operator_drain_drains_the_worker(server, operator):
    jt = unique("sig_drain")
    w = new_worker(server, heartbeat_interval=3600)
    w.job(jt)(lambda ctx: None)
    errors: List[BaseException] = []
    t = threading.Thread(target=lambda: _run(w, errors), daemon=True)
    t.start()
    assert w.ready.wait(30)
    # the long-poll is open now; the drain request wakes it
    wait_for(lambda: w._signals_abort is not None, 10, "the signals long-poll")
    t0 = time.monotonic()
    p = "/operator/workers/%s/drain" % w.identity.worker_id
    nodelane.client.expect(operator.post(p, {}), p, 200)
    t.join(20)
    assert not t.is_alive() and not errors
    assert time.monotonic() - t0 < 10


def test_a_ban_stops_the_worker_within_two_seconds(server, operator):
    jt = unique("sig_ban")
    w = new_worker(server, heartbeat_interval=3600, wait_seconds=30)
    w.job(jt)(lambda ctx: None)
    errors: List[BaseException] = []
    done = threading.Event()
    t = threading.Thread(target=lambda: (_run(w, errors), done.set()), daemon=True)
    t.start()
    assert w.ready.wait(30)
    wait_for(lambda: w._signals_abort is not None, 10, "the signals long-poll")
    p = "/operator/workers/%s/ban" % w.identity.worker_id
    t0 = time.monotonic()
    nodelane.client.expect(operator.post(p, {"reason": "test"}), p, 200)
    # the worker stops leasing at once: a job dispatched now is never granted to it
    jid = operator.dispatch(jt, {})["job"]["id"]
    assert done.wait(10)
    assert len(errors) == 1 and isinstance(errors[0], APIError) and errors[0].code == "worker_banned", errors
    assert time.monotonic() - t0 < 10
    job = operator.job(jid)["job"]
    assert job["state"] == "queued" and job["leased_at"] is None, job


def _run(w: nodelane.Worker, errors: List[BaseException]) -> None:
    try:
        w.run(install_signal_handlers=False)
    except BaseException as e:
        errors.append(e)


def test_under_approval_a_new_job_type_waits_while_the_approved_ones_work(start_server, tmp_path):
    s = start_server("-approve-nodes")
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "approval"}), "activate", 200)
    old_t, new_t = unique("appr_old"), unique("appr_new")
    ident, node = str(tmp_path / "identity.json"), unique("py-appr")
    w1 = new_worker(s, identity=ident, registration={"node_id": node, "capabilities": GPUS})
    w1.job(old_t)(lambda ctx: None)
    with running(w1):
        assert w1.start_answer["status"] == "pending"
        p = "/operator/workers/%s/approve" % w1.identity.worker_id
        nodelane.client.expect(op.post(p, {}), p, 200)
    w2 = new_worker(s, identity=ident, registration={"node_id": node, "capabilities": GPUS})
    w2.job(old_t)(lambda ctx: None)
    w2.job(new_t)(lambda ctx: None)
    with running(w2) as ends:
        ans = w2.start_answer
        assert ans["status"] == "registered" and ans["pending_job_types"] == [new_t], ans
        waiting = op.dispatch(new_t, {})["job"]["id"]
        done = op.dispatch(old_t, {})["job"]["id"]
        wait_for(lambda: ends, 20, "the approved type to run")
        assert ends[0].job["id"] == done and ends[0].outcome == "succeeded"
        assert job_state(op, waiting) == "queued"  # the widening awaits approval
        p = "/operator/workers/%s/approve" % w2.identity.worker_id
        nodelane.client.expect(op.post(p, {}), p, 200)
        wait_for(lambda: len(ends) == 2, 20, "the new type to run once approved")
    assert ends[1].job["id"] == waiting and ends[1].outcome == "succeeded"
