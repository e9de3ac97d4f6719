"""Offline verification of what the real server answered: receipts, proofs, checkpoints, tampering."""

from __future__ import annotations

import base64
import copy
import json

import pytest

import nodelane
from nodelane import DEFAULT_ORIGIN, VerificationError
from nodelane.verify import (leaf_hash, parse_verifier_key, verify_checkpoint, verify_consistency, verify_inclusion,
                             verify_receipt, verify_receipt_response)

from nodelane.vectors import DOC_VKEY

from helpers import new_worker, running, unique, wait_for


def flip(b: bytes, i: int) -> bytes:
    return b[:i] + bytes([b[i] ^ 1]) + b[i + 1:]


@pytest.fixture(scope="module")
def finished(server):
    """A job run to completion by a Worker, with an artifact: the complete answer and its receipt ids."""
    op = nodelane.Operator(server.url, server.operator_token)
    jt = unique("verify")
    w = new_worker(server, wait_for_proofs=True)
    art = {}

    @w.job(jt)
    def job(ctx):
        art.update(ctx.artifact("adapter", "a.bin", "s3://bucket/a.bin", checksum_sha256="ab" * 32, size_bytes=3))
        return {"loss": 0.25}

    with running(w) as ends:
        jid = op.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "succeeded"
    return {"answer": ends[0].answer, "job_id": jid, "worker_id": w.identity.worker_id,
            "artifact_receipt": art["receipt_id"], "op": op}


def test_receipts_fetched_and_verified_offline(server, finished):
    vkey = server.receipt_public_key
    ans = finished["answer"]
    op = finished["op"]
    v = nodelane.verify_completion(json.loads(json.dumps(ans)), vkey, DEFAULT_ORIGIN, job_id=finished["job_id"],
                                   worker_id=finished["worker_id"], metrics={"loss": 0.25})
    assert v.charged["rate_usd_per_gpu_hour"] == "1.802000"
    # each receipt fetched on its own, with its proof and the checkpoint it is against
    for rid in (ans["receipt_id"], ans["receipt_id"] + ".charge", finished["artifact_receipt"]):
        r = verify_receipt_response(op.receipt(rid), vkey, DEFAULT_ORIGIN)
        assert r["id"] == rid
    art = verify_receipt_response(op.receipt(finished["artifact_receipt"]), vkey)
    assert art["kind"] == "artifact_reported" and art["checksum_sha256"] == "ab" * 32
    # the latest checkpoint is consistent with the answer's
    w = nodelane.Witness(vkey, DEFAULT_ORIGIN)
    first = w.update(ans["checkpoint"], op.consistency)
    latest = w.update(op.checkpoint(), op.consistency)
    assert latest.size >= first.size


def test_completion_without_waiting_verified_from_the_receipt_route(server):
    """By default a completion is answered at once, without proofs; its receipts verify from GET /operator/receipts/{id}."""
    vkey = server.receipt_public_key
    op = nodelane.Operator(server.url, server.operator_token)
    jt = unique("nowait")
    w = new_worker(server)
    w.job(jt)(lambda ctx: {"loss": 0.5})
    with running(w) as ends:
        op.dispatch(jt, {})
        wait_for(lambda: ends, 30, "the job to end")
    ans = ends[0].answer
    assert ends[0].outcome == "succeeded"
    assert len(ans["receipts"]) == 2 and ans["proofs"] == [] and ans["checkpoint"] == ""
    with pytest.raises(VerificationError, match="no proofs yet"):
        nodelane.verify_completion(ans, vkey, DEFAULT_ORIGIN)
    for i, rid in enumerate((ans["receipt_id"], ans["receipt_id"] + ".charge")):
        rc = op.receipt(rid)
        assert rc["receipt"]["body"] == ans["receipts"][i]["body"]
        assert verify_receipt_response(rc, vkey, DEFAULT_ORIGIN)["id"] == rid


def test_tampering_is_rejected(server, finished):
    vkey_s = server.receipt_public_key
    vkey = parse_verifier_key(vkey_s, DEFAULT_ORIGIN)
    op = finished["op"]
    rc = op.receipt(finished["answer"]["receipt_id"])
    cp = verify_checkpoint(rc["checkpoint"], vkey)
    verify_receipt(rc["receipt"], rc["proof"], cp)

    # one byte of the receipt's body, anywhere
    body = base64.b64decode(rc["receipt"]["body"])
    for i in range(0, len(body), 7):
        t = copy.deepcopy(rc)
        t["receipt"]["body"] = base64.b64encode(flip(body, i)).decode()
        with pytest.raises(VerificationError):
            verify_receipt(t["receipt"], t["proof"], cp)
    # one bit of a proof hash, a hash dropped, the index moved
    if rc["proof"]["hashes"]:
        for j in range(len(rc["proof"]["hashes"])):
            t = copy.deepcopy(rc)
            h = base64.b64decode(t["proof"]["hashes"][j])
            t["proof"]["hashes"][j] = base64.b64encode(flip(h, 31)).decode()
            with pytest.raises(VerificationError, match="inclusion proof"):
                verify_receipt(t["receipt"], t["proof"], cp)
        t = copy.deepcopy(rc)
        t["proof"]["hashes"].pop()
        with pytest.raises(VerificationError):
            verify_receipt(t["receipt"], t["proof"], cp)
    with pytest.raises(VerificationError):
        verify_inclusion(leaf_hash(body), rc["proof"]["index"] + 1, cp.size,
                         [base64.b64decode(h) for h in rc["proof"]["hashes"]], cp.root)
    # one bit of the checkpoint's signature, of its root, of its size
    note = rc["checkpoint"]
    head, _, sigline = note[:-1].rpartition("\n")
    name, _, b64 = sigline.partition(" ")[2].partition(" ")
    sig = base64.b64decode(b64)
    for i in (4, 20, 67):
        bad = head + "\n\u2014 " + name + " " + base64.b64encode(flip(sig, i)).decode() + "\n"
        with pytest.raises(VerificationError, match="does not verify"):
            verify_checkpoint(bad, vkey)
    lines = note.split("\n")
    bad_root = list(lines)
    bad_root[2] = base64.b64encode(flip(base64.b64decode(lines[2]), 0)).decode()
    bad_size = list(lines)
    bad_size[1] = str(int(lines[1]) + 1)
    for bad in ("\n".join(bad_root), "\n".join(bad_size)):
        with pytest.raises(VerificationError):
            verify_checkpoint(bad, vkey)
    # another log's key, another origin
    with pytest.raises(VerificationError):
        verify_checkpoint(note, parse_verifier_key(DOC_VKEY))
    with pytest.raises(VerificationError):
        verify_receipt_response(rc, vkey_s, "example.org/other")
    # a consistency proof with a flipped hash
    latest = verify_checkpoint(op.checkpoint(), vkey)
    if latest.size > cp.size:
        hashes = [base64.b64decode(h) for h in op.consistency(cp.size, latest.size)]
        verify_consistency(cp.size, cp.root, latest.size, latest.root, hashes)
        with pytest.raises(VerificationError):
            verify_consistency(cp.size, cp.root, latest.size, latest.root, [flip(hashes[0], 5)] + hashes[1:])


def test_verifier_key_and_note_bad_input():
    for bad in ("", "a+b", "nodelane.local/receipts+XYZ+AAAA", "nodelane.local/receipts+31f6a790+notbase64!"):
        with pytest.raises(VerificationError):
            parse_verifier_key(bad)
    vk = parse_verifier_key(DOC_VKEY)
    for bad in ("", "no blank line", "a\n1\nroot\n\n\u2014 x y\n"):
        with pytest.raises(VerificationError):
            verify_checkpoint(bad, vk)
    with pytest.raises(VerificationError, match="no proof"):
        verify_receipt_response({"receipt": {}, "proof": None, "checkpoint": None}, DOC_VKEY)


def test_golden_receipts_of_every_kind_check():
    """Every kind's golden body (receipts/testdata) decodes and checks; a kind or field unknown is refused."""
    import os
    from nodelane.verify import KINDS, check_fields, decode_canonical
    root = os.path.join(os.path.dirname(__file__), "..", "..", "receipts", "testdata")
    names = sorted(n for n in os.listdir(root) if n.endswith(".json"))
    assert sorted(n[:-5] for n in names) == sorted(KINDS)
    for n in names:
        with open(os.path.join(root, n), "rb") as f:
            body = f.read()
        r = decode_canonical(body)
        check_fields(r)
    with open(os.path.join(root, "worker_updated.json"), "rb") as f:
        upd = decode_canonical(f.read())
    for bad in ({"old_max_jobs": "1"}, {"gpus": ""}, {"actor": "op"}):
        r = dict(upd, **bad)
        with pytest.raises(VerificationError):
            check_fields(r)
# The job_failed receipt of a lease that expired after accept, as Go's receipts package encodes it
# (receipts/attempt_test.go): the optional actual_ms, gpu_count and charged of every attempt's end.
ATTEMPT_FAILED = (b'{"actual_ms":600002,"attempt":1,"charged":"no","ended_at":"2026-11-30T09:10:00.001500Z",'
                  b'"error_code":"lease_expired","gpu_count":2,"id":"rcp_expired","job_id":"job_3",'
                  b'"job_type":"lora_train","kind":"job_failed","lease_epoch":2,"lease_id":"lse_3",'
                  b'"outcome":"requeued","policy_version":3,"server_time":"2026-11-30T09:11:00.000000Z",'
                  b'"started_at":"2026-11-30T09:00:00.000000Z","v":1,"worker_id":"wrk_1"}')


def test_attempt_fields():
    from nodelane.verify import check_fields, decode_canonical
    r = decode_canonical(ATTEMPT_FAILED)
    check_fields(r)
    old = dict(r)
    for k in ("actual_ms", "gpu_count", "charged"):
        del old[k]
    check_fields(old)  # a receipt minted before the fields existed
    done = dict(old, kind="job_completed", charged="yes", actual_ms=600002, gpu_count=2)
    del done["outcome"], done["error_code"]
    check_fields(done)
    never = dict(r, error_code="accept_timeout")
    del never["started_at"], never["actual_ms"]
    check_fields(never)
    for bad in (dict(r, actual_ms=600003), dict(r, charged="maybe"), dict(r, charged=True), dict(r, charged=0),
                dict(r, actual_ms=0), dict(r, gpu_count=0), dict(r, outcome="lost"), dict(never, actual_ms=5)):
        with pytest.raises(VerificationError):
            check_fields(bad)
