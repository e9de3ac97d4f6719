"""What upload_file and download_file send and do with answers, against a stand-in (fakestore.py) with
small parts and injected faults. The same behaviours run against the real server in test_artifacts.py."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import tracemalloc

import pytest

from nodelane import APIError, ArtifactMismatch, ArtifactStorageOff, Cancelled, Client, Identity, LeaseLost, Signer
from nodelane import VerificationError, download_file, upload_file
from nodelane.artifacts import Stop

from fakestore import LEASE, FakeStore
from fakeserver import now_rfc3339


@pytest.fixture
def client_of():
    stores = []

    def make(**kw):
        s = FakeStore(**kw)
        stores.append(s)
        ident = Identity(Signer())
        ident.set_registration("node-fake", "wrk_fake", "nlc_faketoken", now_rfc3339(30 * 86400))
        return s, Client(s.url, ident, timeout=10, max_attempts=2, retry_base=0.01)
    yield make
    for s in stores:
        s.close()


def data_file(tmp_path, size: int, name: str = "blob.bin") -> "tuple[str, bytes]":
    data = os.urandom(size)
    p = tmp_path / name
    p.write_bytes(data)
    return str(p), data


def test_parts_are_signed_streamed_and_a_cut_part_is_sent_again_alone(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16)
    path, data = data_file(tmp_path, 3 * (1 << 16) + 123)  # 4 parts, the last short
    store.cut_parts[2] = 1
    ans = upload_file(client, "job_1", LEASE, path, name="blob.bin", artifact_type="checkpoint",
                      metadata={"step": 3})
    assert ans == {"artifact_id": "art_1", "receipt_id": "rct_1", "stored": True}
    assert store.stored() == data
    assert [p for p, _, _ in store.puts] == [1, 2, 2, 3, 4]  # only the cut part again
    assert store.puts[1][2] < 1 << 16  # it was cut mid-body
    up = store.upload
    assert (up["size_bytes"], up["checksum_sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert up["artifact_type"] == "checkpoint" and up["name"] == "blob.bin"
    fin = store.finished[0]
    assert fin["upload_id"] == "upl_x" and fin["metadata"] == {"step": 3} and "uri" not in fin
    assert fin["checksum_sha256"] == up["checksum_sha256"] and fin["size_bytes"] == len(data)


def test_memory_stays_bounded_whatever_the_file_size(client_of, tmp_path):
    """48 MiB in 16 MiB parts: the SDK holds a block or two (1 MiB) at a time, never a part or the file."""
    store, client = client_of(part_size=16 << 20, discard=True)
    p = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(p, "wb") as f:
        for _ in range(48):
            b = os.urandom(1 << 20)
            f.write(b)
            h.update(b)
    del b
    tracemalloc.start()
    try:
        ans = upload_file(client, "job_1", LEASE, str(p), name="big.bin", artifact_type="file")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ans["stored"] and store.running.hexdigest() == h.hexdigest()
    assert [n for _, _, n in store.puts] == [16 << 20] * 3
    assert peak < 6 << 20, "peak %d bytes" % peak


def test_an_expired_upload_is_asked_for_again_once(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16)
    path, data = data_file(tmp_path, 3 << 16)
    store.expire_at_part = 2
    assert upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file")["stored"]
    assert store.uploads == 2 and store.stored() == data
    assert [p for p, _, _ in store.puts] == [1, 1, 2, 3]  # the expired answer is no put; all parts anew


def test_an_empty_file_is_one_empty_part(client_of, tmp_path):
    store, client = client_of()
    path, _ = data_file(tmp_path, 0)
    upload_file(client, "job_1", LEASE, path, name="empty", artifact_type="file")
    assert [(p, n) for p, _, n in store.puts] == [(1, 0)]


def test_presigned_parts_carry_no_credential(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16, direct=True)
    path, data = data_file(tmp_path, 2 * (1 << 16) + 1)
    store.cut_parts[1] = 1
    assert upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file")["stored"]
    assert store.stored() == data
    assert [p for p, _, _ in store.puts] == [1, 1, 2, 3]
    for _, h, _ in store.puts:  # the fake refuses with 403 any credential; check what was sent anyway
        assert h["x-test-store"] == "yes"
        assert not {"authorization", "signature", "signature-input", "nodelane-lease-token"} & set(h)


def test_a_store_refusal_is_not_retried_and_keeps_its_signature_out_of_the_error(client_of, tmp_path, caplog):
    store, client = client_of(direct=True)
    store.bucket_error = (403, b"<?xml version='1.0'?><Error><Code>SignatureDoesNotMatch</Code>"
                               b"<StringToSign>AWS4-HMAC-SHA256 sekrit</StringToSign>"
                               b"<SignatureProvided>deadbeefsekrit</SignatureProvided></Error>")
    path, _ = data_file(tmp_path, 10)
    with pytest.raises(APIError) as ei:
        upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file")
    assert (ei.value.status, ei.value.code) == (403, "SignatureDoesNotMatch")
    assert "sekrit" not in str(ei.value) and "X-Sig" not in str(ei.value) and "sekrit" not in caplog.text
    assert len(store.puts) == 1 and store.finished == []


def test_a_file_changed_after_hashing_is_refused(client_of, tmp_path):
    store, client = client_of()
    path, data = data_file(tmp_path, 3 << 16)

    def corrupt(checksum: str, size: int) -> None:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\0" * 16)
    with pytest.raises(ArtifactMismatch) as ei:
        upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file", on_hashed=corrupt)
    assert ei.value.status == 422 and ei.value.code == "artifact_mismatch"


def test_storage_off_and_an_older_server_raise_storage_off(client_of, tmp_path):
    store, client = client_of(storage=False)
    path, _ = data_file(tmp_path, 10)
    with pytest.raises(ArtifactStorageOff):
        upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file")
    assert store.puts == []


def test_lease_lost_is_raised(client_of, tmp_path):
    _, client = client_of()
    path, _ = data_file(tmp_path, 10)
    with pytest.raises(LeaseLost):
        upload_file(client, "job_1", "nll_other", path, name="x", artifact_type="file")


def test_tries_are_bounded(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16)
    path, _ = data_file(tmp_path, 2 << 16)
    store.cut_parts[2] = 10
    with pytest.raises(Exception) as ei:
        upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file", part_attempts=3)
    assert "part 2" in str(ei.value) or "parts" in str(ei.value)
    assert [p for p, _, _ in store.puts] == [1, 2, 2, 2]
    assert store.finished == []


def test_too_many_uploads_is_waited_out_without_using_a_try(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16)
    path, data = data_file(tmp_path, 2 << 16)
    store.busy_parts[1] = 3  # more 429s than the two tries allowed
    t0 = time.monotonic()
    upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file", part_attempts=2)
    assert time.monotonic() - t0 >= 3  # Retry-After: 1, three times
    assert [p for p, _, _ in store.puts] == [1, 1, 1, 1, 2] and store.stored() == data


def test_stop_cuts_an_upload_in_flight(client_of, tmp_path):
    store, client = client_of(part_size=1 << 16, direct=True)
    store.bucket_delay = 30  # the bucket holds the first part's answer
    path, _ = data_file(tmp_path, 2 << 16)
    stop = Stop(reason=lambda: "drained")
    threading.Timer(0.5, stop.stop).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled) as ei:
        upload_file(client, "job_1", LEASE, path, name="x", artifact_type="file", stop=stop)
    assert ei.value.reason == "drained"
    assert time.monotonic() - t0 < 10
    assert store.finished == []


def test_download_resumes_with_range_and_checks_the_digest(client_of, tmp_path):
    store, client = client_of()
    store.content = os.urandom(300_000)
    store.cut_content = 1
    want = {"artifact_id": "art_1", "name": "ckpt", "size_bytes": len(store.content),
            "checksum_sha256": hashlib.sha256(store.content).hexdigest()}
    dest = str(tmp_path / "ckpt")
    assert download_file(client, "job_1", LEASE, want, dest) == dest
    assert open(dest, "rb").read() == store.content
    assert store.ranges[0] == "" and store.ranges[1].startswith("bytes=") and store.ranges[1] != "bytes=0-"

    bad = dict(want, checksum_sha256="0" * 64)
    with pytest.raises(VerificationError):
        download_file(client, "job_1", LEASE, bad, dest)
    assert not os.path.exists(dest)


def test_download_from_a_presigned_url_sends_no_credential(client_of, tmp_path):
    store, client = client_of()
    store.content = b"checkpoint bytes"
    want = {"artifact_id": "art_1", "name": "ckpt", "size_bytes": len(store.content),
            "checksum_sha256": hashlib.sha256(store.content).hexdigest(), "url": store.url + "/bucket/1?X-Sig=s"}
    dest = download_file(client, "job_1", LEASE, want, str(tmp_path / "c"))
    assert open(dest, "rb").read() == store.content
