"""A signed HTTP client for the worker routes of docs/PROTOCOL.md §5, on the standard library.

Client signs every attempt of every request afresh (§3: a retry is a new
request with a new nonce and `created`), retries what may succeed later
(no answer, 5xx, 429, honouring Retry-After) with full-jitter backoff,
sends the same `request_id` / `idempotency_key` on every attempt of a call
so that a retry after a lost answer gets the first answer (§5.16), and
corrects the node's clock from the server's (§4.3). Operator is the few
operator routes (§13) a test or a verifier needs.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import http.client
import ipaddress
import json
import logging
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import APIError, ArtifactMismatch, ArtifactStorageOff, ConfigError, LeaseLost, TransportError
from .identity import Identity
from .times import parse_api_time, unix_seconds
from .signing import CONTENT_TYPE, Signer, authority_for_signing, b64url_nopad, sign_request

#: The default bound of one attempt of one request, in seconds (a long-poll adds its wait).
DEFAULT_TIMEOUT = 30.0
#: How many times one call is sent before its error is raised.
DEFAULT_MAX_ATTEMPTS = 5
#: The backoff between attempts: a random delay in [0, base * 2^(attempt-1)], at most max.
DEFAULT_RETRY_BASE = 0.25
DEFAULT_RETRY_MAX = 15.0
#: The bound of the clock offset a Client adopts, in seconds (the Go client's MaxClockOffset).
MAX_CLOCK_OFFSET = 3600.0
#: The longest Retry-After honoured, in seconds.
MAX_RETRY_AFTER = 300.0
#: The most bytes of an answer read.
MAX_ANSWER_BYTES = 16 << 20
#: The block size a streamed body (an artifact's part) is sent in.
STREAM_BLOCK = 1 << 20
#: The header that carries the lease token on the routes whose body is not JSON (PROTOCOL.md §5.20).
LEASE_TOKEN_HEADER = "Nodelane-Lease-Token"
#: The Content-Type of an artifact's bytes.
OCTET_STREAM = "application/octet-stream"
#: The User-Agent sent.
USER_AGENT = "nodelane-python/0.1"

_log = logging.getLogger("nodelane")


def dumps(obj: Any) -> bytes:
    """JSON without insignificant whitespace, UTF-8: the bytes a request body is sent as."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def new_key() -> str:
    """A random request_id / idempotency_key: 16 random bytes in 22 base64url characters (§5.16)."""
    return b64url_nopad(os.urandom(16))


@dataclass
class Response:
    """One HTTP answer: its status, headers (names lowercased) and raw body."""

    status: int
    headers: Dict[str, str]
    raw: bytes

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.raw.decode("utf-8"))

    @property
    def error_code(self) -> Optional[str]:
        """The PROTOCOL.md error code of the body, or None."""
        try:
            return self.json()["error"]["code"]
        except Exception:
            return None


class Abort:
    """A handle that cuts the request in flight (a long-poll) from another thread.

    Pass it to a call; abort() closes the connection of the attempt under way
    and makes later attempts fail at once with a TransportError.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None
        self.aborted = False

    def _set(self, conn: Optional[http.client.HTTPConnection]) -> None:
        with self._mu:
            self._conn = conn
            if conn is not None and self.aborted:
                raise TransportError("abort", ConnectionAbortedError("aborted"))

    def abort(self) -> None:
        """Close the connection in flight, if any; every later attempt fails."""
        with self._mu:
            self.aborted = True
            conn = self._conn
            # the sender closes its connection only after _set(None), which takes the lock
            sock = conn.sock if conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def is_loopback(host: str) -> bool:
    """Whether a URL's host name is this machine: localhost or a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Connection:
    """One control plane's address: scheme, host, port and the prefix it is mounted under."""

    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT,
                 ssl_context: Optional[ssl.SSLContext] = None, insecure_http: bool = False):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ConfigError("base URL %r is not an absolute http(s) URL" % base_url)
        if u.query or u.fragment:
            raise ConfigError("base URL %r has a query or fragment" % base_url)
        if u.username is not None or u.password is not None:
            raise ConfigError("base URL has user information")
        if u.scheme == "http" and not insecure_http and not is_loopback(u.hostname):
            raise ConfigError(
                "base URL %r is plain http to %r, which is not this machine: its bearer tokens would cross "
                "the network in clear; use https, or pass insecure_http=True on a network you trust"
                % (base_url, u.hostname))
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.authority = authority_for_signing(u.netloc, u.scheme)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.ssl_context = ssl_context

    def target(self, path: str) -> str:
        """The request-target of a route path: the mount prefix, then path."""
        return self.prefix + path

    def send(self, method: str, target: str, body: "Optional[bytes | BinaryIO]" = None,
             headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
             abort: Optional[Abort] = None, length: Optional[int] = None) -> Response:
        """Send exactly these bytes once and read the answer; raise OSError/HTTPException on no answer.

        body is bytes, or a reader streamed in blocks whose length must then be given.
        """
        with self.exchange(method, target, body, headers, timeout, abort, length) as r:
            raw = r.read(MAX_ANSWER_BYTES)
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)

    @contextlib.contextmanager
    def exchange(self, method: str, target: str, body: "Optional[bytes | BinaryIO]" = None,
                 headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 abort: Optional[Abort] = None, length: Optional[int] = None) -> Iterator[http.client.HTTPResponse]:
        """Send one request and yield its answer unread (a download streams it); the connection
        is closed at exit. body is bytes, or a reader (read(n)) of exactly length bytes, sent in
        blocks of STREAM_BLOCK bytes and never held whole."""
        t = timeout if timeout is not None else self.timeout
        if self.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=t, context=self.ssl_context or ssl.create_default_context(),
                blocksize=STREAM_BLOCK)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=t, blocksize=STREAM_BLOCK)
        if body is not None and not isinstance(body, (bytes, bytearray)):
            if length is None:
                raise ConfigError("a streamed body needs its length")
        elif body is not None:
            length = len(body)
        try:
            conn.connect()
            if abort is not None:
                abort._set(conn)
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.authority)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("Content-Length", str(length))
            conn.endheaders(body)
            yield conn.getresponse()
        finally:
            if abort is not None:
                abort._set(None)
            conn.close()


def _retry_after(v: Optional[str], now: float) -> float:
    if not v:
        return 0.0
    v = v.strip()
    d = 0.0
    if v.isdigit():
        d = float(v)
    else:
        try:
            d = email.utils.parsedate_to_datetime(v).timestamp() - now
        except (TypeError, ValueError):
            return 0.0
    return min(max(d, 0.0), MAX_RETRY_AFTER)


#: The APIError subclasses of the codes a caller tells apart with except.
_ERROR_CLASSES = {"lease_lost": LeaseLost, "artifact_storage_off": ArtifactStorageOff,
                  "artifact_mismatch": ArtifactMismatch}


def api_error(resp: Response, route: str, now: float) -> APIError:
    """The APIError of an error answer (a LeaseLost for 409 lease_lost)."""
    code = message = server_time = ""
    try:
        err = resp.json()["error"]
        code, message = str(err.get("code", "")), str(err.get("message", ""))
        server_time = str(err.get("server_time", "") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        message = resp.raw[:200].decode("utf-8", "replace").strip()
    cls = _ERROR_CLASSES.get(code, APIError)
    return cls(resp.status, code, message, route=route, request_id=resp.headers.get("x-request-id", ""),
               server_time=server_time, retry_after=_retry_after(resp.headers.get("retry-after"), now),
               body=resp.raw)


def expect(resp: Response, route: str, *ok: int) -> Any:
    """The JSON of resp if its status is one of ok, else raise its APIError."""
    if resp.status not in ok:
        raise api_error(resp, route, time.time())
    try:
        return resp.json()
    except ValueError as e:
        raise APIError(resp.status, "", "undecodable answer: %s" % e, route=route, body=resp.raw)


#: The most job ids a heartbeat's, start's or signals' current_jobs (and known_cancels) holds (§5.14).
MAX_CURRENT_JOBS = 256


def _job_ids(field: str, ids: Sequence[str]) -> List[str]:
    out = list(ids)
    if len(out) > MAX_CURRENT_JOBS:
        raise ConfigError("%s lists %d jobs, over the limit of %d" % (field, len(out), MAX_CURRENT_JOBS))
    for j in out:
        if not isinstance(j, str) or not j or len(j.encode("utf-8")) > 255:
            raise ConfigError("each id of %s is a string of 1 to 255 bytes, not %r" % (field, j))
    return out


def _date_time(date: Optional[str]) -> Optional[str]:
    """An HTTP Date header as an RFC 3339 UTC time (whole seconds), or None."""
    if not date:
        return None
    try:
        d = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    if d.tzinfo is None:
        return None
    return d.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job(job_id: str, verb: str) -> str:
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError("a job id is a non-empty string")
    return "/workers/jobs/%s/%s" % (urllib.parse.quote(job_id, safe=""), verb)


class Client:
    """Calls the worker routes of PROTOCOL.md for one node. Safe for use from several threads.

    identity is the node's key and, once registered, its worker id and token
    (an Identity; a bare Signer makes an in-memory one). Each call is sent up
    to max_attempts times: no answer, 5xx and 429 are retried after a backoff
    (Retry-After honoured), other 4xx never; one stale_timestamp refusal is
    signed again at once with the corrected clock. `clock` is the node's wall
    clock in Unix seconds (time.time by default): signatures are created at
    clock() plus the measured offset to the server's clock, which 2xx answers
    and stale_timestamp refusals update, bounded by ±MAX_CLOCK_OFFSET.
    """

    def __init__(self, base_url: str, identity: "Identity | Signer | None" = None, *,
                 timeout: float = DEFAULT_TIMEOUT, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 retry_base: float = DEFAULT_RETRY_BASE, retry_max: float = DEFAULT_RETRY_MAX,
                 clock: Callable[[], float] = time.time,
                 logger: Optional[logging.Logger] = None,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 insecure_http: bool = False):
        if timeout <= 0 or retry_base < 0 or retry_max < 0:
            raise ConfigError("timeout must be positive and the retry delays not negative")
        if max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if identity is None:
            identity = Identity(Signer())
        elif isinstance(identity, Signer):
            identity = Identity(identity)
        self.identity: Identity = identity
        self.conn = Connection(base_url, timeout=timeout, ssl_context=ssl_context, insecure_http=insecure_http)
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.clock = clock
        self.logger = logger or _log
        self._mu = threading.Lock()
        self._offset = 0.0
        self._offset_known = False
        #: Whether the last register created the node (201) rather than replaced it (200).
        self.registered_new = False

    # -- identity ---------------------------------------------------------

    @property
    def signer(self) -> Signer:
        """The node's key."""
        return self.identity.signer

    @property
    def token(self) -> Optional[str]:
        """The worker token, once registered."""
        return self.identity.token

    @property
    def worker_id(self) -> Optional[str]:
        """The worker id, once registered."""
        return self.identity.worker_id

    # -- the clock (§4.3) -------------------------------------------------

    @property
    def clock_offset(self) -> Tuple[float, bool]:
        """The server's clock minus the node's, in seconds, and whether any answer measured it."""
        with self._mu:
            return self._offset, self._offset_known

    def server_now(self) -> float:
        """The node's estimate of the server's clock (Unix seconds): clock() plus the offset."""
        with self._mu:
            off = self._offset
        return self.clock() + off

    def observe(self, server_time: Optional[str], date: Optional[str], sent: float, recv: float) -> None:
        """Update the clock offset from an answer sent at `sent` and received at `recv` (local clock).

        server_time (microseconds) is preferred; the Date header (whole
        seconds) only corrects an offset more than 1.5 s off. The offset is
        clamped to ±MAX_CLOCK_OFFSET.
        """
        ref = recv - min((recv - sent) / 2, 0.25)
        precise = True
        st = unix_seconds(server_time) if server_time else None
        if st is not None:
            sample = st - ref
        elif date:
            try:
                sample = email.utils.parsedate_to_datetime(date).timestamp() + 0.5 - ref
            except (TypeError, ValueError):
                return
            precise = False
        else:
            return
        clamped = abs(sample) > MAX_CLOCK_OFFSET
        sample = min(max(sample, -MAX_CLOCK_OFFSET), MAX_CLOCK_OFFSET)
        with self._mu:
            diff = sample - self._offset
            if not precise and self._offset_known and abs(diff) < 1.5:
                return
            if clamped:
                self.logger.warning("server clock offset beyond the bound of %ds; clamped", MAX_CLOCK_OFFSET)
            elif not self._offset_known or abs(diff) > 1:
                self.logger.info("server clock offset %.3fs", sample)
            self._offset, self._offset_known = sample, True

    # -- requests ---------------------------------------------------------

    def signed_headers(self, method: str, target: str, body: Optional[bytes] = None, digest: Optional[str] = None,
                       content_type: str = CONTENT_TYPE, bearer: Optional[str] = None,
                       created: Optional[int] = None, nonce: Optional[str] = None) -> Dict[str, str]:
        """The headers of one signed request to target: signature (§4), Accept, User-Agent and the
        bearer token. The body is given as bytes, or, for one streamed later, as its Content-Digest."""
        sh = sign_request(self.signer, method, self.conn.authority, target, body, content_type=content_type,
                          created=created, nonce=nonce, now=self.server_now(), digest=digest)
        headers = dict(sh.headers)
        headers["Accept"] = "application/json"
        headers["User-Agent"] = USER_AGENT
        tok = bearer if bearer is not None else self.identity.token
        if tok:
            headers["Authorization"] = "Bearer " + tok
        return headers

    def prepare(self, path: str, obj: Any, bearer: Optional[str] = None, created: Optional[int] = None,
                nonce: Optional[str] = None) -> Tuple[str, bytes, Dict[str, str]]:
        """Build one signed request (target, body, headers) for a worker route, without sending it."""
        target = self.conn.target(path)
        body = dumps(obj)
        return target, body, self.signed_headers("POST", target, body, bearer=bearer, created=created, nonce=nonce)

    def post(self, path: str, obj: Any, bearer: Optional[str] = None, timeout: Optional[float] = None,
             created: Optional[int] = None, nonce: Optional[str] = None,
             abort: Optional[Abort] = None) -> Response:
        """Send one signed attempt and return the answer, whatever its status (no retry).

        The answer's clock is observed as call() observes it. Raises TransportError
        when there is no answer.
        """
        target, body, headers = self.prepare(path, obj, bearer=bearer, created=created, nonce=nonce)
        return self.send_signed(path, "POST", target, body, headers, timeout=timeout, abort=abort)

    def send_signed(self, path: str, method: str, target: str, body: "Optional[bytes | BinaryIO]",
                    headers: Dict[str, str], timeout: Optional[float] = None, abort: Optional[Abort] = None,
                    length: Optional[int] = None) -> Response:
        """Send one signed request made with signed_headers and return the answer, whatever its status.

        body is bytes, or a reader of length bytes streamed in blocks. The
        answer's clock is observed (a 2xx answer, or a stale_timestamp refusal).
        Raises TransportError when there is no answer.
        """
        sent = self.clock()
        try:
            resp = self.conn.send(method, target, body, headers, timeout=timeout, abort=abort, length=length)
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(path, e) from e
        recv = self.clock()
        server_time = None
        code = None
        try:
            j = json.loads(resp.raw.decode("utf-8"))
            if isinstance(j, dict):
                if isinstance(j.get("error"), dict):
                    code = j["error"].get("code")
                    server_time = j["error"].get("server_time")
                else:
                    server_time = j.get("server_time")
        except (ValueError, UnicodeDecodeError):
            pass
        # Only an answer given in full (2xx), or the refusal of a stale signature, moves the
        # offset: any other error may come from a proxy or replica with a clock of its own.
        if 200 <= resp.status < 300:
            self.observe(server_time if isinstance(server_time, str) else None,
                         resp.headers.get("date"), sent, recv)
        elif code == "stale_timestamp":
            self.observe(server_time if isinstance(server_time, str) else None,
                         resp.headers.get("date"), sent, recv)
        return resp

    def backoff(self, attempt: int) -> float:
        """The delay after the attempt-th failed attempt: full jitter over a capped exponential window."""
        w = self.retry_base * (2 ** (attempt - 1))
        return random.uniform(0, min(w, self.retry_max))

    def call(self, path: str, obj: Any, ok: Sequence[int] = (200,), bearer: Optional[str] = None,
             wait: float = 0.0, abort: Optional[Abort] = None,
             headers_out: Optional[Dict[str, str]] = None) -> Tuple[int, Any]:
        """POST obj to a worker route with retries; return (status, decoded answer) of a status in ok.

        Raise APIError (LeaseLost for 409 lease_lost) for an error answer that is
        final or whose retries are spent, TransportError when no attempt got an
        answer. Every attempt is signed afresh; the body, and so any key it
        carries, is the same on every attempt. headers_out, when given, is
        filled with the headers (names lowercased) of the answer returned.
        """
        stale_retried = token_retried = unanswered = False
        attempt = 0
        while True:
            attempt += 1
            tok = bearer if bearer is not None else self.identity.token
            err: Exception
            try:
                resp = self.post(path, obj, bearer=tok, timeout=self.timeout + wait, abort=abort)
                if resp.status in ok:
                    if headers_out is not None:
                        headers_out.update(resp.headers)
                    return resp.status, expect(resp, path, *ok)
                err = api_error(resp, path, self.clock())
            except TransportError as e:
                err = e
            if abort is not None and abort.aborted:
                raise err
            if isinstance(err, APIError):
                if err.code == "stale_timestamp" and not stale_retried:
                    stale_retried = True  # post() corrected the offset from this refusal
                    attempt -= 1
                    continue
                if (err.code in ("token_revoked", "invalid_token", "token_expired") and bearer is None
                        and not token_retried and self.identity.token != tok):
                    token_retried = True  # the token was rotated while this request was in flight
                    attempt -= 1
                    continue
                if not err.temporary:
                    err.unanswered = unanswered
                    raise err
            else:
                unanswered = True
            if attempt >= self.max_attempts:
                raise err
            d = self.backoff(attempt)
            if isinstance(err, APIError) and err.retry_after > 0:
                d = err.retry_after + random.uniform(0, self.retry_base)
            self.logger.debug("retrying %s (attempt %d) in %.2fs: %s", path, attempt, d, err)
            time.sleep(d)

    # -- worker routes (§5) ----------------------------------------------

    def register(self, provisioning_token: str, node_id: Optional[str] = None, **fields: Any) -> Dict[str, Any]:
        """Register the node (§5.1) with a node:register token; keep the worker id and token.

        fields are the register body's other fields (name, hostname, role,
        capabilities, governor_limits, tags, version, current_jobs, ...);
        public_key is the identity's. current_jobs, when given (even []), are
        the jobs the node still holds: the control plane ends at once every
        other live lease of this node (`last_error.code` worker_restarted) and
        names them in the answer's ended_jobs. Returns the answer;
        registered_new says whether it was 201.
        """
        if not provisioning_token:
            raise ConfigError("register needs a provisioning token")
        node_id = node_id or self.identity.node_id
        if not node_id:
            raise ConfigError("register needs a node_id")
        body: Dict[str, Any] = {"node_id": node_id}
        body.update(fields)
        body["public_key"] = self.signer.public_key
        status, ans = self.call("/workers/register", body, ok=(200, 201), bearer=provisioning_token)
        if not ans.get("worker_token") or not ans.get("worker_id"):
            raise APIError(status, "", "the answer has no worker_id or worker_token", route="/workers/register")
        self.registered_new = status == 201
        self.identity.set_registration(node_id, ans["worker_id"], ans["worker_token"],
                                       ans.get("token_expires_at"))
        return ans

    def renew_token(self) -> Dict[str, Any]:
        """Renew the worker token (§5.13), signed by the node's key; keep the new one."""
        if not self.identity.token:
            raise ConfigError("renew needs a worker token: register first")
        _, ans = self.call("/workers/token", {})
        if not ans.get("worker_token"):
            raise APIError(200, "", "the answer has no worker_token", route="/workers/token")
        self.identity.set_registration(self.identity.node_id, ans.get("worker_id") or self.identity.worker_id,
                                       ans["worker_token"], ans.get("token_expires_at"))
        return ans

    def start(self, current_jobs: Optional[List[str]] = None, **fields: Any) -> Dict[str, Any]:
        """Tell the control plane this node (re)started (POST /workers/start), with its worker token.

        What a node that has a token sends on every start, instead of
        registering again. fields are register's name, hostname, role,
        version, capabilities, governor_limits and tags: what the node is
        now, which the control plane records (a worker_updated receipt when
        something changed; a widening may wait for an operator's approval,
        pending_job_types / pending_tags). current_jobs (default []: a
        process that just started holds nothing) are the jobs the node still
        holds: every live lease of this worker on another job is ended at
        once (requeued, `last_error.code` worker_restarted) and named in the
        answer's ended_jobs. It counts as a heartbeat. The answer: worker_id,
        status, changed, receipt_id, pending_job_types, pending_tags,
        ended_jobs, policy_version, server_time, next_heartbeat_seconds,
        heartbeat_deadline.
        """
        if not self.identity.token:
            raise ConfigError("start needs a worker token: register first")
        body: Dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
        body.pop("node_id", None)
        body.pop("public_key", None)
        body["current_jobs"] = _job_ids("current_jobs", current_jobs or [])
        return self.call("/workers/start", body)[1]

    def heartbeat(self, status: str = "idle", current_jobs: Optional[List[str]] = None,
                  metrics: Optional[Dict[str, Any]] = None,
                  capabilities: Optional[Dict[str, Any]] = None,
                  leases_through: Optional[str] = None) -> Dict[str, Any]:
        """Report liveness (§5.2); the answer's leases, lost_jobs and cancel_jobs say what to do.

        leases_through, when given, is the server_time (RFC 3339) of the newest
        lease (or register/start) answer the node has processed: every live
        lease of this worker granted at or before it on a job not in
        current_jobs is ended (`last_error.code` not_held) and named in the
        answer's ended_jobs. List a job in current_jobs until its complete,
        fail or release was answered.
        """
        if status not in ("idle", "busy", "draining"):
            raise ConfigError("heartbeat status is idle, busy or draining")
        body: Dict[str, Any] = {"status": status, "current_jobs": _job_ids("current_jobs", current_jobs or []),
                                "metrics": metrics}
        if capabilities is not None:
            body["capabilities"] = capabilities
        if leases_through is not None:
            if unix_seconds(leases_through) is None:
                raise ConfigError("leases_through is an RFC 3339 UTC time, not %r" % (leases_through,))
            body["leases_through"] = leases_through
        return self.call("/workers/heartbeat", body)[1]

    def signals(self, wait_seconds: int = 25, current_jobs: Optional[List[str]] = None,
                known_cancels: Optional[List[str]] = None, draining: bool = False,
                abort: Optional[Abort] = None) -> Dict[str, Any]:
        """Wait up to wait_seconds (0 to 60) for a signal (POST /workers/signals), the control long-poll.

        It answers at once, or as soon as it happens during the wait, when a
        job of current_jobs has its cancel requested and is not in
        known_cancels (cancel_jobs), when a job of current_jobs is no longer
        held by this worker (lost_jobs), or when the operator's drain request
        differs from draining (drain); else at the end of the wait, with
        nothing. A ban or retire ends it at once with 403 worker_banned.
        The answer: cancel_jobs, lost_jobs, drain, server_time.
        """
        if not 0 <= wait_seconds <= 60:
            raise ConfigError("wait_seconds is 0 to 60")
        body = {"wait_seconds": wait_seconds, "current_jobs": _job_ids("current_jobs", current_jobs or []),
                "known_cancels": _job_ids("known_cancels", known_cancels or []), "draining": bool(draining)}
        ans = self.call("/workers/signals", body, wait=wait_seconds, abort=abort)[1]
        for k in ("cancel_jobs", "lost_jobs"):
            if ans.get(k) is None:
                ans[k] = []
        ans["drain"] = bool(ans.get("drain"))
        return ans

    def lease(self, wait_seconds: int = 0, max_jobs: int = 1, supported_job_types: Optional[List[str]] = None,
              supported_gpu_skus: Optional[List[str]] = None, accept: bool = False,
              request_id: Optional[str] = None, abort: Optional[Abort] = None) -> Dict[str, Any]:
        """Ask for jobs (§5.3), long-polling up to wait_seconds (0 to 60).

        A random request_id is sent when none is given, so that a retry after a
        lost answer gets the same grants rather than leasing more (§5.16). The
        answer's `leases` lists every grant (filled from the top-level fields of
        a v0.2-style answer), and its `server_time` is the control plane's
        (from its Date header, rounded down to the second, when the answer
        has none; None when neither): a heartbeat's leases_through.
        """
        if not 0 <= wait_seconds <= 60:
            raise ConfigError("wait_seconds is 0 to 60")
        if not 1 <= max_jobs <= 32:
            raise ConfigError("max_jobs is 1 to 32")
        body: Dict[str, Any] = {"max_jobs": max_jobs, "wait_seconds": wait_seconds,
                                "request_id": request_id or new_key()}
        if supported_job_types:
            body["supported_job_types"] = list(supported_job_types)
        if supported_gpu_skus:
            body["supported_gpu_skus"] = list(supported_gpu_skus)
        if accept:
            body["accept"] = True
        headers: Dict[str, str] = {}
        ans = self.call("/workers/jobs/lease", body, wait=wait_seconds, abort=abort, headers_out=headers)[1]
        if not ans.get("server_time") or str(ans["server_time"]).startswith("0001-"):
            ans["server_time"] = _date_time(headers.get("date"))
        if ans.get("leases") is None and ans.get("lease_token") and ans.get("job"):
            ans["leases"] = [{k: ans.get(k) for k in ("lease_id", "lease_token", "job", "expires_at", "accept_by")}]
        ans.setdefault("leases", [])
        return ans

    def accept(self, job_id: str, lease_token: str) -> Dict[str, Any]:
        """Accept a leased job (§5.4): it runs."""
        return self.call(_job(job_id, "accept"), {"lease_token": lease_token})[1]

    def status(self, job_id: str, lease_token: str, event_type: str, message: str = "",
               payload: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Report a status event (§5.5); the answer's cancel_requested says whether to stop."""
        body = {"lease_token": lease_token, "event_type": event_type, "message": message, "payload": payload,
                "idempotency_key": idempotency_key or new_key()}
        return self.call(_job(job_id, "status"), body)[1]

    def log(self, job_id: str, lease_token: str, seq: int, message: str,
            payload: Optional[Dict[str, Any]] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Send one log line (§5.6); a seq already stored counts as a duplicate."""
        body = {"lease_token": lease_token, "seq": seq, "message": message,
                "payload": payload if payload is not None else {},
                "idempotency_key": idempotency_key or new_key()}
        return self.call(_job(job_id, "logs"), body)[1]

    def logs(self, job_id: str, lease_token: str, entries: List[Dict[str, Any]],
             idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Send a batch of 1 to 1,000 log entries ({seq, message, payload}) (§5.6)."""
        if not 1 <= len(entries) <= 1000:
            raise ConfigError("a logs batch holds 1 to 1000 entries")
        body = {"lease_token": lease_token, "entries": entries, "idempotency_key": idempotency_key or new_key()}
        return self.call(_job(job_id, "logs"), body)[1]

    def artifact(self, job_id: str, lease_token: str, artifact_type: str, name: str, uri: Optional[str],
                 checksum_sha256: Optional[str] = None, size_bytes: Optional[int] = None,
                 metadata: Optional[Dict[str, Any]] = None,
                 idempotency_key: Optional[str] = None, upload_id: Optional[str] = None,
                 wait: float = 0.0) -> Dict[str, Any]:
        """Report an artifact (§5.7); mints an artifact_reported receipt.

        With upload_id (an upload whose parts were all sent, §5.19), it finishes
        the upload: the control plane checks the stored bytes against
        checksum_sha256 and size_bytes (both required then; uri optional) and
        records the artifact as stored, or refuses with ArtifactMismatch.
        wait adds to the call's timeout (the check may read the bytes back).
        """
        body: Dict[str, Any] = {"lease_token": lease_token, "artifact_type": artifact_type, "name": name,
                                "idempotency_key": idempotency_key or new_key()}
        if uri:
            body["uri"] = uri
        if upload_id is not None:
            if checksum_sha256 is None or size_bytes is None:
                raise ConfigError("finishing an upload needs its checksum_sha256 and size_bytes")
            body["upload_id"] = upload_id
        if checksum_sha256 is not None:
            body["checksum_sha256"] = checksum_sha256
        if size_bytes is not None:
            body["size_bytes"] = size_bytes
        if metadata is not None:
            body["metadata"] = metadata
        return self.call(_job(job_id, "artifacts"), body, ok=(201,), wait=wait)[1]

    def request_upload(self, job_id: str, lease_token: str, artifact_type: str, name: str, size_bytes: int,
                       checksum_sha256: str, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Ask where to put an artifact's bytes (POST /workers/jobs/{id}/uploads, §5.19).

        The answer: upload_id, part_size, expires_at, direct, and parts (each
        part_number, offset, size_bytes, method, url, headers). Raises
        ArtifactStorageOff when the control plane stores no bytes.
        """
        body: Dict[str, Any] = {"lease_token": lease_token, "artifact_type": artifact_type, "name": name,
                                "size_bytes": size_bytes, "checksum_sha256": checksum_sha256,
                                "idempotency_key": idempotency_key or new_key()}
        return self.call(_job(job_id, "uploads"), body, ok=(201,))[1]

    def put_part(self, url: str, lease_token: str, body: BinaryIO, length: int, digest: str,
                 timeout: Optional[float] = None, abort: Optional[Abort] = None) -> Response:
        """Send one part of an upload to the control plane, once (PUT url, §5.20); return the answer.

        url is the part's route (a path under the base URL, from request_upload);
        body a reader of exactly length bytes, streamed; digest its Content-Digest
        (signing.digest_header). The lease token goes in the Nodelane-Lease-Token
        header. Raises TransportError when there is no answer.
        """
        if not url.startswith("/workers/jobs/"):
            raise ConfigError("a control-plane part URL is a worker route, not %r" % url[:80])
        target = self.conn.target(url)
        headers = self.signed_headers("PUT", target, digest=digest, content_type=OCTET_STREAM)
        headers[LEASE_TOKEN_HEADER] = lease_token
        route = url.split("/uploads/", 1)[0] + "/uploads/{id}/parts"  # the upload id stays out of errors
        return self.send_signed(route, "PUT", target, body, headers, timeout=timeout, abort=abort, length=length)

    @contextlib.contextmanager
    def artifact_content(self, job_id: str, lease_token: str, artifact_id: str, offset: int = 0,
                         abort: Optional[Abort] = None) -> Iterator[http.client.HTTPResponse]:
        """GET a stored artifact of the job (a checkpoint to resume from, §5.21), signed; yield the
        answer unread (200, or 206 from offset when offset > 0). Raises TransportError when there
        is no answer; an error answer is yielded as it came."""
        path = _job(job_id, "artifacts/" + urllib.parse.quote(artifact_id, safe="") + "/content")
        target = self.conn.target(path)
        headers = self.signed_headers("GET", target, b"")
        headers[LEASE_TOKEN_HEADER] = lease_token
        headers["Accept"] = "application/octet-stream, application/json"
        if offset > 0:
            headers["Range"] = "bytes=%d-" % offset
        try:
            with self.conn.exchange("GET", target, None, headers, abort=abort) as r:
                yield r
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(_job(job_id, "artifacts/{id}/content"), e) from e

    def complete(self, job_id: str, lease_token: str, output_uri: Optional[str] = None,
                 metrics: Optional[Dict[str, Any]] = None, final_message: Optional[str] = None,
                 wait_for_proofs: bool = False, proof_retries: int = 5) -> Dict[str, Any]:
        """Complete a running job (§5.8); the answer carries its receipts.

        By default it comes at once, without proofs ("proofs" [], "checkpoint"
        ""): complete again with the same token later, or read
        GET /operator/receipts/{id}, for them. With wait_for_proofs the server
        waits for them, and if the answer still has none, complete is sent
        again (it mints nothing) up to proof_retries times, half a second apart.
        """
        body = {"lease_token": lease_token, "output_uri": output_uri, "metrics": metrics,
                "final_message": final_message, "wait_for_proofs": wait_for_proofs}
        route = _job(job_id, "complete")
        ans = self.call(route, body, wait=15)[1]
        tries = 0
        while wait_for_proofs and (not ans.get("proofs") or not ans.get("checkpoint")) and tries < proof_retries:
            tries += 1
            time.sleep(0.5)
            ans = self.call(route, body, wait=15)[1]
        return ans

    def fail(self, job_id: str, lease_token: str, error_code: str = "unspecified", message: str = "",
             retryable: bool = False, payload: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Report a failed attempt (§5.9): requeued while retryable and attempts remain, else failed."""
        body = {"lease_token": lease_token, "error_code": error_code, "message": message,
                "payload": payload, "retryable": retryable}
        return self.call(_job(job_id, "fail"), body)[1]

    def release(self, job_id: str, lease_token: str, reason: str = "") -> Dict[str, Any]:
        """Hand a job back to the queue without using an attempt (§5.10)."""
        return self.call(_job(job_id, "release"), {"lease_token": lease_token, "reason": reason})[1]

    def audit(self, events: List[Dict[str, Any]], idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Report 1 to 100 node audit events (§5.11); one node_audit receipt each."""
        body = {"events": events, "idempotency_key": idempotency_key or new_key()}
        return self.call("/workers/audit", body, ok=(201,))[1]


class Operator:
    """The operator routes (§13) a test or a verifier needs: bearer only, no signature."""

    def __init__(self, base_url: "str | Connection", token: str, timeout: float = DEFAULT_TIMEOUT):
        self.conn = base_url if isinstance(base_url, Connection) else Connection(base_url, timeout=timeout)
        self.token = token

    def _h(self, body: bool) -> Dict[str, str]:
        h = {"Authorization": "Bearer " + self.token, "Accept": "application/json"}
        if body:
            h["Content-Type"] = CONTENT_TYPE
        return h

    def get(self, path: str) -> Response:
        """GET an operator route once."""
        return self.conn.send("GET", self.conn.target(path), None, self._h(False))

    def post(self, path: str, obj: Any) -> Response:
        """POST JSON to an operator route once."""
        return self.conn.send("POST", self.conn.target(path), dumps(obj), self._h(True))

    def dispatch(self, job_type: str, payload: Optional[Dict[str, Any]] = None, **fields: Any) -> Dict[str, Any]:
        """Queue a job (POST /operator/jobs); fields: requirements, priority, max_attempts."""
        body = {"job_type": job_type, "payload": payload if payload is not None else {}}
        body.update(fields)
        return expect(self.post("/operator/jobs", body), "/operator/jobs", 201)

    def job(self, job_id: str) -> Dict[str, Any]:
        """GET /operator/jobs/{id}: the job, its result, events and artifacts."""
        p = "/operator/jobs/" + urllib.parse.quote(job_id, safe="")
        return expect(self.get(p), p, 200)

    def cancel(self, job_id: str) -> Dict[str, Any]:
        """Cancel a job (POST /operator/jobs/{id}/cancel)."""
        p = "/operator/jobs/%s/cancel" % urllib.parse.quote(job_id, safe="")
        return expect(self.post(p, {}), p, 200)

    def download(self, artifact_id: str, dest: "str | BinaryIO", range_header: Optional[str] = None) -> Response:
        """Stream a stored artifact's bytes (GET /operator/artifacts/{id}/content) into dest (a path or a
        binary file); return the answer's status and headers (raw empty). An error answer raises APIError."""
        p = "/operator/artifacts/%s/content" % urllib.parse.quote(artifact_id, safe="")
        h = self._h(False)
        h["Accept"] = "application/octet-stream, application/json"
        if range_header:
            h["Range"] = range_header
        with self.conn.exchange("GET", self.conn.target(p), None, h) as r:
            headers = {k.lower(): v for k, v in r.getheaders()}
            if r.status not in (200, 206):
                expect(Response(r.status, headers, r.read(MAX_ANSWER_BYTES)), p, 200, 206)
            out = open(dest, "wb") if isinstance(dest, str) else dest
            try:
                while True:
                    b = r.read(STREAM_BLOCK)
                    if not b:
                        break
                    out.write(b)
            finally:
                if isinstance(dest, str):
                    out.close()
            return Response(r.status, headers, b"")

    def checkpoint(self) -> str:
        """The latest signed checkpoint note."""
        r = self.get("/operator/receipts/checkpoint")
        if r.status != 200:
            expect(r, "/operator/receipts/checkpoint", 200)
        return r.raw.decode("utf-8")

    def receipt(self, receipt_id: str) -> Dict[str, Any]:
        """GET /operator/receipts/{id}: {receipt, proof, checkpoint}."""
        p = "/operator/receipts/" + urllib.parse.quote(receipt_id, safe="")
        return expect(self.get(p), p, 200)

    def consistency(self, old: int, new: int) -> List[str]:
        """The consistency proof's base64 hashes between two tree sizes."""
        p = "/operator/receipts/consistency?old=%d&new=%d" % (old, new)
        return expect(self.get(p), p, 200)["hashes"]
