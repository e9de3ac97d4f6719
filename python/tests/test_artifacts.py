"""Artifact bytes against the real server: ctx.upload in parts, the bytes read back through the operator's
content route, a mismatch refused, a cut connection resumed, and a checkpoint handed to the next attempt
after its worker was killed (ctx.resume_from)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any, Dict

import pytest

import nodelane
from nodelane import APIError, ArtifactMismatch, Client, Identity, JobContext, Signer, download_file, upload_file

from faultproxy import FaultProxy
from helpers import ScriptWorker, job_state, new_worker, running, sequenced_receipt, unique, wait_for

GPUS = {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}
MiB = 1 << 20


def write_random(path: str, size: int) -> str:
    """Write size random bytes to path, in blocks; return their SHA-256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            b = os.urandom(min(left, 4 * MiB))
            f.write(b)
            h.update(b)
            left -= len(b)
    return h.hexdigest()


def stored_sha256(operator: nodelane.Operator, artifact_id: str, tmp_path: Any) -> "tuple[str, int, Dict[str, str]]":
    """The SHA-256 and size of the bytes the operator's content route answers, and its headers."""
    dest = str(tmp_path / ("download-" + artifact_id))
    resp = operator.download(artifact_id, dest)
    assert resp.status == 200
    h = hashlib.sha256()
    n = 0
    with open(dest, "rb") as f:
        for b in iter(lambda: f.read(4 * MiB), b""):
            h.update(b)
            n += len(b)
    os.remove(dest)
    return h.hexdigest(), n, resp.headers


def artifact_of(operator: nodelane.Operator, job_id: str, artifact_id: str) -> Dict[str, Any]:
    arts = [a for a in operator.job(job_id)["artifacts"] if a["artifact_id"] == artifact_id]
    assert len(arts) == 1, operator.job(job_id)["artifacts"]
    return arts[0]


def test_upload_in_parts_and_read_the_bytes_back(server, operator, tmp_path):
    """A 70 MiB file is two parts of the server's default 64 MiB; the job completes only once they are
    stored, and the operator's content route answers the same bytes."""
    jt = unique("upload")
    w = new_worker(server, timeout=60, scratch_dir=str(tmp_path / "scratch"))
    path = str(tmp_path / "adapter.safetensors")
    size = 70 * MiB
    want = write_random(path, size)
    got: Dict[str, Any] = {}

    @w.job(jt)
    def train(ctx: JobContext) -> Dict[str, Any]:
        got["ans"] = ctx.upload(path, kind="adapter", metadata={"rank": 8})
        got["resume_from"] = ctx.resume_from
        return {"loss": 0.1}

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 120, "the job to end")
    assert ends[0].outcome == "succeeded", ends[0]
    ans = got["ans"]
    assert ans["stored"] is True and ans["artifact_id"] and ans["receipt_id"]
    assert got["resume_from"] is None  # a first attempt resumes from nothing
    a = artifact_of(operator, jid, ans["artifact_id"])
    assert (a["name"], a["artifact_type"]) == ("adapter.safetensors", "adapter")
    assert (a["checksum_sha256"], a["size_bytes"], a["metadata"]) == (want, size, {"rank": 8})
    assert a.get("stored") is True
    sha, n, headers = stored_sha256(operator, ans["artifact_id"], tmp_path)
    assert (sha, n) == (want, size)
    assert headers["etag"] == '"%s"' % want
    # the artifact_reported receipt carries the stored bytes' digest and size
    rec = nodelane.verify_receipt_response(sequenced_receipt(operator, ans["receipt_id"]), server.receipt_public_key)
    assert (rec["checksum_sha256"], rec["size_bytes"]) == (want, size), rec


def lease_one(server: Any, operator: nodelane.Operator, jt: str) -> "tuple[Client, str, str]":
    """A fresh node, registered, that leased and accepted one job of type jt: (client, job id, lease token)."""
    c = Client(server.url, Identity(Signer()), timeout=30)
    c.register(server.provisioning_token, node_id=unique("py-art"), capabilities=dict(GPUS, job_types=[jt]))
    jid = operator.dispatch(jt, {})["job"]["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ans = c.lease(wait_seconds=2, supported_job_types=[jt], supported_gpu_skus=["rtx-4090"], accept=True)
        for g in ans["leases"]:
            if g["job"]["id"] == jid:
                return c, jid, g["lease_token"]
    raise AssertionError("job %s not leased" % jid)


def test_bytes_that_do_not_match_the_declared_digest_are_refused(server, operator, tmp_path):
    """The file changes between its hash and its sending: the finish is refused with artifact_mismatch,
    nothing is recorded, and the same lease can upload the right bytes afterwards."""
    jt = unique("mismatch")
    c, jid, lease = lease_one(server, operator, jt)
    path = str(tmp_path / "ckpt.bin")
    write_random(path, 3 * MiB)

    def corrupt(checksum: str, size: int) -> None:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xff" * 64)
    with pytest.raises(ArtifactMismatch) as ei:
        upload_file(c, jid, lease, path, name="ckpt.bin", artifact_type="checkpoint", on_hashed=corrupt)
    assert ei.value.status == 422 and ei.value.code == "artifact_mismatch"
    assert operator.job(jid)["artifacts"] == []
    ans = upload_file(c, jid, lease, path, name="ckpt.bin", artifact_type="checkpoint")
    assert ans["stored"] is True
    want = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert stored_sha256(operator, ans["artifact_id"], tmp_path)[:2] == (want, 3 * MiB)
    assert [a["checksum_sha256"] for a in operator.job(jid)["artifacts"]] == [want]


def test_a_worker_reads_back_a_stored_artifact_of_its_own_job_only(server, operator, tmp_path):
    """download_file: the signed content route of the job's lease (what resume_from uses), with a Range
    resume; another job's lease gets 404."""
    jt = unique("readback")
    c, jid, lease = lease_one(server, operator, jt)
    path = str(tmp_path / "ckpt.bin")
    want = write_random(path, 2 * MiB + 5)
    ans = upload_file(c, jid, lease, path, name="ckpt.bin", artifact_type="checkpoint")
    rf = {"artifact_id": ans["artifact_id"], "name": "ckpt.bin", "size_bytes": 2 * MiB + 5, "checksum_sha256": want}
    dest = download_file(c, jid, lease, rf, str(tmp_path / "back.bin"))
    assert open(dest, "rb").read() == open(path, "rb").read()
    with c.artifact_content(jid, lease, ans["artifact_id"], offset=2 * MiB) as r:  # what a resumed download asks
        assert (r.status, r.read()) == (206, open(path, "rb").read()[2 * MiB:])

    other_c, other_jid, other_lease = lease_one(server, operator, unique("readback_other"))
    with pytest.raises(APIError) as ei:
        download_file(other_c, other_jid, other_lease, rf, str(tmp_path / "no.bin"))
    assert (ei.value.status, ei.value.code) == (404, "not_found")
    with pytest.raises(nodelane.VerificationError):
        download_file(c, jid, lease, dict(rf, checksum_sha256="0" * 64), str(tmp_path / "bad.bin"))
    assert not os.path.exists(str(tmp_path / "bad.bin"))


@pytest.mark.parametrize("fault", ["cut", "drop"])
def test_a_part_whose_connection_is_lost_is_sent_again(server, operator, tmp_path, fault):
    """cut: the connection dies mid-body (the server stores nothing); drop: the part is stored and its
    answer lost. Either way the part alone is sent again and the upload completes with the right bytes."""
    proxy = FaultProxy(server.port, "/parts/", fault=fault, count=1)
    try:
        jt = unique("resume_" + fault)
        w = new_worker(server, url=proxy.url, timeout=60)
        path = str(tmp_path / "out.bin")
        want = write_random(path, 5 * MiB)
        got: Dict[str, Any] = {}

        @w.job(jt)
        def work(ctx: JobContext) -> None:
            got["ans"] = ctx.upload(path)

        with running(w) as ends:
            jid = operator.dispatch(jt, {})["job"]["id"]
            wait_for(lambda: ends, 60, "the job to end")
        assert ends[0].outcome == "succeeded", ends[0]
        assert proxy.faults == 1
        assert len([p for p in proxy.paths if "/parts/" in p]) == 2  # the one part, twice
        sha, n, _ = stored_sha256(operator, got["ans"]["artifact_id"], tmp_path)
        assert (sha, n) == (want, 5 * MiB)
        assert job_state(operator, jid) == "succeeded"
    finally:
        proxy.close()


def test_the_job_completes_after_an_upload_started_in_another_thread(server, operator, tmp_path):
    """The handler returns while its upload (started in a thread, its part held up by a 503) is in flight:
    the job is completed only once the upload is stored, so the artifact is the job's."""
    proxy = FaultProxy(server.port, "/parts/", fault="503", count=1, retry_after=1)
    try:
        jt = unique("background")
        w = new_worker(server, url=proxy.url, timeout=30)
        path = str(tmp_path / "late.bin")
        want = write_random(path, 1 * MiB)
        got: Dict[str, Any] = {}

        @w.job(jt)
        def work(ctx: JobContext) -> None:
            t = threading.Thread(target=lambda: got.update(ans=ctx.upload(path)), daemon=True)
            t.start()
            wait_for(lambda: ctx._uploads > 0, 10, "the upload to start")
            got["returned"] = time.monotonic()

        with running(w) as ends:
            jid = operator.dispatch(jt, {})["job"]["id"]
            wait_for(lambda: ends, 60, "the job to end")
        assert ends[0].outcome == "succeeded", ends[0]
        assert proxy.faults == 1 and got["ans"]["stored"] is True
        a = artifact_of(operator, jid, got["ans"]["artifact_id"])
        assert a["checksum_sha256"] == want
    finally:
        proxy.close()


@pytest.mark.parametrize("how", ["drain", "cancel"])
def test_a_drain_or_cancel_cuts_an_upload_in_flight(server, operator, tmp_path, how):
    """The part is held up (503, Retry-After 30 s, again and again): a drain (after drain_timeout) or an
    operator's cancel stops the upload at once; nothing is recorded, and the job is released or canceled."""
    proxy = FaultProxy(server.port, "/parts/", fault="503", count=1000, retry_after=30)
    try:
        jt = unique("cut_" + how)
        w = new_worker(server, url=proxy.url, drain_timeout=1, drain_grace=5)
        path = str(tmp_path / "big.bin")
        write_random(path, 2 * MiB)
        seen: Dict[str, Any] = {}

        @w.job(jt)
        def work(ctx: JobContext) -> None:
            try:
                ctx.upload(path)
            except nodelane.Cancelled as e:
                seen["reason"] = e.reason
                raise

        with running(w) as ends:
            jid = operator.dispatch(jt, {})["job"]["id"]
            wait_for(lambda: proxy.faults >= 1, 30, "the first part to be held up")
            t0 = time.monotonic()
            if how == "cancel":
                operator.cancel(jid)
                wait_for(lambda: ends, 20, "the job to end")
            else:
                w.drain()
                wait_for(lambda: ends, 20, "the job to end")
            took = time.monotonic() - t0
        assert took < 10
        if how == "cancel":
            assert seen["reason"] == "canceled" and ends[0].outcome == "canceled"
            assert job_state(operator, jid) == "canceled"
        else:
            assert seen["reason"] == "drained" and ends[0].outcome == "released"
            job = operator.job(jid)["job"]
            assert job["state"] == "queued" and job["attempt"] == 1, job
        assert operator.job(jid)["artifacts"] == []
        assert proxy.faults == 1  # no second try of the part after the stop
    finally:
        proxy.close()


def test_the_next_attempt_resumes_from_the_checkpoint_of_a_killed_worker(server, operator, tmp_path):
    """The first attempt stores a checkpoint, then its worker is SIGKILLed; the worker starts again (same
    identity: the job is requeued at once), and the second attempt's ctx.resume_from holds the
    checkpoint's bytes, in the job's scratch directory, removed when the job ends."""
    jt = unique("ckpt")
    ident, node = str(tmp_path / "identity.json"), unique("py-ckpt")
    scratch = str(tmp_path / "scratch")
    first = ScriptWorker(server, tmp_path, "artifact_worker.py", ident, node, jt, scratch, expect_timeout=60)
    second = None
    try:
        first.expect("started")
        jid = operator.dispatch(jt, {"size": 3 * MiB + 17}, max_attempts=3)["job"]["id"]
        e = first.expect("job")
        assert (e["job"], e["attempt"], e["resumed"]) == (jid, 1, None)
        up = first.expect("uploaded")
        assert up["stored"] is True
        first.proc.kill()  # SIGKILL: mid-job, after the checkpoint was stored
        first.proc.wait(timeout=10)

        second = ScriptWorker(server, tmp_path, "artifact_worker.py", ident, node, jt, scratch, expect_timeout=60)
        e = second.expect("job")
        assert (e["job"], e["attempt"]) == (jid, 2)
        assert e["resumed"] is not None, "the second attempt got no resume_from"
        assert (e["resumed"]["sha256"], e["resumed"]["size"]) == (up["sha256"], 3 * MiB + 17)
        assert e["resumed"]["path"].startswith(scratch + os.sep)
        end = second.expect("ended")
        assert (end["job"], end["outcome"]) == (jid, "succeeded")
        assert operator.job(jid)["result"]["metrics"] == {"resumed_sha256": up["sha256"]}
        assert not os.path.exists(e["resumed"]["path"])  # the job's scratch directory is gone
    finally:
        first.stop()
        if second is not None:
            second.stop()

