"""Interop test: the Python SDK (python/nodelane) against the real Go example server.

Run from the module root:  python3 -m pytest -q interop/python
The SDK was first written from docs/PROTOCOL.md alone, as a worker in any language would be; these
tests drive the real server only through the wire protocol of that page (conftest.py builds
./cmd/server with `go build` and runs it on 127.0.0.1 with a fresh SQLite file). The SDK's own
tests are in python/tests.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Dict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from nodelane import client as cl  # noqa: E402
from nodelane import signing as sg  # noqa: E402
from nodelane import tokens as tk  # noqa: E402
from nodelane import vectors  # noqa: E402
from nodelane import verify as vf  # noqa: E402
from nodelane.identity import Identity  # noqa: E402

ORIGIN = vf.DEFAULT_ORIGIN
RATE_MICRO_USD = 1_802_000  # 1.802000 USD per GPU-hour, the price of PROTOCOL.md §7
DOC = os.path.join(ROOT, "docs", "PROTOCOL.md")


# ---------------------------------------------------------------------------
# Offline: the worked examples of PROTOCOL.md
# ---------------------------------------------------------------------------


def doc_example(name: str) -> str:
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    m = re.search(r"<!-- example: %s -->\n```[a-z]*\n(.*?)```" % re.escape(name), doc, re.S)
    assert m, "example %s not in PROTOCOL.md" % name
    return m.group(1)


def test_doc_vectors():
    assert len(vectors.check_doc_vectors()) == 4
    base = doc_example("signature-base").rstrip("\n").encode()
    sh = sg.sign_request(sg.Signer.from_seed(vectors.DOC_SEED), "POST", "cp.example.com", "/workers/register",
                         vectors.DOC_REGISTER_BODY, created=1796029140,
                         nonce=sg.b64url_nopad(b"nodelane-nonce-1"))
    assert sh.base == base


def test_doc_receipts_and_checkpoint():
    ans = json.loads(doc_example("complete-receipts"))
    v = vf.verify_completion(ans, vectors.DOC_VKEY, ORIGIN, metrics={"loss": 0.12})
    assert v.checkpoint.size == 3
    assert v.charged["actual_cost_usd"] == "0.000618"
    cp = vf.verify_checkpoint(doc_example("checkpoint"), vf.parse_verifier_key(vectors.DOC_VKEY, ORIGIN))
    assert cp.root == base64.b64decode("+/7FqpellwXW/XNCluxYU+Z1q1QHxDDBroOnJe/aG+c=")
    bodies = [doc_example(n).rstrip("\n").encode()
              for n in ("receipt-worker-registered", "receipt-job-completed", "receipt-job-charged")]
    for b in bodies:
        vf.check_fields(vf.decode_canonical(b))
    assert vf.merkle_root([vf.leaf_hash(b) for b in bodies]) == cp.root
    good = bodies[2]
    for bad in (good.replace(b'","', b'", "', 1),           # whitespace
                good.replace(b'"actual_ms":', b'"actual_ms":0', 1),  # leading zero
                b'{"v":1,' + good[1:],                        # a key twice
                good.replace(b'"gpu_count":1', b'"gpu_count":1.0'),
                good.replace(b'"actual_cost_usd":"0.000618","actual_hours":"0.000343"',
                             b'"actual_hours":"0.000343","actual_cost_usd":"0.000618"'),  # order
                good.replace(b'rtx-4090', b'rtx\\u002d4090'),  # needless escape
                good + b"\n"):
        with pytest.raises(vf.VerificationError):
            vf.decode_canonical(bad)
    # The ends of leases the control plane makes (§8.4): job_failed with the attempt's GPU time.
    for name in ("receipt-job-failed-expired", "receipt-job-failed-accept-timeout"):
        r = vf.decode_canonical(doc_example(name).rstrip("\n").encode())
        vf.check_fields(r)
        assert r["kind"] == "job_failed" and r["charged"] == "no" and r["gpu_count"] == 1
    assert vf.decode_canonical(bodies[1])["charged"] == "yes"
    esc = doc_example("receipt-escapes").rstrip("\n").encode()
    r = vf.decode_canonical(esc)
    vf.check_fields(r)
    assert "\u0001" in r["reason"] and "\u00e9" in r["reason"]


def test_verifier_key_with_plus_in_base64():
    # standard base64 of 0x01 || key may contain "+": the parser must split at the first two "+" only
    for _ in range(64):
        s = sg.Signer()
        vk = "%s+%s+%s" % (ORIGIN, vf.note_key_hash(ORIGIN, s.public_raw).hex(), sg.b64std(b"\x01" + s.public_raw))
        assert vf.parse_verifier_key(vk, ORIGIN).public_key == s.public_raw


def _subproof(m: int, leaves, b: bool):
    """RFC 9162 §2.1.4.1 SUBPROOF, to exercise the §9.2 checker on every size pair."""
    n = len(leaves)
    if m == n:
        return [] if b else [vf.merkle_root(leaves)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return _subproof(m, leaves[:k], b) + [vf.merkle_root(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [vf.merkle_root(leaves[:k])]


def test_proof_algorithms_offline():
    leaves = [vf.leaf_hash(b"leaf %d" % i) for i in range(20)]
    for n in range(1, 21):
        root = vf.merkle_root(leaves[:n])
        for m in range(1, n + 1):
            old = vf.merkle_root(leaves[:m])
            proof = _subproof(m, leaves[:n], True) if m < n else []
            vf.verify_consistency(m, old, n, root, proof)
            if proof:
                bad = list(proof)
                bad[0] = bytes([bad[0][0] ^ 1]) + bad[0][1:]
                with pytest.raises(vf.VerificationError):
                    vf.verify_consistency(m, old, n, root, bad)
        for i in range(n):
            # inclusion path: RFC 9162 §2.1.3.1
            def path(i, ls):
                if len(ls) == 1:
                    return []
                k = 1
                while k * 2 < len(ls):
                    k *= 2
                if i < k:
                    return path(i, ls[:k]) + [vf.merkle_root(ls[k:])]
                return path(i - k, ls[k:]) + [vf.merkle_root(ls[:k])]
            vf.verify_inclusion(leaves[i], i, n, path(i, leaves[:n]), root)


# ---------------------------------------------------------------------------
# The real server (the `server` fixture is in conftest.py)
# ---------------------------------------------------------------------------


def _gpu_worker(conn: cl.Connection, prov: str, node_id: str):
    w = cl.Client("http://%s:%d" % (conn.host, conn.port), sg.Signer(), timeout=10)
    reg = w.register(prov, node_id, name=node_id, hostname="localhost", endpoint_url=None,
                     role="local_gpu_compute", tags=["interop"], version="nodelane-python/0.1",
                     capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}],
                                   "job_types": ["status_check"]},
                     governor_limits={"max_jobs": 2, "max_vram_mb": 24576}, heartbeat_interval_seconds=30)
    return w, reg


def _flip(b: bytes, i: int) -> bytes:
    return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1:]


def test_full_flow(server):
    tokens = server["tokens"]
    prov, op_token, vkey_s = tokens["provisioning_token"], tokens["operator_token"], tokens["receipt_public_key"]
    assert tk.credential_token_ok(prov) and tk.credential_token_ok(op_token)
    vkey = vf.parse_verifier_key(vkey_s, ORIGIN)  # §10.3, §11 step 1
    conn = cl.Connection(server["url"], timeout=10)
    op = cl.Operator(conn, op_token)
    t0 = time.monotonic()

    # 1. register (§5.1)
    w, reg = _gpu_worker(conn, prov, "py-interop-1")
    assert w.registered_new and reg["status"] == "registered"
    assert reg["worker_id"].startswith("wrk_") and re.fullmatch(r"wrk_[0-9a-f]{32}", reg["worker_id"])
    assert tk.credential_token_ok(reg["worker_token"])
    cl.parse_api_time(reg["server_time"])
    hb = w.heartbeat("idle")
    assert hb["ok"] is True and hb["worker_id"] == w.worker_id and hb["lost_jobs"] == []
    # a start with what it registered (§5.17): nothing changed, nothing held, nothing ended
    st = w.start([], name="py-interop-1", hostname="localhost", role="local_gpu_compute", tags=["interop"],
                 version="nodelane-python/0.1", capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}],
                                                              "job_types": ["status_check"]},
                 governor_limits={"max_jobs": 2, "max_vram_mb": 24576})
    assert st["worker_id"] == w.worker_id and st["status"] == "registered"
    assert (st["changed"], st["receipt_id"], st["ended_jobs"]) == (False, None, [])
    # the control long-poll (§5.18) with nothing held answers at the end of its wait, with nothing
    sig = w.signals(wait_seconds=1)
    assert (sig["cancel_jobs"], sig["lost_jobs"], sig["drain"]) == ([], [], False)

    # 2. lease: nothing queued -> the null answer; then a long poll woken by a dispatch (§5.3)
    empty = w.lease(wait_seconds=1)
    assert empty["lease_token"] is None and empty["job"] is None and empty["leases"] == []
    got: Dict[str, Any] = {}

    def poll():
        try:
            got["lease"] = w.lease(wait_seconds=15)
        except Exception as e:  # surfaced below
            got["error"] = e

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.5)
    disp = op.dispatch("status_check", {})
    assert disp["job"]["state"] == "queued" and disp["job"]["job_type"] == "status_check"
    th.join(timeout=30)
    assert not th.is_alive() and "error" not in got, got
    lease = got["lease"]
    job, tok = lease["job"], lease["lease_token"]
    assert job["id"] == disp["job"]["id"] and job["state"] == "leased" and job["worker_id"] == w.worker_id
    assert tk.lease_token_ok(tok) and lease["lease_id"].startswith("lse_")
    assert lease["leases"][0]["lease_token"] == tok
    jid = job["id"]

    # 3. negative cases on a live lease (§2.3, §3, §4.3, §4.6)
    bad = w.post("/workers/jobs/%s/status" % jid, {"lease_token": tk.random_lease_token(), "event_type": "x"})
    assert (bad.status, bad.error_code) == (409, "lease_lost")
    bad = w.post("/workers/jobs/%s/status" % jid, {"lease_token": "nll_short", "event_type": "x"})
    assert (bad.status, bad.error_code) == (400, "invalid_request")
    with pytest.raises(cl.APIError) as ei:  # complete before accept (§5.8)
        w.complete(jid, tok)
    assert (ei.value.status, ei.value.code) == (409, "invalid_transition")

    # 4. accept, status, log (§5.4-§5.6)
    acc = w.accept(jid, tok)
    assert acc["job"]["state"] == "running" and acc["job"]["accepted_at"]
    assert w.accept(jid, tok)["job"]["state"] == "running"  # idempotent
    st = w.status(jid, tok, "progress", "50%", {"step": 5})
    assert st["ok"] is True and st["cancel_requested"] is False
    lg = w.log(jid, tok, 1, "hello from python", {})
    assert (lg["ok"], lg["accepted"], lg["duplicates"]) == (True, 1, 0)
    lg = w.log(jid, tok, 1, "hello from python", {})  # a retry, newly signed
    assert (lg["accepted"], lg["duplicates"]) == (0, 1)
    hb = w.heartbeat("busy", [jid], {"gpu_util": 0.5}, leases_through=lease["server_time"])
    assert [x["job_id"] for x in hb["leases"]] == [jid] and hb["lost_jobs"] == [] and hb["ended_jobs"] == []

    # 5. request-signing negatives (§4.3, §4.6, §3)
    target, body, headers = w.prepare("/workers/heartbeat", {"status": "busy", "current_jobs": [jid]})
    r1 = conn.send("POST", target, body, headers)
    r2 = conn.send("POST", target, body, headers)  # the very same bytes again
    assert r1.status == 200 and (r2.status, r2.error_code) == (401, "replayed_nonce")
    r = w.post("/workers/heartbeat", {"status": "busy"}, created=int(time.time()) - 3600)
    assert (r.status, r.error_code) == (401, "stale_timestamp")
    target, body, headers = w.prepare("/workers/heartbeat", {"status": "busy"})
    r = conn.send("POST", target, body.replace(b"busy", b"idle"), headers)
    assert (r.status, r.error_code) == (401, "bad_digest")
    target, body, headers = w.prepare("/workers/heartbeat", {"status": "busy"})
    sig = base64.b64decode(headers["Signature"][len("nodelane=:"):-1])
    headers["Signature"] = "nodelane=:" + base64.b64encode(_flip(sig, 10)).decode() + ":"
    r = conn.send("POST", target, body, headers)
    assert (r.status, r.error_code) == (401, "bad_signature")
    r = w.post("/workers/heartbeat", {"status": "busy"}, nonce="short")
    assert (r.status, r.error_code) == (401, "malformed_signature")
    r = conn.send("POST", target, body, {k: v for k, v in headers.items() if k != "Signature"})
    assert (r.status, r.error_code) == (401, "missing_signature")
    r = conn.send("POST", target, body, {k: v for k, v in headers.items() if k != "Authorization"})
    assert (r.status, r.error_code) == (401, "missing_credential")
    other = cl.Client(server["url"], Identity(sg.Signer()))  # right token, another key
    other.identity.token = w.token
    r = other.post("/workers/heartbeat", {"status": "busy"})
    assert (r.status, r.error_code) == (401, "bad_signature")

    # 6. complete (§5.8) and verify offline (§11) with only receipt_public_key
    metrics = {"loss": 0.12, "acc": 1}
    ans = w.complete(jid, tok, output_uri="file:///tmp/out", metrics=metrics, final_message="done",
                     wait_for_proofs=True)
    assert ans["job"]["state"] == "succeeded" and ans["job"]["receipt_id"] == ans["receipt_id"]
    assert ans["proofs"] and ans["checkpoint"], "no proofs after retries"
    v = vf.verify_completion(json.loads(json.dumps(ans)), vkey_s, ORIGIN, job_id=jid, worker_id=w.worker_id,
                             lease_id=lease["lease_id"], metrics=metrics)
    assert v.completed["job_type"] == "status_check" and v.completed["attempt"] == 1
    assert v.completed["output_uri"] == "file:///tmp/out"
    assert vf.parse_receipt_time(v.completed["started_at"]) == int(
        cl.parse_api_time(acc["job"]["accepted_at"]).timestamp() * 1_000_000)
    assert v.charged["gpu_count"] == 1  # none asked, ran on a GPU SKU (§7)
    assert v.charged["gpu_sku"] == "rtx-4090" and v.charged["rate_usd_per_gpu_hour"] == "1.802000"
    assert v.charged["actual_ms"] >= 1 and ans["actual_cost_usd"] != "0.000000"
    again = w.complete(jid, tok)  # same token: same answer, nothing minted
    assert again["receipt_id"] == ans["receipt_id"]
    assert [x["body"] for x in again["receipts"]] == [x["body"] for x in ans["receipts"]]
    assert again["proofs"] and again["checkpoint"]  # sequenced by now: the repeat answers them without waiting

    # 7. tampering is refused
    for i in (0, 1):
        t = json.loads(json.dumps(ans))
        raw = base64.b64decode(t["receipts"][i]["body"])
        t["receipts"][i]["body"] = base64.b64encode(_flip(raw, len(raw) // 2)).decode()
        with pytest.raises(vf.VerificationError):
            vf.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    note = t["checkpoint"]
    head, _, sigline = note[:-1].rpartition("\n")
    name, _, b64 = sigline.partition(" ")[2].partition(" ")
    sraw = base64.b64decode(b64)
    t["checkpoint"] = head + "\n\u2014 " + name + " " + base64.b64encode(_flip(sraw, 20)).decode() + "\n"
    with pytest.raises(vf.VerificationError, match="does not verify"):
        vf.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))  # a change of the root line
    lines = t["checkpoint"].split("\n")
    lines[2] = base64.b64encode(_flip(base64.b64decode(lines[2]), 0)).decode()
    t["checkpoint"] = "\n".join(lines)
    with pytest.raises(vf.VerificationError):
        vf.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    t["proofs"][0]["hashes"] = t["proofs"][1]["hashes"]
    with pytest.raises(vf.VerificationError):
        vf.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    t["actual_cost_usd"] = "9.999999"
    with pytest.raises(vf.VerificationError):
        vf.verify_completion(t, vkey_s, ORIGIN)
    with pytest.raises(vf.VerificationError):  # another log's key
        vf.verify_completion(ans, vectors.DOC_VKEY, ORIGIN)
    with pytest.raises(vf.VerificationError):  # another origin expected
        vf.verify_completion(ans, vkey_s, "example.org/other")

    # 8. a later checkpoint and a consistency proof (§9.2, §10, §11 step 5, §13)
    witness = vf.Witness(vkey_s, ORIGIN)
    first = witness.update(ans["checkpoint"], op.consistency)
    audit = w.audit([{"event_type": "driver_update", "message": "interop",
                      "payload": {"driver": "1.2.3"}, "occurred_at": "2026-01-01T00:00:00.5Z"}])
    assert len(audit["receipt_ids"]) == 1
    rc = op.receipt(audit["receipt_ids"][0])
    assert rc["proof"] and rc["checkpoint"]
    cp_r = vf.verify_checkpoint(rc["checkpoint"], vkey, ORIGIN)
    na = vf.verify_receipt(rc["receipt"], rc["proof"], cp_r)
    assert na["kind"] == "node_audit" and na["payload_sha256"] == vf.payload_sha256({"driver": "1.2.3"})
    latest_note = op.checkpoint()
    latest = witness.update(latest_note, op.consistency)
    assert latest.size > first.size and latest.size >= cp_r.size
    hashes = op.consistency(first.size, latest.size)
    assert hashes
    with pytest.raises(vf.VerificationError):
        vf.verify_consistency(first.size, first.root, latest.size, latest.root,
                              [base64.b64decode(h) for h in hashes[:-1]])
    with pytest.raises(vf.VerificationError, match="rollback"):
        witness.update(ans["checkpoint"], op.consistency)
    w2 = vf.Witness(vkey_s, ORIGIN)
    w2.update(ans["checkpoint"], op.consistency)
    with pytest.raises(vf.VerificationError):  # a forged consistency proof
        w2.update(latest_note, lambda a, b: [base64.b64encode(bytes(32)).decode()] * len(hashes))

    # 9. the operator view agrees
    jv = op.job(jid)
    assert jv["job"]["state"] == "succeeded" and jv["result"]["final_message"] == "done"
    kinds = sorted(e["kind"] for e in jv["events"])
    assert len(kinds) >= 2, jv["events"]

    # 10. the lease token of a finished job is refused
    r = w.post("/workers/jobs/%s/status" % jid, {"lease_token": tok, "event_type": "late"})
    # PROTOCOL.md does not say which of the two; the example server answers invalid_transition.
    assert r.status == 409 and r.error_code in ("lease_lost", "invalid_transition"), (r.status, r.raw)
    assert time.monotonic() - t0 < 45


def test_cli_run(server):
    """The CLI runs one job end to end and verifies its receipts."""
    tokens = server["tokens"]
    op = cl.Operator(cl.Connection(server["url"]), tokens["operator_token"])
    op.dispatch("status_check", {})
    out = subprocess.run(
        [sys.executable, "-m", "nodelane", "run", "--url", server["url"],
         "--receipt-public-key", tokens["receipt_public_key"], "--origin", ORIGIN,
         "--node-id", "py-interop-cli", "--wait-seconds", "5"],
        env=dict(os.environ, NODELANE_PROVISIONING_TOKEN=tokens["provisioning_token"]),
        cwd=os.path.join(ROOT, "python"),
        capture_output=True, text=True, timeout=40)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["verified"] is True and res["leased"] is True
