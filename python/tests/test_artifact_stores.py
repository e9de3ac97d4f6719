"""Artifact bytes with the server's other stores: an S3-compatible bucket (presigned parts and checkpoint
downloads; NODELANE_TEST_S3, which .ci/run sets), and none at all (metadata only)."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict

import pytest

import nodelane
from nodelane import APIError, JobContext, upload_file

from helpers import new_worker, running, unique, wait_for
from test_artifacts import MiB, artifact_of, lease_one, stored_sha256, write_random


def s3_url() -> str:
    """NODELANE_TEST_S3 (.ci/run starts versitygw and sets it); under CI its absence fails the test."""
    url = os.environ.get("NODELANE_TEST_S3", "")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("NODELANE_TEST_S3 is not set: .ci/run starts an S3-compatible server and sets it")
        pytest.skip("NODELANE_TEST_S3 is not set")
    return url


def test_presigned_parts_and_checkpoint_through_s3(start_server, tmp_path):
    """With an S3 store the parts go to presigned URLs of the bucket (no credential of the control plane
    crosses to it), and a later attempt downloads its checkpoint by a presigned URL too."""
    s = start_server("-artifact-store", s3_url(), "-retry-base", "100ms")
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "python s3 test"}),
                           "/operator/envelope/activate", 200)
    path = str(tmp_path / "ckpt.bin")
    want = write_random(path, 3 * MiB + 1)

    # what the control plane answers: presigned, absolute URLs of the bucket
    c, jid, lease = lease_one(s, op, unique("s3_direct"))
    ans = c.request_upload(jid, lease, "checkpoint", "ckpt.bin", 3 * MiB + 1, want)
    assert ans["direct"] is True
    assert all(p["url"].startswith("http") and "/workers/" not in p["url"] for p in ans["parts"])
    up = upload_file(c, jid, lease, path, name="ckpt.bin", artifact_type="checkpoint")
    assert up["stored"] is True
    assert stored_sha256(op, up["artifact_id"], tmp_path)[:2] == (want, 3 * MiB + 1)

    # the Worker: attempt 1 stores a checkpoint and fails retryably; attempt 2 resumes from it
    jt = unique("s3_resume")
    w = new_worker(s, timeout=30)
    seen: Dict[str, Any] = {}

    @w.job(jt)
    def train(ctx: JobContext) -> Dict[str, Any]:
        if ctx.attempt == 1:
            ctx.upload(path, kind="checkpoint")
            raise nodelane.JobError("preempted", code="preempted", retryable=True)
        seen["resume_from"] = ctx.resume_from
        seen["url"] = ctx.job["resume_from"].get("url") or ""
        with open(ctx.resume_from, "rb") as f:
            seen["sha256"] = hashlib.sha256(f.read()).hexdigest()
        return {"attempt": ctx.attempt}

    with running(w) as ends:
        jid = op.dispatch(jt, {}, max_attempts=3)["job"]["id"]
        wait_for(lambda: any(e.outcome == "succeeded" for e in ends), 90, "the second attempt to succeed")
    assert seen["sha256"] == want
    assert seen["url"].startswith("http") and "/workers/" not in seen["url"]  # read from the bucket
    assert op.job(jid)["job"]["attempt"] == 2


def test_a_server_without_storage_keeps_metadata_only(start_server, tmp_path):
    """-artifact-store off: ctx.upload raises ArtifactStorageOff, or, given a uri, reports the artifact as
    metadata only, as ctx.artifact does."""
    s = start_server("-artifact-store", "off")
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "python storage-off test"}),
                           "/operator/envelope/activate", 200)
    path = str(tmp_path / "a.bin")
    want = write_random(path, 1000)
    jt = unique("nostore")
    w = new_worker(s)
    got: Dict[str, Any] = {}

    @w.job(jt)
    def work(ctx: JobContext) -> None:
        with pytest.raises(nodelane.ArtifactStorageOff) as ei:
            ctx.upload(path)
        got["code"] = ei.value.code
        got["ans"] = ctx.upload(path, kind="adapter", uri="file:///data/a.bin")

    with running(w) as ends:
        jid = op.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: ends, 30, "the job to end")
    assert ends[0].outcome == "succeeded", ends[0]
    assert got["code"] == "artifact_storage_off" and got["ans"]["stored"] is False
    a = artifact_of(op, jid, got["ans"]["artifact_id"])
    assert (a["uri"], a["checksum_sha256"], a["size_bytes"]) == ("file:///data/a.bin", want, 1000)
    assert not a.get("stored")
    with pytest.raises(APIError) as ei:
        op.download(got["ans"]["artifact_id"], str(tmp_path / "none"))
    assert (ei.value.status, ei.value.code) == (404, "not_found")


def test_a_checkpoint_that_does_not_verify_fails_the_attempt(start_server, tmp_path):
    """The checkpoint's bytes are damaged in the server's directory store after they were stored: the next
    attempt's download does not match its SHA-256, and the attempt fails (resume_unavailable, retryable)
    instead of starting over silently; its handler never runs."""
    s = start_server("-retry-base", "100ms")
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "python resume test"}),
                           "/operator/envelope/activate", 200)
    path = str(tmp_path / "ckpt.bin")
    write_random(path, 100_000)
    store_dir = os.path.join(s.dir, "artifacts")  # the default store: a directory beside the database
    jt = unique("badckpt")
    w = new_worker(s)
    attempts = []

    @w.job(jt)
    def train(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        ctx.upload(path, kind="checkpoint")
        parts = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(store_dir, "jobs", ctx.job_id))
                 for f in fs if f == "000001"]  # part 1 (beside it: its .attrs and its .sum chain record)
        assert len(parts) == 1, parts
        with open(parts[0], "r+b") as f:  # same size, other bytes
            f.seek(1000)
            f.write(b"\0" * 100)
        raise nodelane.JobError("preempted", code="preempted", retryable=True)

    with running(w) as ends:
        jid = op.dispatch(jt, {}, max_attempts=2)["job"]["id"]
        wait_for(lambda: len(ends) == 2, 60, "both attempts to end")
    assert attempts == [1]
    job = op.job(jid)["job"]
    assert job["state"] == "failed" and job["attempt"] == 2, job
    assert job["last_error"]["code"] == "resume_unavailable", job["last_error"]
    assert "sha256" in job["last_error"]["message"]
