"""Artifact bytes: upload a file to the control plane's store in parts, and download a stored one.

upload_file follows PROTOCOL.md §5.19–§5.20: it hashes the file (streaming),
asks for an upload (POST /workers/jobs/{id}/uploads), sends each part — a
signed PUT to the control plane, or a plain PUT without credentials to the
presigned URL of the bucket with the headers the answer gives — and finishes
with POST /workers/jobs/{id}/artifacts carrying the upload_id, which the
control plane answers only once it has checked the stored bytes against the
declared size and SHA-256. A part that fails (no answer, a cut connection,
5xx, 429) is sent again, alone, after a backoff, up to part_attempts times:
that is how a dropped connection resumes. A file is never held whole in
memory: each part is read twice, once for its Content-Digest, once as it is
sent.

download_file fetches a stored artifact of the job (the checkpoint a grant's
resume_from names, §5.21), resuming a cut transfer with Range, and checks its
size and SHA-256 before it keeps the file.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import random
import re
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Set

from .client import STREAM_BLOCK, Abort, Client, Connection, Response, api_error
from .errors import (APIError, ArtifactStorageOff, Cancelled, ConfigError, LeaseLost, NodelaneError,
                     TransportError, VerificationError)
from .signing import digest_header

#: How many times one part (or one download) is tried before its error is raised.
DEFAULT_PART_ATTEMPTS = 5
#: The backoff between tries of a part: a random delay in [0, base * 2^(try-1)], at most max.
PART_RETRY_BASE = 0.5
PART_RETRY_MAX = 15.0
#: How long 429 too_many_uploads answers are waited out for one part, in seconds (they use no try).
PART_BUSY_PATIENCE = 600.0
#: The time a part is given beyond the client's timeout, per MiB, in seconds.
SECONDS_PER_MIB = 0.5

_log = logging.getLogger("nodelane.artifacts")


class Stop:
    """What stops an upload or a download: an Event, the reason to give, and the connections in flight.

    stop() sets the event and cuts every connection in flight; a transfer
    then raises Cancelled(reason()). A JobContext has one.
    """

    def __init__(self, event: Optional[threading.Event] = None,
                 reason: Optional[Callable[[], Optional[str]]] = None):
        self.event = event or threading.Event()
        self._reason = reason or (lambda: None)
        self._mu = threading.Lock()
        self._aborts: Set[Abort] = set()

    def reason(self) -> str:
        """Why it stopped ("canceled" when no one said)."""
        return self._reason() or "canceled"

    def check(self) -> None:
        """Raise Cancelled once stopped."""
        if self.event.is_set():
            raise Cancelled(self.reason())

    def stop(self) -> None:
        """Stop: set the event and cut the connections in flight."""
        self.event.set()
        with self._mu:
            aborts = list(self._aborts)
        for a in aborts:
            a.abort()

    def abort(self) -> Abort:
        """A new Abort that stop() cuts; give it back with done()."""
        a = Abort()
        with self._mu:
            self._aborts.add(a)
        if self.event.is_set():
            a.abort()
        return a

    def done(self, a: Abort) -> None:
        """Forget an Abort of abort()."""
        with self._mu:
            self._aborts.discard(a)

    def wait(self, seconds: float) -> None:
        """Wait seconds, and raise Cancelled as soon as stopped."""
        self.event.wait(seconds)
        self.check()


class FileSlice:
    """A reader of bytes [offset, offset+size) of a file, in blocks, that raises Cancelled once stopped.

    It is what a part's body is streamed from: at most one block in memory.
    """

    def __init__(self, path: str, offset: int, size: int, stop: Optional[Stop] = None):
        self._f = open(path, "rb")
        self._f.seek(offset)
        self._left = size
        self._stop = stop
        self.sent = 0

    def read(self, n: int = -1) -> bytes:
        """Up to n bytes, at most one block (STREAM_BLOCK); b"" at the end of the slice."""
        if self._stop is not None:
            self._stop.check()
        if self._left <= 0:
            return b""
        if n is None or n < 0 or n > self._left:
            n = self._left
        b = self._f.read(min(n, STREAM_BLOCK))
        if not b:
            raise OSError("the file is shorter than when it was hashed")
        self._left -= len(b)
        self.sent += len(b)
        return b

    def close(self) -> None:
        """Close the file."""
        self._f.close()

    def __enter__(self) -> "FileSlice":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def hash_file(path: str, offset: int = 0, size: Optional[int] = None, stop: Optional[Stop] = None) -> Any:
    """The hashlib SHA-256 object of bytes [offset, offset+size) of a file (all from offset when size
    is None), read in blocks; OSError when the file ends before offset+size."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left is None or left > 0:
            if stop is not None:
                stop.check()
            b = f.read(STREAM_BLOCK if left is None else min(STREAM_BLOCK, left))
            if not b:
                if left is not None:
                    raise OSError("the file is shorter than when it was hashed")
                break
            h.update(b)
            if left is not None:
                left -= len(b)
    return h


def file_digest(path: str, stop: Optional[Stop] = None) -> "tuple[str, int]":
    """The SHA-256 (64 lowercase hex) and size of a whole file, read in blocks."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            if stop is not None:
                stop.check()
            b = f.read(STREAM_BLOCK)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def _check_parts(ans: Dict[str, Any], size: int) -> List[Dict[str, Any]]:
    """The upload answer's parts, checked to cover [0, size) in order."""
    parts = ans.get("parts")
    if not isinstance(parts, list) or not parts or not isinstance(ans.get("upload_id"), str):
        raise APIError(201, "", "the upload answer has no upload_id or parts", route="uploads")
    at = 0
    for i, p in enumerate(parts):
        ok = (isinstance(p, dict) and p.get("part_number") == i + 1 and p.get("offset") == at
              and isinstance(p.get("size_bytes"), int) and p["size_bytes"] >= 0 and isinstance(p.get("url"), str)
              and (p.get("method") or "PUT") == "PUT")
        if not ok:
            raise APIError(201, "", "the upload answer's part %d is not the next slice of the file" % (i + 1),
                           route="uploads")
        at += p["size_bytes"]
    if at != size:
        raise APIError(201, "", "the upload answer's parts hold %d bytes, not %d" % (at, size), route="uploads")
    return parts


def _origin_target(url: str) -> "tuple[str, str]":
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ConfigError("a presigned URL is an absolute http(s) URL")
    target = (u.path or "/") + ("?" + u.query if u.query else "")
    return "%s://%s" % (u.scheme, u.netloc), target


class _PlainConnections:
    """Connections to presigned URLs: no bearer token, no signature, only the headers the answer gave.

    The URL's own signature is its credential, and the control plane chose its
    scheme. Its certificate is checked against the system's roots and the CA
    certificates of the client's ssl_context (a private PKI may serve both).
    """

    def __init__(self, client: Client):
        self._client = client
        self._conns: Dict[str, Connection] = {}
        self._ssl: Optional[ssl.SSLContext] = None

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context()
            own = self._client.conn.ssl_context
            if own is not None:
                for der in own.get_ca_certs(binary_form=True):
                    ctx.load_verify_locations(cadata=der)
            self._ssl = ctx
        return self._ssl

    def get(self, url: str) -> "tuple[Connection, str]":
        origin, target = _origin_target(url)
        c = self._conns.get(origin)
        if c is None:
            c = Connection(origin, timeout=self._client.timeout,
                           ssl_context=self._context() if origin.startswith("https:") else None, insecure_http=True)
            self._conns[origin] = c
        return c, target


def _temporary(e: BaseException) -> bool:
    if isinstance(e, TransportError):
        return True
    if isinstance(e, APIError):
        return e.status >= 500 or e.status in (408, 429) or e.code == "stale_timestamp"
    return False


def upload_file(client: Client, job_id: str, lease_token: str, path: str, *, name: str,
                artifact_type: str, metadata: Optional[Dict[str, Any]] = None, uri: Optional[str] = None,
                stop: Optional[Stop] = None, part_attempts: int = DEFAULT_PART_ATTEMPTS,
                on_answer: Optional[Callable[[Dict[str, Any]], None]] = None,
                on_hashed: Optional[Callable[[str, int], None]] = None) -> Dict[str, Any]:
    """Upload a file as an artifact of a job and return the finish's answer (artifact_id, receipt_id,
    stored, ...), once the control plane has stored and checked its bytes.

    Raises ArtifactStorageOff (the control plane stores no bytes), ArtifactMismatch
    (the bytes stored are not those hashed: the file changed during the upload),
    LeaseLost, Cancelled (stop), APIError or TransportError (a part's tries spent).
    An upload that outlives its upload_id (409 upload_expired) is asked for and
    sent again, once. on_answer gets every answer that carries the lease's expires_at; on_hashed
    (a test's hook) is called with the checksum and size once the file is hashed.
    """
    if part_attempts < 1:
        raise ConfigError("part_attempts is at least 1")
    stop = stop or Stop()
    checksum, size = file_digest(path, stop)
    if on_hashed is not None:
        on_hashed(checksum, size)
    for turn in (1, 2):
        try:
            return _upload_once(client, job_id, lease_token, path, checksum, size, name, artifact_type, metadata,
                                uri, stop, part_attempts, on_answer)
        except APIError as e:
            if e.code != "upload_expired" or turn == 2:
                raise
            # the upload outlived its upload_id (UploadTTL): ask again, once, and send every part anew
            _log.warning("the upload of %s for job %s expired; starting it again", name, job_id)
    raise AssertionError("unreachable")


def _upload_once(client: Client, job_id: str, lease_token: str, path: str, checksum: str, size: int, name: str,
                 artifact_type: str, metadata: Optional[Dict[str, Any]], uri: Optional[str], stop: Stop,
                 part_attempts: int, on_answer: Optional[Callable[[Dict[str, Any]], None]]) -> Dict[str, Any]:
    """Ask for an upload, send its parts, finish it."""
    try:
        ans = client.request_upload(job_id, lease_token, artifact_type, name, size, checksum)
    except APIError as e:
        if e.status == 404 and e.code in ("not_found", "") and not isinstance(e, ArtifactStorageOff):
            # a control plane that predates the upload route stores no bytes either
            raise ArtifactStorageOff(e.status, "artifact_storage_off",
                                     "the control plane has no upload route: %s" % e.message, route=e.route,
                                     request_id=e.request_id) from e
        raise
    if on_answer is not None:
        on_answer(ans)
    parts = _check_parts(ans, size)
    direct = bool(ans.get("direct"))
    plain = _PlainConnections(client)
    for p in parts:
        _send_part(client, plain, job_id, lease_token, path, p, direct, stop, part_attempts, on_answer)
    stop.check()
    wait = min(600.0, size / float(20 << 20)) if direct else min(120.0, size / float(1 << 30))
    fin = client.artifact(job_id, lease_token, artifact_type, name, uri, checksum_sha256=checksum,
                          size_bytes=size, metadata=metadata, upload_id=ans["upload_id"], wait=wait)
    if on_answer is not None:
        on_answer(fin)
    return fin


def _send_part(client: Client, plain: _PlainConnections, job_id: str, lease_token: str, path: str,
               part: Dict[str, Any], direct: bool, stop: Stop, part_attempts: int,
               on_answer: Optional[Callable[[Dict[str, Any]], None]]) -> None:
    """Send one part until it is stored, its tries are spent, or stop."""
    n, offset, size = part["part_number"], part["offset"], part["size_bytes"]
    timeout = client.timeout + SECONDS_PER_MIB * size / float(1 << 20)
    tries = 0
    stale_retried = False
    busy_until = time.monotonic() + PART_BUSY_PATIENCE
    while True:
        stop.check()
        tries += 1
        err: NodelaneError
        abort = stop.abort()
        try:
            if direct:
                resp = _put_direct(plain, part, path, stop, timeout, abort)
                if 200 <= resp.status < 300:
                    return
                err = APIError(resp.status, _store_code(resp.raw), "the store refused part %d" % n,
                               route="presigned PUT", retry_after=_retry_after_of(resp))
            else:
                digest = digest_header(hash_file(path, offset, size, stop).digest())  # read once: the digest
                with FileSlice(path, offset, size, stop) as body:  # and once more: the bytes sent
                    resp = client.put_part(part["url"], lease_token, body, size, digest, timeout=timeout,
                                           abort=abort)
                if resp.status == 200:
                    if on_answer is not None:
                        try:
                            on_answer(resp.json())
                        except ValueError:
                            pass
                    return
                err = api_error(resp, part["url"].split("/uploads/", 1)[0] + "/uploads/{id}/parts/%d" % n,
                                client.clock())
        except TransportError as e:
            err = e
        except OSError as e:  # the file, or the connection while the body was streamed
            if stop.event.is_set():
                raise Cancelled(stop.reason()) from e
            if isinstance(e, (FileNotFoundError, PermissionError)):
                raise
            err = TransportError("part %d" % n, e)
        except http.client.HTTPException as e:
            err = TransportError("part %d" % n, e)
        finally:
            stop.done(abort)
        stop.check()
        if isinstance(err, LeaseLost) or not _temporary(err):
            raise err
        if isinstance(err, APIError) and err.code == "stale_timestamp" and not stale_retried:
            stale_retried = True  # the clock was corrected from the refusal: sign again at once
            tries -= 1
            continue
        d = random.uniform(0, min(PART_RETRY_BASE * 2 ** (tries - 1), PART_RETRY_MAX))
        if isinstance(err, APIError) and err.status == 429:
            tries -= 1  # the server is busy with this worker's other parts: wait, using no try
            d = max(err.retry_after, 0.5) + random.uniform(0, PART_RETRY_BASE)
            if time.monotonic() + d > busy_until:
                raise err
        elif tries >= part_attempts:
            raise err
        else:
            if isinstance(err, APIError) and err.retry_after > 0:
                d = err.retry_after + random.uniform(0, PART_RETRY_BASE)
        _log.warning("part %d of an upload of job %s: %s; sending it again in %.1fs", n, job_id, err, d)
        stop.wait(d)


def _store_code(raw: bytes) -> str:
    """The <Code> of an S3-style error body, or "". Only the code: such a body may quote the string
    the URL's signature signed, and the signature, which must stay out of errors and logs."""
    m = re.search(rb"<Code>([A-Za-z0-9_.-]{1,64})</Code>", raw[:4096])
    return m.group(1).decode("ascii") if m else ""


def _retry_after_of(resp: Response) -> float:
    v = resp.headers.get("retry-after", "")
    return min(float(v), 300.0) if v.isdigit() else 0.0


def _put_direct(plain: _PlainConnections, part: Dict[str, Any], path: str, stop: Stop, timeout: float,
                abort: Abort) -> Response:
    """One plain PUT of a part to its presigned URL: only the headers the answer gave, no credentials."""
    conn, target = plain.get(part["url"])
    headers = {str(k): str(v) for k, v in (part.get("headers") or {}).items()
               if str(k).lower() not in ("authorization", "content-length", "host")}
    with FileSlice(path, part["offset"], part["size_bytes"], stop) as body:
        try:
            return conn.send("PUT", target, body, headers, timeout=timeout, abort=abort, length=part["size_bytes"])
        except (OSError, http.client.HTTPException) as e:
            if stop.event.is_set():
                raise Cancelled(stop.reason()) from e
            raise TransportError("presigned PUT of part %d" % part["part_number"], e) from e


def download_file(client: Client, job_id: str, lease_token: str, resume: Dict[str, Any], dest: str, *,
                  stop: Optional[Stop] = None, attempts: int = DEFAULT_PART_ATTEMPTS) -> str:
    """Download a stored artifact of the job (a grant's resume_from: artifact_id, size_bytes,
    checksum_sha256, url) into the file dest, and return dest once its size and SHA-256 are those
    declared.

    It GETs the presigned url when there is one (no credentials), else the signed
    GET /workers/jobs/{id}/artifacts/{artifact_id}/content; a transfer cut short is
    resumed from the bytes already written (Range). Raises VerificationError when
    the bytes are not those declared (dest is removed), Cancelled, APIError,
    TransportError.
    """
    stop = stop or Stop()
    aid, want_sum, want_size = resume.get("artifact_id"), resume.get("checksum_sha256"), resume.get("size_bytes")
    if not isinstance(aid, str) or not aid or not isinstance(want_sum, str) or not isinstance(want_size, int):
        raise ConfigError("resume_from needs artifact_id, checksum_sha256 and size_bytes")
    url = resume.get("url") or ""
    plain = _PlainConnections(client)
    h = hashlib.sha256()
    got = 0
    tries = 0
    with open(dest, "wb") as out:
        while True:
            stop.check()
            tries += 1
            abort = stop.abort()
            err: Optional[NodelaneError] = None
            try:
                if url:
                    conn, target = plain.get(url)
                    headers = {"Range": "bytes=%d-" % got} if got else {}
                    try:
                        with conn.exchange("GET", target, None, headers, abort=abort) as r:
                            got, h, err = _receive(r, out, h, got, want_size, stop, "presigned GET")
                    except (OSError, http.client.HTTPException) as e:
                        raise TransportError("presigned GET", e) from e
                else:
                    with client.artifact_content(job_id, lease_token, aid, offset=got, abort=abort) as r:
                        got, h, err = _receive(r, out, h, got, want_size, stop, "artifact content")
            except TransportError as e:
                err = e
            finally:
                stop.done(abort)
            if err is None:
                break
            stop.check()
            if isinstance(err, LeaseLost) or not _temporary(err) or tries >= attempts:
                raise err
            d = random.uniform(0, min(PART_RETRY_BASE * 2 ** (tries - 1), PART_RETRY_MAX))
            _log.warning("download of artifact %s for job %s: %s; resuming at byte %d in %.1fs",
                         aid, job_id, err, got, d)
            stop.wait(d)
    if got != want_size or h.hexdigest() != want_sum:
        os.remove(dest)
        raise VerificationError("artifact %s: downloaded %d bytes with sha256 %s; declared %d bytes, sha256 %s"
                                % (aid, got, h.hexdigest(), want_size, want_sum))
    return dest


def _receive(r: http.client.HTTPResponse, out: Any, h: Any, got: int, want: int, stop: Stop,
             route: str) -> "tuple[int, Any, Optional[NodelaneError]]":
    """Append the answer's bytes to out (from byte got) and to the hash h; return the new count, the
    hash, and an error to retry on, if any."""
    if got and r.status == 200:  # the Range was ignored: start again
        out.seek(0)
        out.truncate()
        h, got = hashlib.sha256(), 0
    elif r.status not in (200, 206):
        raw = r.read(1 << 16)
        resp = Response(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)
        if route == "presigned GET":  # a store's error body may quote the URL's signature: keep its code only
            return got, h, APIError(r.status, _store_code(raw), "the store refused the download", route=route,
                                    retry_after=_retry_after_of(resp))
        return got, h, api_error(resp, route, time.time())
    while True:
        stop.check()
        b = r.read(STREAM_BLOCK)
        if not b:
            break
        if got + len(b) > want:
            return got, h, VerificationError("%s: more bytes than the %d declared" % (route, want))
        out.write(b)
        h.update(b)
        got += len(b)
    if got < want:
        return got, h, TransportError(route, ConnectionError("the answer ended at byte %d of %d" % (got, want)))
    return got, h, None
