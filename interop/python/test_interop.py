"""Interop test: the Python worker of nodelane_worker.py against the real Go example server.

Run from the module root:  python3 -m pytest -q interop/python
It builds ./examples/server with `go build`, runs it on 127.0.0.1 with a fresh SQLite file,
and drives it only through the wire protocol of docs/PROTOCOL.md.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import nodelane_worker as nw  # noqa: E402

ORIGIN = nw.DEFAULT_ORIGIN
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
    assert len(nw.check_doc_vectors()) == 4
    base = doc_example("signature-base").rstrip("\n").encode()
    sh = nw.sign_request(nw.Signer.from_seed(nw.DOC_SEED), "POST", "cp.example.com", "/workers/register",
                         nw.DOC_REGISTER_BODY, created=1796029140,
                         nonce=nw.b64url_nopad(b"nodelane-nonce-1"))
    assert sh.base == base


def test_doc_receipts_and_checkpoint():
    ans = json.loads(doc_example("complete-receipts"))
    v = nw.verify_completion(ans, nw.DOC_VKEY, ORIGIN, metrics={"loss": 0.12})
    assert v.checkpoint.size == 3
    assert v.charged["actual_cost_usd"] == "0.000618"
    cp = nw.verify_checkpoint(doc_example("checkpoint"), nw.parse_verifier_key(nw.DOC_VKEY, ORIGIN))
    assert cp.root == base64.b64decode("49++Tai6NErvxYRR+dXl/7BC3TA8eec8P7q3m8OiZIQ=")
    bodies = [doc_example(n).rstrip("\n").encode()
              for n in ("receipt-worker-registered", "receipt-job-completed", "receipt-job-charged")]
    for b in bodies:
        nw.check_fields(nw.decode_canonical(b))
    assert nw.merkle_root([nw.leaf_hash(b) for b in bodies]) == cp.root
    good = bodies[2]
    for bad in (good.replace(b'","', b'", "', 1),           # whitespace
                good.replace(b'"actual_ms":', b'"actual_ms":0', 1),  # leading zero
                b'{"v":1,' + good[1:],                        # a key twice
                good.replace(b'"gpu_count":1', b'"gpu_count":1.0'),
                good.replace(b'"actual_cost_usd":"0.000618","actual_hours":"0.000343"',
                             b'"actual_hours":"0.000343","actual_cost_usd":"0.000618"'),  # order
                good.replace(b'rtx-4090', b'rtx\\u002d4090'),  # needless escape
                good + b"\n"):
        with pytest.raises(nw.VerificationError):
            nw.decode_canonical(bad)
    esc = doc_example("receipt-escapes").rstrip("\n").encode()
    r = nw.decode_canonical(esc)
    nw.check_fields(r)
    assert "\u0001" in r["reason"] and "\u00e9" in r["reason"]


def test_verifier_key_with_plus_in_base64():
    # standard base64 of 0x01 || key may contain "+": the parser must split at the first two "+" only
    for _ in range(64):
        s = nw.Signer()
        vk = "%s+%s+%s" % (ORIGIN, nw.note_key_hash(ORIGIN, s.public_raw).hex(), nw.b64std(b"\x01" + s.public_raw))
        assert nw.parse_verifier_key(vk, ORIGIN).public_key == s.public_raw


def _subproof(m: int, leaves, b: bool):
    """RFC 9162 §2.1.4.1 SUBPROOF, to exercise the §9.2 checker on every size pair."""
    n = len(leaves)
    if m == n:
        return [] if b else [nw.merkle_root(leaves)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return _subproof(m, leaves[:k], b) + [nw.merkle_root(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [nw.merkle_root(leaves[:k])]


def test_proof_algorithms_offline():
    leaves = [nw.leaf_hash(b"leaf %d" % i) for i in range(20)]
    for n in range(1, 21):
        root = nw.merkle_root(leaves[:n])
        for m in range(1, n + 1):
            old = nw.merkle_root(leaves[:m])
            proof = _subproof(m, leaves[:n], True) if m < n else []
            nw.verify_consistency(m, old, n, root, proof)
            if proof:
                bad = list(proof)
                bad[0] = bytes([bad[0][0] ^ 1]) + bad[0][1:]
                with pytest.raises(nw.VerificationError):
                    nw.verify_consistency(m, old, n, root, bad)
        for i in range(n):
            # inclusion path: RFC 9162 §2.1.3.1
            def path(i, ls):
                if len(ls) == 1:
                    return []
                k = 1
                while k * 2 < len(ls):
                    k *= 2
                if i < k:
                    return path(i, ls[:k]) + [nw.merkle_root(ls[k:])]
                return path(i - k, ls[k:]) + [nw.merkle_root(ls[:k])]
            nw.verify_inclusion(leaves[i], i, n, path(i, leaves[:n]), root)


# ---------------------------------------------------------------------------
# The real server
# ---------------------------------------------------------------------------


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def server():
    if shutil.which("go") is None:
        pytest.skip("go toolchain not found")
    tmp = tempfile.mkdtemp(prefix="nodelane-interop-")
    binary = os.path.join(tmp, "server")
    subprocess.run(["go", "build", "-o", binary, "./examples/server"], cwd=ROOT, check=True,
                   timeout=300)
    port = _free_port()
    tokens_file = os.path.join(tmp, "tokens.json")
    log = open(os.path.join(tmp, "server.log"), "wb")
    proc = subprocess.Popen(
        [binary, "-addr", "127.0.0.1:%d" % port, "-db", "sqlite:" + os.path.join(tmp, "db.sqlite"),
         "-secrets-file", os.path.join(tmp, "secrets.json"), "-tokens-file", tokens_file,
         # a price, so that §7's arithmetic is checked on a non-zero cost (the default is 0)
         "-price", "rtx-4090=%d" % RATE_MICRO_USD],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        tokens = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("server exited: " + open(log.name).read())
            try:
                with open(tokens_file, encoding="utf-8") as f:
                    tokens = json.load(f)
                if all(tokens.get(k) for k in ("operator_token", "provisioning_token", "receipt_public_key")):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("tokens file not written in time")
        url = "http://127.0.0.1:%d" % port
        yield {"url": url, "tokens": tokens, "proc": proc, "tmp": tmp}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _gpu_worker(conn: nw.Connection, prov: str, node_id: str):
    w = nw.Worker(conn, nw.Signer())
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
    assert nw.credential_token_ok(prov) and nw.credential_token_ok(op_token)
    vkey = nw.parse_verifier_key(vkey_s, ORIGIN)  # §10.3, §11 step 1
    conn = nw.Connection(server["url"], timeout=10)
    op = nw.Operator(conn, op_token)
    t0 = time.monotonic()

    # 1. register (§5.1)
    w, reg = _gpu_worker(conn, prov, "py-interop-1")
    assert reg["_status"] == 201 and reg["status"] == "registered"
    assert reg["worker_id"].startswith("wrk_") and re.fullmatch(r"wrk_[0-9a-f]{32}", reg["worker_id"])
    assert nw.credential_token_ok(reg["worker_token"])
    nw.parse_api_time(reg["server_time"])
    hb = w.heartbeat("idle")
    assert hb["ok"] is True and hb["worker_id"] == w.worker_id and hb["lost_jobs"] == []

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
    assert nw.lease_token_ok(tok) and lease["lease_id"].startswith("lse_")
    assert lease["leases"][0]["lease_token"] == tok
    jid = job["id"]

    # 3. negative cases on a live lease (§2.3, §3, §4.3, §4.6)
    bad = w.post("/workers/jobs/%s/status" % jid, {"lease_token": nw.random_lease_token(), "event_type": "x"})
    assert (bad.status, bad.error_code) == (409, "lease_lost")
    bad = w.post("/workers/jobs/%s/status" % jid, {"lease_token": "nll_short", "event_type": "x"})
    assert (bad.status, bad.error_code) == (400, "invalid_request")
    with pytest.raises(nw.APIError) as ei:  # complete before accept (§5.8)
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
    hb = w.heartbeat("busy", [jid], {"gpu_util": 0.5})
    assert [x["job_id"] for x in hb["leases"]] == [jid] and hb["lost_jobs"] == []

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
    other = nw.Worker(conn, nw.Signer(), token=w.token)  # right token, another key
    r = other.post("/workers/heartbeat", {"status": "busy"})
    assert (r.status, r.error_code) == (401, "bad_signature")

    # 6. complete (§5.8) and verify offline (§11) with only receipt_public_key
    metrics = {"loss": 0.12, "acc": 1}
    ans = w.complete(jid, tok, output_uri="file:///tmp/out", metrics=metrics, final_message="done")
    assert ans["job"]["state"] == "succeeded" and ans["job"]["receipt_id"] == ans["receipt_id"]
    assert ans["proofs"] and ans["checkpoint"], "no proofs after retries"
    v = nw.verify_completion(json.loads(json.dumps(ans)), vkey_s, ORIGIN, job_id=jid, worker_id=w.worker_id,
                             lease_id=lease["lease_id"], metrics=metrics)
    assert v.completed["job_type"] == "status_check" and v.completed["attempt"] == 1
    assert v.completed["output_uri"] == "file:///tmp/out"
    assert nw.parse_receipt_time(v.completed["started_at"]) == int(
        nw.parse_api_time(acc["job"]["accepted_at"]).timestamp() * 1_000_000)
    assert v.charged["gpu_count"] == 1  # none asked, ran on a GPU SKU (§7)
    assert v.charged["gpu_sku"] == "rtx-4090" and v.charged["rate_usd_per_gpu_hour"] == "1.802000"
    assert v.charged["actual_ms"] >= 1 and ans["actual_cost_usd"] != "0.000000"
    again = w.complete(jid, tok)  # same token: same answer, nothing minted
    assert again["receipt_id"] == ans["receipt_id"]
    assert [x["body"] for x in again["receipts"]] == [x["body"] for x in ans["receipts"]]

    # 7. tampering is refused
    for i in (0, 1):
        t = json.loads(json.dumps(ans))
        raw = base64.b64decode(t["receipts"][i]["body"])
        t["receipts"][i]["body"] = base64.b64encode(_flip(raw, len(raw) // 2)).decode()
        with pytest.raises(nw.VerificationError):
            nw.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    note = t["checkpoint"]
    head, _, sigline = note[:-1].rpartition("\n")
    name, _, b64 = sigline.partition(" ")[2].partition(" ")
    sraw = base64.b64decode(b64)
    t["checkpoint"] = head + "\n\u2014 " + name + " " + base64.b64encode(_flip(sraw, 20)).decode() + "\n"
    with pytest.raises(nw.VerificationError, match="does not verify"):
        nw.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))  # a change of the root line
    lines = t["checkpoint"].split("\n")
    lines[2] = base64.b64encode(_flip(base64.b64decode(lines[2]), 0)).decode()
    t["checkpoint"] = "\n".join(lines)
    with pytest.raises(nw.VerificationError):
        nw.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    t["proofs"][0]["hashes"] = t["proofs"][1]["hashes"]
    with pytest.raises(nw.VerificationError):
        nw.verify_completion(t, vkey_s, ORIGIN)
    t = json.loads(json.dumps(ans))
    t["actual_cost_usd"] = "9.999999"
    with pytest.raises(nw.VerificationError):
        nw.verify_completion(t, vkey_s, ORIGIN)
    with pytest.raises(nw.VerificationError):  # another log's key
        nw.verify_completion(ans, nw.DOC_VKEY, ORIGIN)
    with pytest.raises(nw.VerificationError):  # another origin expected
        nw.verify_completion(ans, vkey_s, "example.org/other")

    # 8. a later checkpoint and a consistency proof (§9.2, §10, §11 step 5, §13)
    witness = nw.Witness(vkey_s, ORIGIN)
    first = witness.update(ans["checkpoint"], op.consistency)
    audit = w.audit([{"event_type": "driver_update", "message": "interop",
                      "payload": {"driver": "1.2.3"}, "occurred_at": "2026-01-01T00:00:00.5Z"}])
    assert len(audit["receipt_ids"]) == 1
    rc = op.receipt(audit["receipt_ids"][0])
    assert rc["proof"] and rc["checkpoint"]
    cp_r = nw.verify_checkpoint(rc["checkpoint"], vkey, ORIGIN)
    na = nw.verify_receipt(rc["receipt"], rc["proof"], cp_r)
    assert na["kind"] == "node_audit" and na["payload_sha256"] == nw.payload_sha256({"driver": "1.2.3"})
    latest_note = op.checkpoint()
    latest = witness.update(latest_note, op.consistency)
    assert latest.size > first.size and latest.size >= cp_r.size
    hashes = op.consistency(first.size, latest.size)
    assert hashes
    with pytest.raises(nw.VerificationError):
        nw.verify_consistency(first.size, first.root, latest.size, latest.root,
                              [base64.b64decode(h) for h in hashes[:-1]])
    with pytest.raises(nw.VerificationError, match="rollback"):
        witness.update(ans["checkpoint"], op.consistency)
    w2 = nw.Witness(vkey_s, ORIGIN)
    w2.update(ans["checkpoint"], op.consistency)
    with pytest.raises(nw.VerificationError):  # a forged consistency proof
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
    op = nw.Operator(nw.Connection(server["url"]), tokens["operator_token"])
    op.dispatch("status_check", {})
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "nodelane_worker.py"), "run", "--url", server["url"],
         "--receipt-public-key", tokens["receipt_public_key"], "--origin", ORIGIN,
         "--node-id", "py-interop-cli", "--wait-seconds", "5"],
        env=dict(os.environ, NODELANE_PROVISIONING_TOKEN=tokens["provisioning_token"]),
        capture_output=True, text=True, timeout=40)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["verified"] is True and res["leased"] is True
