"""The signed Client against the real server: retries, idempotency keys, clock offset, identity."""

from __future__ import annotations

import os
import threading
import time

import pytest

import nodelane
from nodelane import APIError, Client, ConfigError, Identity, LeaseLost, Signer, TransportError
from nodelane.client import MAX_CLOCK_OFFSET
from nodelane.tokens import random_lease_token

from faultproxy import FaultProxy
from helpers import new_worker, running, unique, wait_for
from serverproc import free_port


def registered(server, url=None, **kw) -> Client:
    c = Client(url or server.url, Signer(), **kw)
    c.register(server.provisioning_token, unique("py-client"),
               capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}], "job_types": kw.pop("types", [])})
    return c


def running_job(server, operator, c: Client):
    """Dispatch a job of a fresh type, register c for it, lease and accept it: (job id, lease token)."""
    jt = unique("idem")
    c.register(server.provisioning_token, c.identity.node_id,
               capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}], "job_types": [jt]})
    jid = operator.dispatch(jt, {})["job"]["id"]
    ans = c.lease(wait_seconds=5, accept=True)
    assert ans["job"]["id"] == jid and ans["job"]["state"] == "running"
    return jid, ans["lease_token"]


def test_same_idempotency_key_gets_the_first_answer(server, operator):
    c = registered(server)
    jid, tok = running_job(server, operator, c)
    key = nodelane.client.new_key()
    first = c.status(jid, tok, "checkpoint", "saved", {"step": 1}, idempotency_key=key)
    time.sleep(1.1)  # a later answer would carry a later expires_at
    again = c.status(jid, tok, "checkpoint", "saved", {"step": 1}, idempotency_key=key)
    assert again == first
    events = [e for e in operator.job(jid)["events"] if e["event_type"] == "checkpoint"]
    assert len(events) == 1
    with pytest.raises(APIError) as ei:  # the same key with another body
        c.status(jid, tok, "checkpoint", "saved", {"step": 2}, idempotency_key=key)
    assert (ei.value.status, ei.value.code) == (422, "idempotency_mismatch")
    a1 = c.artifact(jid, tok, "adapter", "a.bin", "s3://b/a.bin", idempotency_key=key)
    a2 = c.artifact(jid, tok, "adapter", "a.bin", "s3://b/a.bin", idempotency_key=key)
    assert a1 == a2 and len(operator.job(jid)["artifacts"]) == 1
    c.complete(jid, tok)


def test_retry_after_a_lost_answer_gets_the_first_answer(server, operator):
    c = registered(server)
    jid, tok = running_job(server, operator, c)
    for route in ("/status", "/artifacts"):
        proxy = FaultProxy(server.port, route, "drop")
        pc = Client(proxy.url, c.identity, retry_base=0.05, max_attempts=3)
        if route == "/status":
            ans = pc.status(jid, tok, "progress", "once", {"n": 1})
            assert ans["ok"] is True
        else:
            ans = pc.artifact(jid, tok, "adapter", "b.bin", "s3://b/b.bin")
            assert ans["artifact_id"].startswith("art_")
        assert proxy.faults == 1 and len(proxy.paths) == 2  # one answer lost, one retry
        proxy.close()
    jv = operator.job(jid)
    assert [e["message"] for e in jv["events"] if e["event_type"] == "progress"] == ["once"]
    assert [a["name"] for a in jv["artifacts"]] == ["b.bin"]
    c.complete(jid, tok)


def test_a_lost_lease_answer_gets_the_same_grant(server, operator):
    c = registered(server)
    jt = unique("lease_lost_answer")
    c.register(server.provisioning_token, c.identity.node_id, capabilities={"job_types": [jt]})
    jid = operator.dispatch(jt, {})["job"]["id"]
    proxy = FaultProxy(server.port, "/jobs/lease", "drop")
    pc = Client(proxy.url, c.identity, retry_base=0.05, max_attempts=3)
    ans = pc.lease(wait_seconds=2)
    proxy.close()
    assert proxy.faults == 1 and ans["job"]["id"] == jid
    c.accept(jid, ans["lease_token"])  # the lease the retry answered is the job's live lease
    assert operator.job(jid)["job"]["state"] == "running"
    c.complete(jid, ans["lease_token"])


def test_503_with_retry_after_is_retried(server):
    c = registered(server)
    proxy = FaultProxy(server.port, "/workers/heartbeat", "503", count=1, retry_after=1)
    pc = Client(proxy.url, c.identity, retry_base=0.01)
    t0 = time.monotonic()
    assert pc.heartbeat()["ok"] is True
    assert time.monotonic() - t0 >= 1.0 and proxy.faults == 1 and len(proxy.paths) == 2
    proxy.close()
    proxy = FaultProxy(server.port, "/workers/heartbeat", "503", count=5, retry_after=0)
    pc = Client(proxy.url, c.identity, retry_base=0.01, max_attempts=3)
    with pytest.raises(APIError) as ei:
        pc.heartbeat()
    assert (ei.value.status, ei.value.code) == (503, "unavailable") and len(proxy.paths) == 3
    proxy.close()


def test_final_errors_are_not_retried(server):
    c = registered(server)
    with pytest.raises(LeaseLost) as ei:
        c.status("job_00000000000000000000000000000000", random_lease_token(), "x")
    e = ei.value
    assert (e.status, e.code) == (409, "lease_lost") and e.request_id and e.server_time
    with pytest.raises(APIError) as ei:
        c.status("job_x", "nll_short", "x")
    assert (ei.value.status, ei.value.code) == (400, "invalid_request")
    with pytest.raises(TransportError):
        Client("http://127.0.0.1:%d" % free_port(), Signer(), max_attempts=2, retry_base=0.01).heartbeat()
    with pytest.raises(ConfigError):
        c.lease(wait_seconds=61)
    with pytest.raises(ConfigError):
        c.heartbeat("sleeping")
    with pytest.raises(ConfigError):
        c.register("")


def test_worker_with_a_clock_ten_minutes_fast(server, operator):
    # The example server's -clock-skew makes a replica follow the database's clock, which on
    # SQLite is this host's: the skew is the node's here, through the SDK's clock.
    w = new_worker(server, clock=lambda: time.time() + 600)
    jt = unique("skew")
    w.job(jt)(lambda ctx: ctx.sleep(1.5) or {"ok": 1})
    with running(w) as ends:  # register was refused stale_timestamp once, then signed at server time
        off, known = w.client.clock_offset
        assert known and abs(off + 600) < 5, off
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    # Had the worker compared the lease's expires_at (server time) with its own clock, the
    # lease would have looked expired at once and the job been stopped before it ended.
    assert ends[0].outcome == "succeeded", ends[0]
    assert operator.job(jid)["job"]["state"] == "succeeded"


def test_clock_offset_of_a_wrong_local_clock(server):
    c = Client(server.url, Signer(), clock=lambda: time.time() - 600)
    c.register(server.provisioning_token, unique("slow-clock"))
    off, known = c.clock_offset
    assert known and abs(off - 600) < 5
    assert c.heartbeat()["ok"] is True
    # beyond the bound the offset is clamped, and the request stays refused
    far = Client(server.url, Signer(), clock=lambda: time.time() - 2 * 3600)
    with pytest.raises(APIError) as ei:
        far.register(server.provisioning_token, unique("far-clock"))
    assert ei.value.code == "stale_timestamp"
    assert far.clock_offset == (MAX_CLOCK_OFFSET, True)


def test_token_renewal(server):
    c = registered(server)
    old = c.token
    ans = c.renew_token()
    assert c.token == ans["worker_token"] != old
    assert c.heartbeat()["ok"] is True
    r = c.post("/workers/heartbeat", {"status": "idle", "current_jobs": []}, bearer=old)
    assert r.status == 200  # the old token works within its grace


def test_identity_file(tmp_path):
    p = str(tmp_path / "d" / "identity.json")
    a = Identity.load_or_create(p)
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(p)).st_mode & 0o777 == 0o700
    a.set_registration("node-1", "wrk_1", "nlc_secret", "2030-01-01T00:00:00Z")
    b = Identity.load_or_create(p)
    assert (b.node_id, b.worker_id, b.token) == ("node-1", "wrk_1", "nlc_secret")
    assert b.signer.public_key == a.signer.public_key and b.token_expires_at.year == 2030
    assert "nlc_secret" not in repr(b)
    os.chmod(p, 0o644)
    with pytest.raises(ConfigError, match="must be 0600"):
        Identity.load_or_create(p)
    os.chmod(p, 0o600)
    with open(p, "r+", encoding="utf-8") as f:
        text = f.read().replace(a.signer.public_key, Signer().public_key)
        f.seek(0)
        f.write(text)
        f.truncate()
    with pytest.raises(ConfigError, match="does not match"):
        Identity.load_or_create(p)
    with pytest.raises(ConfigError, match="not a regular file"):
        Identity.load_or_create(str(tmp_path))
    link = tmp_path / "link.json"
    link.symlink_to(p)
    with pytest.raises(ConfigError, match="symbolic link"):
        Identity.load_or_create(str(link))


def test_a_banned_worker_stops(server, operator):
    jt = unique("banned")
    w = new_worker(server)
    started = threading.Event()

    @w.job(jt)
    def work(ctx):
        started.set()
        ctx.cancel_event.wait(60)
        ctx.check()

    errors = []
    t = threading.Thread(target=lambda: _run_catching(w, errors), daemon=True)
    t.start()
    operator.dispatch(jt, {})
    assert started.wait(30)
    nodelane.client.expect(operator.post("/operator/workers/%s/ban" % w.identity.worker_id, {"reason": "test"}),
                           "ban", 200)
    t.join(60)
    assert not t.is_alive()
    assert isinstance(errors[0], APIError) and errors[0].code == "worker_banned"


def _run_catching(w, errors):
    try:
        w.run(install_signal_handlers=False)
    except BaseException as e:
        errors.append(e)


def test_plain_http_only_to_this_machine():
    for url in ("http://127.0.0.1:8080", "http://127.0.0.2", "http://[::1]:8080", "http://localhost:8080",
                "https://cp.example.com"):
        Client(url, Signer())
    for url in ("http://cp.example.com", "http://10.0.0.5:8080", "http://[2001:db8::1]/nodelane"):
        with pytest.raises(ConfigError, match="insecure_http"):
            Client(url, Signer())
        Client(url, Signer(), insecure_http=True)  # nothing is sent until a call
    with pytest.raises(ConfigError, match="user information") as ei:
        Client("https://user:secret@cp.example.com", Signer())
    assert "secret" not in str(ei.value)
