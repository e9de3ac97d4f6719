"""What the Worker sends and does with answers, against a scripted stand-in (fakeserver.py).

Restart reconciliation (register's and start's current_jobs, heartbeat's
leases_through), capabilities on every start, and the control long-poll
(POST /workers/signals): cancel, lost, drain, ban. The same behaviours run
against the real server in test_restart.py.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Dict, List

import pytest

import nodelane
from nodelane import APIError, ConfigError, Identity, JobEnd, Signer, Worker

from fakeserver import FakeServer, error, grant, heartbeat_answer, now_rfc3339
from helpers import wait_for


@pytest.fixture
def fake():
    s = FakeServer()
    yield s
    s.close()


def token_identity() -> Identity:
    ident = Identity(Signer())
    ident.set_registration("node-fake", "wrk_fake", "nlc_faketoken", now_rfc3339(30 * 86400))
    return ident


def start_answer(**extra: Any) -> Dict[str, Any]:
    ans = {"worker_id": "wrk_fake", "status": "registered", "changed": False, "receipt_id": None,
           "pending_job_types": [], "pending_tags": [], "ended_jobs": [], "policy_version": 1,
           "server_time": now_rfc3339(), "next_heartbeat_seconds": 30, "heartbeat_deadline": now_rfc3339(90)}
    ans.update(extra)
    return ans


def idle_lease(body: Dict[str, Any]):
    time.sleep(min(body.get("wait_seconds", 0), 0.2))
    return 200, {"leases": [], "message": "no job", "server_time": now_rfc3339()}


def idle_signals(body: Dict[str, Any]):
    time.sleep(min(body.get("wait_seconds", 0), 0.2))
    return 200, {"cancel_jobs": [], "lost_jobs": [], "drain": False, "server_time": now_rfc3339()}


def base_routes(fake: FakeServer) -> None:
    fake.routes.update({
        "/workers/start": lambda b: (200, start_answer()),
        "/workers/heartbeat": lambda b: (200, heartbeat_answer()),
        "/workers/jobs/lease": idle_lease,
        "/workers/signals": idle_signals,
        "/workers/jobs/*/complete": lambda b: (200, {"ok": True, "proofs": [1], "checkpoint": "x"}),
        "/workers/jobs/*/fail": lambda b: (200, {"ok": True, "requeued": False}),
        "/workers/jobs/*/release": lambda b: (200, {"ok": True}),
        "/workers/jobs/*/logs": lambda b: (200, {"ok": True}),
    })


def run_in_thread(w: Worker) -> "tuple[threading.Thread, List[BaseException]]":
    errors: List[BaseException] = []

    def run() -> None:
        try:
            w.run(install_signal_handlers=False)
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def new(fake: FakeServer, **kw: Any) -> Worker:
    opts: Dict[str, Any] = dict(identity=token_identity(), wait_seconds=1, heartbeat_interval=3600,
                                drain_timeout=2, drain_grace=1, timeout=5, max_attempts=1, idle_poll=0.1)
    opts.update(kw)
    return Worker(fake.url, **opts)


def test_a_worker_with_a_token_starts_with_what_it_is_now(fake):
    base_routes(fake)
    fake.routes["/workers/start"] = lambda b: (200, start_answer(changed=True, receipt_id="rcp_1",
                                                                 ended_jobs=["job_old"]))
    w = new(fake, max_jobs=3, registration={"tags": ["lab"], "capabilities": {
        "gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}})
    w.job("b_type")(lambda ctx: None)
    w.job("a_type")(lambda ctx: None)
    t, errors = run_in_thread(w)
    fake.wait_for(lambda: fake.sent("/workers/heartbeat"), 10, "a heartbeat")
    w.drain()
    t.join(20)
    assert not t.is_alive() and not errors
    assert fake.sent("/workers/register") == []
    (body,) = fake.sent("/workers/start")
    assert body["current_jobs"] == []  # a process that just started holds nothing
    assert body["capabilities"] == {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}],
                                    "job_types": ["a_type", "b_type"]}
    assert body["tags"] == ["lab"] and body["governor_limits"] == {"max_jobs": 3}
    assert body["name"] == "node-fake" and body["role"] == "worker" and body["version"].startswith("nodelane")
    assert "public_key" not in body and "node_id" not in body
    assert w.start_answer["receipt_id"] == "rcp_1"
    # the start answer's server_time is the first leases_through
    hb = fake.sent("/workers/heartbeat")[0]
    assert hb["leases_through"] == w.start_answer["server_time"]
    assert "capabilities" not in hb


def test_register_says_it_holds_nothing(fake):
    base_routes(fake)
    fake.routes["/workers/register"] = lambda b: (201, {
        "worker_id": "wrk_new", "worker_token": "nlc_new", "status": "registered", "policy_version": 1,
        "next_heartbeat_seconds": 30, "server_time": now_rfc3339(), "token_expires_at": now_rfc3339(86400),
        "ended_jobs": []})
    w = new(fake, identity=Identity(Signer()), provisioning_token="nlc_prov",
            registration={"node_id": "n1"})
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    fake.wait_for(lambda: fake.sent("/workers/heartbeat"), 10, "a heartbeat")
    w.drain()
    t.join(20)
    assert not errors
    (body,) = fake.sent("/workers/register")
    assert body["current_jobs"] == [] and body["node_id"] == "n1"
    assert fake.sent("/workers/start") == []  # registering is starting


def test_a_refused_token_at_start_registers_again(fake):
    base_routes(fake)
    fake.routes["/workers/start"] = lambda b: error(401, "token_revoked")
    fake.routes["/workers/register"] = lambda b: (200, {
        "worker_id": "wrk_fake", "worker_token": "nlc_new", "status": "registered",
        "server_time": now_rfc3339(), "token_expires_at": now_rfc3339(86400)})
    w = new(fake, provisioning_token="nlc_prov")
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    fake.wait_for(lambda: fake.sent("/workers/heartbeat"), 10, "a heartbeat")
    w.drain()
    t.join(20)
    assert not errors
    assert fake.sent("/workers/register")[0]["current_jobs"] == []
    assert w.identity.token == "nlc_new"


def test_a_banned_worker_does_not_start(fake):
    base_routes(fake)
    fake.routes["/workers/start"] = lambda b: error(403, "worker_banned")
    w = new(fake, provisioning_token="nlc_prov")
    w.job("t")(lambda ctx: None)
    with pytest.raises(APIError) as ei:
        w.run(install_signal_handlers=False)
    assert ei.value.code == "worker_banned"
    assert fake.sent("/workers/register") == [] and fake.sent("/workers/jobs/lease") == []


def test_an_older_control_plane_gets_the_capabilities_by_heartbeat(fake):
    base_routes(fake)
    del fake.routes["/workers/start"]  # 404 not_found
    del fake.routes["/workers/signals"]
    w = new(fake, heartbeat_interval=0.2)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    fake.wait_for(lambda: len(fake.sent("/workers/heartbeat")) >= 2, 10, "two heartbeats")
    w.drain()
    t.join(20)
    assert not errors
    hbs = fake.sent("/workers/heartbeat")
    assert hbs[0]["capabilities"]["job_types"] == ["t"]
    assert "capabilities" not in hbs[1]  # once is enough
    assert len(fake.sent("/workers/signals")) == 1  # 404: no more long-polls


def test_a_job_is_listed_until_its_report_is_answered_and_leases_through_follows_the_lease_answers(fake):
    base_routes(fake)
    times: List[str] = []
    granted = threading.Event()

    def lease(body):
        if granted.is_set():
            return idle_lease(body)
        granted.set()
        st = now_rfc3339()
        times.append(st)
        return 200, {"leases": [grant("job_1", "t")], "server_time": st}
    fake.routes["/workers/jobs/lease"] = lease
    in_complete = threading.Event()
    release_complete = threading.Event()

    def complete(body):
        in_complete.set()
        release_complete.wait(10)
        return 200, {"ok": True, "proofs": [1], "checkpoint": "x"}
    fake.routes["/workers/jobs/*/complete"] = complete
    w = new(fake, heartbeat_interval=0.1)
    w.job("t")(lambda ctx: {"ok": 1})
    t, errors = run_in_thread(w)
    try:
        assert in_complete.wait(10)
        n = len(fake.sent("/workers/heartbeat"))
        # while complete waits for its answer, every heartbeat lists the job, with the lease
        # answer's server_time as leases_through
        fake.wait_for(lambda: len(fake.sent("/workers/heartbeat")) >= n + 2, 10, "heartbeats")
        for hb in fake.sent("/workers/heartbeat")[n:]:
            assert hb["current_jobs"] == ["job_1"] and hb["leases_through"] == times[0], hb
    finally:
        release_complete.set()
    m = wait_for(lambda: not w.jobs() and len(fake.sent("/workers/heartbeat")), 10, "the job to end")
    fake.wait_for(lambda: len(fake.sent("/workers/heartbeat")) >= m + 2, 10, "heartbeats")
    assert fake.sent("/workers/heartbeat")[-1]["current_jobs"] == []
    w.drain()
    t.join(20)
    assert not errors


def test_a_refused_grant_is_listed_until_its_release_is_answered(fake):
    base_routes(fake)
    granted = threading.Event()

    def lease(body):
        if granted.is_set():
            return idle_lease(body)
        granted.set()
        return 200, {"leases": [grant("job_x", "unknown_type")], "server_time": now_rfc3339()}
    fake.routes["/workers/jobs/lease"] = lease
    in_release, answer = threading.Event(), threading.Event()

    def release(body):
        in_release.set()
        answer.wait(10)
        return 200, {"ok": True}
    fake.routes["/workers/jobs/*/release"] = release
    w = new(fake, heartbeat_interval=0.1)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    try:
        assert in_release.wait(10)
        # A heartbeat sent before the grant came may still arrive now: look
        # from the first that lists the grant, and at two after it.
        def first_listing():
            hbs = fake.sent("/workers/heartbeat")
            return next((i + 1 for i, hb in enumerate(hbs) if hb["current_jobs"] == ["job_x"]), None)
        n = fake.wait_for(first_listing, 10, "a heartbeat that lists the refused grant") - 1
        fake.wait_for(lambda: len(fake.sent("/workers/heartbeat")) >= n + 3, 10, "heartbeats")
        assert all(hb["current_jobs"] == ["job_x"] for hb in fake.sent("/workers/heartbeat")[n:])
    finally:
        answer.set()
    w.drain()
    t.join(20)
    assert not errors


def test_signals_cancel_lose_and_say_what_is_known(fake):
    base_routes(fake)
    granted = threading.Event()

    def lease(body):
        if granted.is_set():
            return idle_lease(body)
        granted.set()
        return 200, {"leases": [grant("job_c", "t"), grant("job_l", "t")], "server_time": now_rfc3339()}
    fake.routes["/workers/jobs/lease"] = lease
    go = threading.Event()
    said = threading.Event()

    known = threading.Event()
    known_bodies: List[Dict[str, Any]] = []

    def signals(body):
        if "job_c" in body["known_cancels"]:
            known_bodies.append(body)
            known.set()
        if go.is_set() and not said.is_set() and body["current_jobs"] == ["job_c", "job_l"]:
            said.set()
            return 200, {"cancel_jobs": ["job_c", "job_other"], "lost_jobs": ["job_l"], "drain": False,
                         "server_time": now_rfc3339()}
        return idle_signals(body)
    fake.routes["/workers/signals"] = signals
    reasons: Dict[str, Any] = {}
    started = threading.Barrier(3)

    def handler(ctx):
        started.wait(10)
        ctx.cancel_event.wait(30)
        reasons[ctx.job_id] = ctx.reason
        if ctx.job_id == "job_c":
            known.wait(10)  # the next long-poll names it among known_cancels, job_l (lost) no longer
        ctx.check()
    w = new(fake, max_jobs=2)
    w.job("t")(handler)
    t, errors = run_in_thread(w)
    started.wait(10)
    go.set()
    wait_for(lambda: len(reasons) == 2, 10, "both handlers to stop")
    assert reasons == {"job_c": "canceled", "job_l": "lease_lost"}
    w.drain()
    t.join(20)
    assert not errors
    # the canceled job is reported (fail, canceled); the lost one is not
    assert [b["error_code"] for b in fake.sent("/workers/jobs/job_c/fail")] == ["canceled"]
    assert fake.sent("/workers/jobs/job_l/fail") == [] and fake.sent("/workers/jobs/job_l/complete") == []
    # after the cancel, job_c is named among known_cancels (no answer at once again), job_l no longer
    assert known_bodies and all(b["current_jobs"] == ["job_c"] and b["known_cancels"] == ["job_c"]
                                for b in known_bodies)
    assert all(b["wait_seconds"] == 25 and b["draining"] is False for b in fake.sent("/workers/signals"))


def test_a_drain_signal_drains_the_worker(fake):
    base_routes(fake)
    fake.routes["/workers/signals"] = lambda b: (200, {"cancel_jobs": [], "lost_jobs": [], "drain": True,
                                                       "server_time": now_rfc3339()})
    w = new(fake)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    t.join(20)
    assert not t.is_alive() and not errors  # run() returned: drained
    assert fake.sent("/workers/signals")[0]["draining"] is False


def test_a_drain_in_a_heartbeat_answer_drains_the_worker(fake):
    base_routes(fake)
    fake.routes["/workers/heartbeat"] = lambda b: (200, heartbeat_answer(drain=True))
    w = new(fake, signals_wait=None)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    t.join(20)
    assert not t.is_alive() and not errors
    assert fake.sent("/workers/signals") == []


def test_a_ban_ending_the_signals_poll_stops_the_worker(fake):
    base_routes(fake)
    fake.routes["/workers/signals"] = lambda b: error(403, "worker_banned")
    w = new(fake)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    t.join(20)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], APIError) and errors[0].code == "worker_banned"


def test_signals_retry_with_backoff_after_errors(fake):
    base_routes(fake)
    n = {"calls": 0}

    def flaky(body):
        n["calls"] += 1
        if n["calls"] <= 2:
            return error(503, "unavailable")
        return idle_signals(body)
    fake.routes["/workers/signals"] = flaky
    w = new(fake)
    w.job("t")(lambda ctx: None)
    t, errors = run_in_thread(w)
    fake.wait_for(lambda: len(fake.sent("/workers/signals")) >= 4, 20, "signals to be retried")
    w.drain()
    t.join(20)
    assert not errors


def test_client_checks_the_new_fields(fake):
    base_routes(fake)
    c = nodelane.Client(fake.url, token_identity(), max_attempts=1)
    with pytest.raises(ConfigError):
        c.signals(wait_seconds=61)
    with pytest.raises(ConfigError):
        c.signals(current_jobs=["j%d" % i for i in range(257)])
    with pytest.raises(ConfigError):
        c.signals(known_cancels=[""])
    with pytest.raises(ConfigError):
        c.heartbeat("idle", [], leases_through="yesterday")
    with pytest.raises(ConfigError):
        c.heartbeat("idle", ["x" * 256])
    with pytest.raises(ConfigError):
        nodelane.Client(fake.url, Identity(Signer())).start()  # no token
    with pytest.raises(ConfigError):
        Worker(fake.url, signals_wait=0)
    with pytest.raises(ConfigError):
        Worker(fake.url, signals_wait=61)
    fake.routes["/workers/signals"] = lambda b: (200, {"cancel_jobs": None, "server_time": now_rfc3339()})
    ans = c.signals(wait_seconds=0, current_jobs=["job_1"], known_cancels=["job_1"], draining=True)
    assert ans["cancel_jobs"] == [] and ans["lost_jobs"] == [] and ans["drain"] is False
    assert fake.sent("/workers/signals")[-1] == {"wait_seconds": 0, "current_jobs": ["job_1"],
                                                 "known_cancels": ["job_1"], "draining": True}
    ans = c.start(["job_1"], name="n", capabilities={"job_types": ["t"]}, tags=None)
    assert ans["worker_id"] == "wrk_fake"
    assert fake.sent("/workers/start")[-1] == {"name": "n", "capabilities": {"job_types": ["t"]},
                                               "current_jobs": ["job_1"]}
    # a lease answer without server_time gets the Date header's, rounded down
    fake.routes["/workers/jobs/lease"] = lambda b: (200, {"leases": []})
    before = time.time()
    st = c.lease()["server_time"]
    assert st.endswith("Z") and int(before) - 1 <= nodelane.client.unix_seconds(st) <= time.time()


def test_a_new_job_restarts_the_long_poll_to_watch_it(fake):
    """The long-poll open before a job was leased does not watch it: it is cut and opened again."""
    base_routes(fake)
    granted = threading.Event()
    never = threading.Event()
    watching_nothing = threading.Event()

    def lease(body):
        if granted.is_set():
            return idle_lease(body)
        # the job is granted once a long-poll of signals is open, watching nothing
        if not watching_nothing.wait(10):
            return idle_lease(body)
        granted.set()
        return 200, {"leases": [grant("job_n", "t")], "server_time": now_rfc3339()}
    fake.routes["/workers/jobs/lease"] = lease

    def signals(body):
        if "job_n" in body["current_jobs"]:
            return 200, {"cancel_jobs": ["job_n"], "lost_jobs": [], "drain": False, "server_time": now_rfc3339()}
        watching_nothing.set()
        never.wait(body["wait_seconds"])  # a server that answers only at the end of the wait
        return idle_signals(body)
    fake.routes["/workers/signals"] = signals
    ended: "queue.Queue[JobEnd]" = queue.Queue()

    def handler(ctx):
        ctx.cancel_event.wait(10)
        ctx.check()
    # The cancel the new long-poll brings may reach the job before its
    # handler starts (then the handler never runs) or while it runs: either
    # way the job ends canceled, long before the first long-poll's wait.
    w = new(fake, on_job_end=ended.put)
    w.job("t")(handler)
    t, errors = run_in_thread(w)
    try:
        end = ended.get(timeout=10)
        assert end.job["id"] == "job_n" and end.outcome == "canceled"
        first = fake.sent("/workers/signals")[0]
        assert first["current_jobs"] == []
    finally:
        w.drain()
        t.join(20)
        never.set()
    assert not errors
