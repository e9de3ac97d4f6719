#!/usr/bin/env python3
"""A nodelane worker (protocol v1) written from docs/PROTOCOL.md alone.

Standard library plus `cryptography` (Ed25519). No RFC 9421 library: the
signature base of the fixed profile (PROTOCOL.md §4) is built here.

Library:
    Signer            - the node's Ed25519 key, public_key and keyid (§4.1)
    sign_request      - Content-Digest, Signature-Input, Signature (§4.2-§4.5)
    Connection        - one control plane (host:port, optional mount prefix)
    Worker            - register, heartbeat, lease, accept, status, logs,
                        artifacts, complete, fail, release, audit (§5)
    Operator          - the few operator routes a test needs (§13)
    verify_*          - offline verification of receipts, proofs and the
                        signed checkpoint note (§8-§11), and Witness (§11 step 5)

CLI:
    nodelane_worker.py run    --url http://127.0.0.1:8080 --provisioning-token-file FILE
                              --receipt-public-key 'nodelane.local/receipts+...+...'
    nodelane_worker.py verify --receipt-public-key ... complete-answer.json
    nodelane_worker.py vectors   (checks the worked examples of PROTOCOL.md)
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime as _dt
import hashlib
import http.client
import json
import os
import re
import sys
import time
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

DEFAULT_ORIGIN = "nodelane.local/receipts"  # §10.1
TAG = "nodelane-worker/v1"  # §4.3
COMPONENTS = ("@method", "@authority", "@path", "@query", "content-digest", "content-type")
CONTENT_TYPE = "application/json"
DEFAULT_TIMEOUT = 10.0


class VerificationError(Exception):
    """Raised when offline verification fails (§11)."""


# ---------------------------------------------------------------------------
# Encodings (§1, §2.1, §4.1)
# ---------------------------------------------------------------------------

B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def b64url_nopad(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def b64url_nopad_decode(s: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9_-]*", s):
        raise ValueError("not base64url")
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if b64url_nopad(raw) != s:
        raise ValueError("not canonical base64url")
    return raw


def b64std(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def b64std_decode(s: str) -> bytes:
    """Strict standard base64 with padding."""
    if not isinstance(s, str):
        raise ValueError("not a string")
    raw = base64.b64decode(s, validate=True)
    if b64std(raw) != s:
        raise ValueError("not canonical base64")
    return raw


def base62(n: int, width: int) -> str:
    out = []
    while n:
        n, r = divmod(n, 62)
        out.append(B62[r])
    s = "".join(reversed(out))
    if len(s) > width:
        raise ValueError("number too large for width")
    return s.rjust(width, "0")


def make_token(prefix: str, payload: bytes, body_digits: int) -> str:
    """§2.1 / §2.3: prefix + base62(payload) + base62(crc32(prefix+body), 6)."""
    head = prefix + base62(int.from_bytes(payload, "big"), body_digits)
    return head + base62(zlib.crc32(head.encode("ascii")) & 0xFFFFFFFF, 6)


def token_shape_ok(token: str, prefix: str, length: int) -> bool:
    if len(token) != length or not token.startswith(prefix):
        return False
    if any(c not in B62 for c in token[len(prefix):]):
        return False
    head = token[:-6]
    return base62(zlib.crc32(head.encode("ascii")) & 0xFFFFFFFF, 6) == token[-6:]


def credential_token_ok(token: str) -> bool:
    return token_shape_ok(token, "nlc_", 75)


def credential_id_of(token: str) -> str:
    n = 0
    for c in token[4:69]:
        n = n * 62 + B62.index(c)
    return n.to_bytes(48, "big")[:16].hex()


def lease_token_ok(token: str) -> bool:
    return token_shape_ok(token, "nll_", 53)


def random_lease_token() -> str:
    """A well-formed lease token that is nobody's lease (§2.3)."""
    return make_token("nll_", os.urandom(32), 43)


# ---------------------------------------------------------------------------
# The node key and request signing (§4)
# ---------------------------------------------------------------------------


class Signer:
    def __init__(self, private_key: Optional[Ed25519PrivateKey] = None):
        self.private_key = private_key or Ed25519PrivateKey.generate()
        self.public_raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_key = b64url_nopad(self.public_raw)  # 43 chars (§4.1)
        self.keyid = b64url_nopad(hashlib.sha256(self.public_raw).digest())

    @classmethod
    def from_pem(cls, pem: bytes) -> "Signer":
        k = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(k, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 key")
        return cls(k)

    @classmethod
    def from_seed(cls, seed: bytes) -> "Signer":
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)


def content_digest(body: bytes) -> str:
    return "sha-256=:" + b64std(hashlib.sha256(body).digest()) + ":"


def signature_params(created: int, expires: int, nonce: str, keyid: str) -> str:
    comps = " ".join('"%s"' % c for c in COMPONENTS)
    return '(%s);created=%d;expires=%d;nonce="%s";keyid="%s";tag="%s"' % (
        comps, created, expires, nonce, keyid, TAG)


def signature_base(method: str, authority: str, target: str, digest: str,
                   content_type: str, params: str) -> bytes:
    """§4.4: seven lines, LF after each but the last."""
    path, sep, query = target.partition("?")
    if path == "":
        path = "/"
    lines = [
        '"@method": %s' % method,
        '"@authority": %s' % authority_for_signing(authority),
        '"@path": %s' % path,
        '"@query": ?%s' % query,
        '"content-digest": %s' % digest.strip(" \t"),
        '"content-type": %s' % content_type.strip(" \t"),
        '"@signature-params": %s' % params,
    ]
    base = "\n".join(lines)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in base.replace("\n", "")):
        raise ValueError("control character in a signed component")
    return base.encode("utf-8")


def authority_for_signing(host: str, scheme: str = "http") -> str:
    host = host.lower()
    default = ":443" if scheme == "https" else ":80"
    if host.endswith(default):
        host = host[: -len(default)]
    return host


def new_nonce(nbytes: int = 16) -> str:
    return b64url_nopad(os.urandom(nbytes))


@dataclass
class SignedHeaders:
    headers: Dict[str, str]
    base: bytes
    created: int
    nonce: str


def sign_request(signer: Signer, method: str, authority: str, target: str, body: bytes,
                 content_type: str = CONTENT_TYPE, created: Optional[int] = None,
                 expires: Optional[int] = None, nonce: Optional[str] = None) -> SignedHeaders:
    """Return the Content-Type, Content-Digest, Signature-Input and Signature headers."""
    if created is None:
        created = int(time.time())
    if expires is None:
        expires = created + 300
    if nonce is None:
        nonce = new_nonce()
    digest = content_digest(body)
    params = signature_params(created, expires, nonce, signer.keyid)
    base = signature_base(method, authority, target, digest, content_type, params)
    sig = signer.sign(base)
    headers = {
        "Content-Type": content_type,
        "Content-Digest": digest,
        "Signature-Input": "nodelane=" + params,
        "Signature": "nodelane=:" + b64std(sig) + ":",
    }
    return SignedHeaders(headers, base, created, nonce)


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------


class APIError(Exception):
    def __init__(self, status: int, code: str, message: str, body: Any):
        super().__init__("%d %s: %s" % (status, code, message))
        self.status = status
        self.code = code
        self.message = message
        self.body = body


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.raw.decode("utf-8"))

    @property
    def error_code(self) -> Optional[str]:
        try:
            return self.json()["error"]["code"]
        except Exception:
            return None


class Connection:
    """One control plane: http://host:port[/prefix]. Plain HTTP only (tests, loopback)."""

    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError("this client speaks plain http only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.authority = authority_for_signing(u.netloc, u.scheme)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout

    def send(self, method: str, target: str, body: Optional[bytes] = None,
             headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Response:
        """Send exactly these bytes; `target` already includes the prefix."""
        conn = http.client.HTTPConnection(self.host, self.port,
                                          timeout=timeout if timeout is not None else self.timeout)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.authority)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            raw = r.read()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)
        finally:
            conn.close()

    def target(self, path: str) -> str:
        return self.prefix + path


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _expect(resp: Response, *ok: int) -> Any:
    if resp.status not in ok:
        try:
            err = resp.json()["error"]
            raise APIError(resp.status, err.get("code", ""), err.get("message", ""), resp.raw)
        except (ValueError, KeyError, TypeError):
            raise APIError(resp.status, "", resp.raw[:200].decode("utf-8", "replace"), resp.raw)
    return resp.json()


# ---------------------------------------------------------------------------
# Worker routes (§5)
# ---------------------------------------------------------------------------


class Worker:
    def __init__(self, conn: Connection, signer: Signer, token: Optional[str] = None):
        self.conn = conn
        self.signer = signer
        self.token = token  # worker token after register
        self.worker_id: Optional[str] = None

    # -- low level ---------------------------------------------------------
    def prepare(self, path: str, obj: Any, bearer: Optional[str] = None,
                created: Optional[int] = None, nonce: Optional[str] = None) -> Tuple[str, bytes, Dict[str, str]]:
        """Build one signed request (target, body, headers) without sending it."""
        target = self.conn.target(path)
        body = _dumps(obj)
        sh = sign_request(self.signer, "POST", self.conn.authority, target, body,
                          created=created, nonce=nonce)
        headers = dict(sh.headers)
        tok = bearer if bearer is not None else self.token
        if tok:
            headers["Authorization"] = "Bearer " + tok
        return target, body, headers

    def post(self, path: str, obj: Any, bearer: Optional[str] = None,
             timeout: Optional[float] = None, **kw: Any) -> Response:
        target, body, headers = self.prepare(path, obj, bearer=bearer, **kw)
        return self.conn.send("POST", target, body, headers, timeout=timeout)

    # -- routes ------------------------------------------------------------
    def register(self, provisioning_token: str, node_id: str, **fields: Any) -> Dict[str, Any]:
        body = {"node_id": node_id, "public_key": self.signer.public_key}
        body.update(fields)
        resp = self.post("/workers/register", body, bearer=provisioning_token)
        ans = _expect(resp, 200, 201)
        ans["_status"] = resp.status
        self.token = ans["worker_token"]
        self.worker_id = ans["worker_id"]
        return ans

    def heartbeat(self, status: str = "idle", current_jobs: Optional[List[str]] = None,
                  metrics: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return _expect(self.post("/workers/heartbeat", {
            "status": status, "current_jobs": current_jobs or [], "metrics": metrics}), 200)

    def lease(self, wait_seconds: int = 0, max_jobs: int = 1,
              supported_job_types: Optional[List[str]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"max_jobs": max_jobs, "wait_seconds": wait_seconds}
        if supported_job_types:
            body["supported_job_types"] = supported_job_types
        # §5.3: set the HTTP timeout above wait_seconds.
        return _expect(self.post("/workers/jobs/lease", body,
                                 timeout=self.conn.timeout + wait_seconds), 200)

    def _job(self, job_id: str, verb: str) -> str:
        return "/workers/jobs/%s/%s" % (urllib.parse.quote(job_id, safe=""), verb)

    def accept(self, job_id: str, lease_token: str) -> Dict[str, Any]:
        return _expect(self.post(self._job(job_id, "accept"), {"lease_token": lease_token}), 200)

    def status(self, job_id: str, lease_token: str, event_type: str, message: str = "",
               payload: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return _expect(self.post(self._job(job_id, "status"), {
            "lease_token": lease_token, "event_type": event_type, "message": message,
            "payload": payload}), 200)

    def log(self, job_id: str, lease_token: str, seq: int, message: str,
            payload: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return _expect(self.post(self._job(job_id, "logs"), {
            "lease_token": lease_token, "seq": seq, "message": message,
            "payload": payload if payload is not None else {}}), 200)

    def artifact(self, job_id: str, lease_token: str, artifact_type: str, name: str, uri: str,
                 **opt: Any) -> Dict[str, Any]:
        body = {"lease_token": lease_token, "artifact_type": artifact_type, "name": name, "uri": uri}
        body.update(opt)
        return _expect(self.post(self._job(job_id, "artifacts"), body), 201)

    def complete(self, job_id: str, lease_token: str, output_uri: Optional[str] = None,
                 metrics: Optional[Dict[str, Any]] = None, final_message: Optional[str] = None,
                 proof_retries: int = 5) -> Dict[str, Any]:
        """Complete; if the answer has no proofs yet (§5.8), resend (new signature)."""
        body = {"lease_token": lease_token, "output_uri": output_uri, "metrics": metrics,
                "final_message": final_message}
        ans = _expect(self.post(self._job(job_id, "complete"), body, timeout=self.conn.timeout + 15), 200)
        tries = 0
        while (not ans.get("proofs") or not ans.get("checkpoint")) and tries < proof_retries:
            tries += 1
            time.sleep(0.5)
            ans = _expect(self.post(self._job(job_id, "complete"), body,
                                    timeout=self.conn.timeout + 15), 200)
        return ans

    def fail(self, job_id: str, lease_token: str, error_code: str, message: str = "",
             retryable: bool = False) -> Dict[str, Any]:
        return _expect(self.post(self._job(job_id, "fail"), {
            "lease_token": lease_token, "error_code": error_code, "message": message,
            "payload": None, "retryable": retryable}), 200)

    def release(self, job_id: str, lease_token: str, reason: str = "") -> Dict[str, Any]:
        return _expect(self.post(self._job(job_id, "release"),
                                 {"lease_token": lease_token, "reason": reason}), 200)

    def audit(self, events: List[Dict[str, Any]]) -> Dict[str, Any]:
        return _expect(self.post("/workers/audit", {"events": events}), 201)


# ---------------------------------------------------------------------------
# Operator routes (§13): bearer only, no signature
# ---------------------------------------------------------------------------


class Operator:
    def __init__(self, conn: Connection, token: str):
        self.conn = conn
        self.token = token

    def _h(self, body: bool) -> Dict[str, str]:
        h = {"Authorization": "Bearer " + self.token}
        if body:
            h["Content-Type"] = CONTENT_TYPE
        return h

    def get(self, path: str) -> Response:
        return self.conn.send("GET", self.conn.target(path), None, self._h(False))

    def post(self, path: str, obj: Any) -> Response:
        return self.conn.send("POST", self.conn.target(path), _dumps(obj), self._h(True))

    def dispatch(self, job_type: str, payload: Optional[Dict[str, Any]] = None,
                 **fields: Any) -> Dict[str, Any]:
        body = {"job_type": job_type, "payload": payload if payload is not None else {}}
        body.update(fields)
        return _expect(self.post("/operator/jobs", body), 201)

    def job(self, job_id: str) -> Dict[str, Any]:
        return _expect(self.get("/operator/jobs/" + urllib.parse.quote(job_id, safe="")), 200)

    def checkpoint(self) -> str:
        r = self.get("/operator/receipts/checkpoint")
        if r.status != 200:
            _expect(r, 200)
        return r.raw.decode("utf-8")

    def receipt(self, receipt_id: str) -> Dict[str, Any]:
        return _expect(self.get("/operator/receipts/" + urllib.parse.quote(receipt_id, safe="")), 200)

    def consistency(self, old: int, new: int) -> List[str]:
        return _expect(self.get("/operator/receipts/consistency?old=%d&new=%d" % (old, new)),
                       200)["hashes"]


# ---------------------------------------------------------------------------
# Offline verification (§8-§11)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifierKey:
    name: str
    key_hash: bytes  # 4 bytes
    public_key: bytes  # 32 bytes


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    text: str


def note_key_hash(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + b"\x01" + public_key).digest()[:4]


def _check_origin(origin: str) -> None:
    if not origin or any(c in origin for c in " +") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in origin):
        raise VerificationError("bad origin / key name %r" % origin)


def parse_verifier_key(vkey: str, origin: Optional[str] = None) -> VerifierKey:
    """§10.3 / §11 step 1: <name>+<8 hex>+<base64(0x01 || key)>."""
    # The name has no "+" (§10.1) and the hash is hex, but standard base64 may hold "+":
    # split at the first two only.
    parts = vkey.split("+", 2)
    if len(parts) != 3:
        raise VerificationError("verifier key has not three + separated parts")
    name, hhex, kb64 = parts
    _check_origin(name)
    if not re.fullmatch(r"[0-9a-f]{8}", hhex):
        raise VerificationError("key hash is not 8 lowercase hex digits")
    try:
        raw = b64std_decode(kb64)
    except (ValueError, binascii.Error) as e:
        raise VerificationError("verifier key base64: %s" % e)
    if len(raw) != 33 or raw[0] != 0x01:
        raise VerificationError("verifier key is not 0x01 || 32-byte Ed25519 key")
    pub = raw[1:]
    kh = bytes.fromhex(hhex)
    if note_key_hash(name, pub) != kh:
        raise VerificationError("verifier key hash does not match the key")
    if origin is not None and name != origin:
        raise VerificationError("verifier key name %r is not the origin %r" % (name, origin))
    return VerifierKey(name, kh, pub)


def verify_checkpoint(note: str, vkey: VerifierKey, origin: Optional[str] = None) -> Checkpoint:
    """§10.2 / §11 step 2."""
    origin = origin if origin is not None else vkey.name
    if not isinstance(note, str) or not note:
        raise VerificationError("empty checkpoint")
    i = note.rfind("\n\n")
    if i < 0:
        raise VerificationError("checkpoint has no empty line")
    body, sigs = note[: i + 1], note[i + 2:]
    if not sigs.endswith("\n"):
        raise VerificationError("signature lines must end in LF")
    ok = False
    for line in sigs[:-1].split("\n"):
        if not line.startswith("\u2014 "):
            raise VerificationError("signature line without em dash")
        rest = line[2:]
        name, sp, b64 = rest.partition(" ")
        if not sp or name != vkey.name:
            continue
        try:
            raw = b64std_decode(b64)
        except (ValueError, binascii.Error):
            raise VerificationError("signature is not base64")
        if len(raw) < 4 or raw[:4] != vkey.key_hash:
            continue
        if len(raw) != 68:
            raise VerificationError("signature is not 4 + 64 bytes")
        try:
            Ed25519PublicKey.from_public_bytes(vkey.public_key).verify(raw[4:], body.encode("utf-8"))
        except InvalidSignature:
            raise VerificationError("checkpoint signature does not verify")
        ok = True
    if not ok:
        raise VerificationError("no signature by the known key")
    lines = body.split("\n")
    if len(lines) != 4 or lines[3] != "":
        raise VerificationError("checkpoint body is not exactly three lines")
    o, size_s, root_s = lines[:3]
    _check_origin(o)
    if o != origin:
        raise VerificationError("checkpoint origin %r is not %r" % (o, origin))
    if not re.fullmatch(r"0|[1-9][0-9]*", size_s):
        raise VerificationError("bad tree size")
    try:
        root = b64std_decode(root_s)
    except (ValueError, binascii.Error):
        raise VerificationError("root is not base64")
    if len(root) != 32:
        raise VerificationError("root is not 32 bytes")
    return Checkpoint(o, int(size_s), root, note)


# -- Merkle (§9) ------------------------------------------------------------


def leaf_hash(body: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + body).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(leaves: List[bytes]) -> bytes:
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def _hashes(hs: Any) -> List[bytes]:
    if not isinstance(hs, list):
        raise VerificationError("hashes is not a list")
    out = []
    for h in hs:
        try:
            b = b64std_decode(h)
        except (ValueError, binascii.Error):
            raise VerificationError("proof hash is not base64")
        if len(b) != 32:
            raise VerificationError("proof hash is not 32 bytes")
        out.append(b)
    return out


def verify_inclusion(leaf: bytes, index: int, tree_size: int, hashes: List[bytes], root: bytes) -> None:
    """§9.1 (RFC 9162 §2.1.3.2)."""
    if not (0 <= index < tree_size):
        raise VerificationError("index out of range")
    if len(hashes) > 63:
        raise VerificationError("proof too long")
    fn, sn, r = index, tree_size - 1, leaf
    for p in hashes:
        if sn == 0:
            raise VerificationError("proof too long for the tree")
        if fn % 2 == 1 or fn == sn:
            r = node_hash(p, r)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError("proof too short for the tree")
    if r != root:
        raise VerificationError("inclusion proof does not reach the checkpoint root")


def verify_consistency(old_size: int, old_root: bytes, new_size: int, new_root: bytes,
                       hashes: List[bytes]) -> None:
    """§9.2 (RFC 9162 §2.1.4.2)."""
    if old_size > new_size:
        raise VerificationError("rollback: old size above new size")
    if old_size == 0:
        if hashes:
            raise VerificationError("non-empty proof from the empty tree")
        return
    if old_size == new_size:
        if hashes:
            raise VerificationError("non-empty proof for equal sizes")
        if old_root != new_root:
            raise VerificationError("fork: same size, different roots")
        return
    if not hashes:
        raise VerificationError("empty consistency proof")
    hs = list(hashes)
    if old_size & (old_size - 1) == 0:
        hs.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn % 2 == 1:
        fn >>= 1
        sn >>= 1
    fr = sr = hs[0]
    for c in hs[1:]:
        if sn == 0:
            raise VerificationError("consistency proof too long")
        if fn % 2 == 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if fr != old_root:
        raise VerificationError("consistency proof does not give the old root")
    if sr != new_root:
        raise VerificationError("consistency proof does not give the new root")
    if sn != 0:
        raise VerificationError("consistency proof too short")


# -- Canonical bytes (§8.2, §8.3) -------------------------------------------

MAX_INT = 2 ** 53 - 1


def _canon_str(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20:
            out.append("\\u%04x" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical_encode(obj: Dict[str, Any]) -> bytes:
    parts = []
    for k in sorted(obj, key=lambda k: k.encode("utf-8")):
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise VerificationError("value of %r is neither string nor integer" % k)
        if isinstance(v, int):
            if not (0 <= v <= MAX_INT):
                raise VerificationError("integer %r out of range" % k)
            parts.append(_canon_str(k) + ":" + str(v))
        else:
            parts.append(_canon_str(k) + ":" + _canon_str(v))
    try:
        return ("{" + ",".join(parts) + "}").encode("utf-8")
    except UnicodeEncodeError:
        raise VerificationError("string is not valid UTF-8")


def _no_dupes(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    d: Dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise VerificationError("key %r twice" % k)
        d[k] = v
    return d


def _reject(x: str) -> Any:
    raise VerificationError("non-integer number %r" % x)


def decode_canonical(body: bytes) -> Dict[str, Any]:
    """§11 step 4: parse, encode again by the rules, compare the bytes."""
    if len(body) > 64 * 1024:
        raise VerificationError("body over 64 KiB")
    try:
        text = body.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_dupes, parse_float=_reject,
                         parse_constant=_reject)
    except VerificationError:
        raise
    except (UnicodeDecodeError, ValueError) as e:
        raise VerificationError("body is not JSON: %s" % e)
    if not isinstance(obj, dict):
        raise VerificationError("body is not an object")
    if canonical_encode(obj) != body:
        raise VerificationError("body is not in canonical form")
    return obj


TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
MONEY_RE = re.compile(r"(0|[1-9][0-9]*)\.[0-9]{6}")
SHA_RE = re.compile(r"[0-9a-f]{64}")

KINDS: Dict[str, Tuple[List[str], List[str]]] = {
    "worker_registered": (["worker_id", "node_id", "key_id"], ["credential_id", "provisioning_credential_id"]),
    "artifact_reported": (["job_id", "worker_id", "lease_epoch", "artifact_id"],
                          ["checksum_sha256", "size_bytes", "lease_id", "artifact_type", "name", "uri",
                           "metadata_sha256"]),
    "job_completed": (["job_id", "worker_id", "job_type", "lease_epoch", "attempt", "started_at",
                       "ended_at"], ["lease_id", "output_uri", "metrics_sha256"]),
    "job_charged": (["job_id", "worker_id", "gpu_count", "rate_usd_per_gpu_hour", "started_at",
                     "ended_at", "actual_ms", "actual_hours", "actual_cost_usd"], ["lease_id", "gpu_sku"]),
    "job_failed": (["job_id", "worker_id", "job_type", "lease_epoch", "attempt", "error_code",
                    "outcome"], ["lease_id", "started_at", "ended_at", "payload_sha256"]),
    "envelope_activated": (["actor", "reason"], ["until"]),
    "envelope_deactivated": (["actor", "reason"], []),
    "credential_minted": (["credential_id", "principal_id", "scopes"], ["actor", "expires_at"]),
    "credential_revoked": (["credential_id"], ["principal_id", "actor", "reason"]),
    "principal_created": (["principal_id", "actor"], ["name"]),
    "worker_banned": (["worker_id"], ["node_id", "actor", "reason"]),
    "worker_unbanned": (["worker_id"], ["node_id", "actor", "reason"]),
    "worker_approved": (["worker_id", "actor"], ["node_id", "reason", "job_types", "tags"]),
    "node_audit": (["worker_id", "event_type", "occurred_at", "payload_sha256"], ["node_id"]),
}
INT_FIELDS = {"v", "policy_version", "lease_epoch", "attempt", "gpu_count", "actual_ms", "size_bytes"}
TIME_FIELDS = {"server_time", "started_at", "ended_at", "until", "expires_at", "occurred_at"}
MONEY_FIELDS = {"rate_usd_per_gpu_hour", "actual_cost_usd", "actual_hours"}


def parse_receipt_time(s: str) -> int:
    """Microseconds since the epoch of a six-digit receipt time."""
    if not TIME_RE.fullmatch(s):
        raise VerificationError("bad receipt time %r" % s)
    d = _dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.timezone.utc)
    return (d - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) // _dt.timedelta(microseconds=1)


def parse_api_time(s: str) -> _dt.datetime:
    """An RFC 3339 UTC time of a JSON answer (at most microsecond precision)."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,6}))?Z", s)
    if not m:
        raise ValueError("bad time %r" % s)
    frac = (m.group(2) or "").ljust(6, "0")
    return _dt.datetime.strptime(m.group(1) + "." + frac, "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=_dt.timezone.utc)


def _micro(s: str) -> int:
    if not MONEY_RE.fullmatch(s):
        raise VerificationError("bad decimal %r" % s)
    whole, frac = s.split(".")
    return int(whole) * 1_000_000 + int(frac)


def _fmt6(micro: int) -> str:
    return "%d.%06d" % divmod(micro, 1_000_000)


def check_fields(r: Dict[str, Any]) -> None:
    """§8.2/§8.3: the kind's fields, their types, and job_charged's arithmetic (§7)."""
    if r.get("v") != 1:
        raise VerificationError('"v" is not 1')
    kind = r.get("kind")
    if kind not in KINDS:
        raise VerificationError("unknown kind %r" % kind)
    req, opt = KINDS[kind]
    base_req = ["v", "kind", "id", "policy_version"]
    allowed = set(base_req) | {"server_time"} | set(req) | set(opt)
    for k in base_req + req:
        if k not in r:
            raise VerificationError("%s lacks %r" % (kind, k))
    for k, v in r.items():
        if k not in allowed:
            raise VerificationError("%s has unexpected field %r" % (kind, k))
        if k in INT_FIELDS:
            if not isinstance(v, int) or isinstance(v, bool):
                raise VerificationError("%r is not an integer" % k)
        elif not isinstance(v, str) or v == "":
            raise VerificationError("%r is not a non-empty string" % k)
        elif k in TIME_FIELDS:
            parse_receipt_time(v)
        elif k in MONEY_FIELDS:
            _micro(v)
        elif k.endswith("_sha256") and not SHA_RE.fullmatch(v):
            raise VerificationError("%r is not 64 lowercase hex" % k)
    if "started_at" in r and "ended_at" in r:
        if parse_receipt_time(r["ended_at"]) < parse_receipt_time(r["started_at"]):
            raise VerificationError("ended_at before started_at")
    if kind == "job_charged":
        us = parse_receipt_time(r["ended_at"]) - parse_receipt_time(r["started_at"])
        ms = -(-us // 1000)
        if r["actual_ms"] != ms:
            raise VerificationError("actual_ms %d, expected %d" % (r["actual_ms"], ms))
        # hours: ms / 3,600,000 with six decimals, half up -> micro-hours
        micro_h = (ms * 1_000_000 * 2 + 3_600_000) // (2 * 3_600_000)
        if r["actual_hours"] != _fmt6(micro_h):
            raise VerificationError("actual_hours %s, expected %s" % (r["actual_hours"], _fmt6(micro_h)))
        rate = _micro(r["rate_usd_per_gpu_hour"])
        cost = -(-(ms * r["gpu_count"] * rate) // 3_600_000)
        if r["actual_cost_usd"] != _fmt6(cost):
            raise VerificationError("actual_cost_usd %s, expected %s" % (r["actual_cost_usd"], _fmt6(cost)))


def payload_sha256(obj: Any) -> str:
    """§8.2: SHA-256 of the payload's JSON with insignificant whitespace removed."""
    return hashlib.sha256(_dumps(obj)).hexdigest()


# -- A completion answer (§5.8, §11) ------------------------------------------


@dataclass
class VerifiedCompletion:
    checkpoint: Checkpoint
    completed: Dict[str, Any]
    charged: Dict[str, Any]


def verify_receipt(wire: Dict[str, Any], proof: Dict[str, Any], cp: Checkpoint) -> Dict[str, Any]:
    """§11 steps 3 and 4 for one receipt and its proof against a verified checkpoint."""
    try:
        body = b64std_decode(wire["body"])
    except (KeyError, ValueError, binascii.Error):
        raise VerificationError("receipt body is not base64")
    if proof.get("index") != wire.get("index") or not isinstance(proof.get("index"), int):
        raise VerificationError("proof index is not the receipt index")
    if proof.get("tree_size") != cp.size:
        raise VerificationError("proof tree_size is not the checkpoint size")
    verify_inclusion(leaf_hash(body), proof["index"], proof["tree_size"], _hashes(proof.get("hashes")),
                     cp.root)
    r = decode_canonical(body)
    check_fields(r)
    if r["id"] != wire.get("id") or r["kind"] != wire.get("kind"):
        raise VerificationError("wire id/kind disagree with the body")
    return r


def verify_completion(answer: Dict[str, Any], receipt_public_key: str, origin: Optional[str] = None,
                      job_id: Optional[str] = None, worker_id: Optional[str] = None,
                      lease_id: Optional[str] = None,
                      metrics: Any = None) -> VerifiedCompletion:
    """Verify a complete answer offline, with only the verifier key (and what we sent)."""
    vkey = parse_verifier_key(receipt_public_key, origin)
    cp = verify_checkpoint(answer.get("checkpoint", ""), vkey, origin)
    receipts, proofs = answer.get("receipts"), answer.get("proofs")
    if not isinstance(receipts, list) or not isinstance(proofs, list) or len(receipts) != 2 \
            or len(proofs) != 2:
        raise VerificationError("expected two receipts and two proofs")
    done = verify_receipt(receipts[0], proofs[0], cp)
    charge = verify_receipt(receipts[1], proofs[1], cp)
    rid = answer.get("receipt_id")
    if done["kind"] != "job_completed" or charge["kind"] != "job_charged":
        raise VerificationError("receipts are not job_completed, job_charged")
    if done["id"] != rid or charge["id"] != rid + ".charge":
        raise VerificationError("receipt ids disagree with receipt_id")
    if (answer.get("job") or {}).get("receipt_id") not in (None, rid):
        raise VerificationError("job.receipt_id disagrees")
    for r in (done, charge):
        if job_id is not None and r["job_id"] != job_id:
            raise VerificationError("receipt names another job")
        if worker_id is not None and r["worker_id"] != worker_id:
            raise VerificationError("receipt names another worker")
        if lease_id is not None and r.get("lease_id", lease_id) != lease_id:
            raise VerificationError("receipt names another lease")
    if done["job_id"] != charge["job_id"] or done["started_at"] != charge["started_at"] \
            or done["ended_at"] != charge["ended_at"]:
        raise VerificationError("job_completed and job_charged disagree")
    for k in ("actual_ms", "actual_hours", "actual_cost_usd"):
        if answer.get(k) != charge[k]:
            raise VerificationError("answer %s %r is not the receipt's %r" % (k, answer.get(k), charge[k]))
    if metrics is not None and done.get("metrics_sha256") != payload_sha256(metrics):
        raise VerificationError("metrics_sha256 is not the hash of the metrics sent")
    return VerifiedCompletion(cp, done, charge)


class Witness:
    """§11 step 5: keep the latest verified checkpoint; newer ones need a consistency proof."""

    def __init__(self, receipt_public_key: str, origin: Optional[str] = None):
        self.vkey = parse_verifier_key(receipt_public_key, origin)
        self.origin = origin if origin is not None else self.vkey.name
        self.latest: Optional[Checkpoint] = None

    def update(self, note: str, proof_fetcher: Callable[[int, int], List[str]]) -> Checkpoint:
        cp = verify_checkpoint(note, self.vkey, self.origin)
        old = self.latest
        if old is not None:
            if cp.size < old.size:
                raise VerificationError("rollback: %d < %d" % (cp.size, old.size))
            if cp.size == old.size:
                if cp.root != old.root:
                    raise VerificationError("fork at size %d" % cp.size)
            else:
                verify_consistency(old.size, old.root, cp.size, cp.root,
                                   _hashes(proof_fetcher(old.size, cp.size)))
        self.latest = cp
        return cp


# ---------------------------------------------------------------------------
# One job, start to end (the CLI's `run`)
# ---------------------------------------------------------------------------


def run_once(url: str, provisioning_token: str, receipt_public_key: str, origin: Optional[str],
             node_id: str, wait_seconds: int = 10, job_types: Optional[List[str]] = None,
             log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
    conn = Connection(url)
    w = Worker(conn, Signer())
    job_types = job_types or ["status_check"]
    reg = w.register(provisioning_token, node_id, name=node_id, hostname="localhost",
                     role="local_gpu_compute", version="nodelane-python/0.1",
                     capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}], "job_types": job_types},
                     governor_limits={"max_jobs": 1, "max_vram_mb": 24576}, heartbeat_interval_seconds=30)
    log("registered %s as %s" % (node_id, reg["worker_id"]))
    lease = w.lease(wait_seconds=wait_seconds)
    if not lease.get("lease_token"):
        return {"worker_id": w.worker_id, "leased": False, "message": lease.get("message")}
    job, tok = lease["job"], lease["lease_token"]
    log("leased %s (%s)" % (job["id"], job["job_type"]))
    w.accept(job["id"], tok)
    w.status(job["id"], tok, "progress", "started", {"step": 1})
    w.log(job["id"], tok, 1, "hello from python")
    metrics = {"ok": 1}
    ans = w.complete(job["id"], tok, output_uri="file:///dev/null", metrics=metrics, final_message="done")
    v = verify_completion(ans, receipt_public_key, origin, job_id=job["id"], worker_id=w.worker_id,
                          lease_id=lease["lease_id"], metrics=metrics)
    log("completed %s; receipts verified against checkpoint size %d" % (job["id"], v.checkpoint.size))
    return {"worker_id": w.worker_id, "leased": True, "job_id": job["id"], "receipt_id": ans["receipt_id"],
            "actual_ms": ans["actual_ms"], "actual_cost_usd": ans["actual_cost_usd"],
            "checkpoint_size": v.checkpoint.size, "verified": True}


# ---------------------------------------------------------------------------
# Worked examples of PROTOCOL.md (the CLI's `vectors`)
# ---------------------------------------------------------------------------

DOC_SEED = bytes.fromhex("9f8362f87a484a954e6e740c5b4c0e84229139a20aa8ab56ff66586f6a7d29c5")
DOC_TOKEN = "nlc_000RxY9kz6ouWMJLgFtBDiYDMREKtrwCJfLBML0eaQHzOzSDhgW39sPXcZ1SIERix0BQRXB"
DOC_REGISTER_BODY = (
    b'{"node_id":"studio-gpu-1","name":"Studio-GPU","hostname":"studio.local","role":"local_gpu_compute",'
    b'"capabilities":{"gpus":[{"sku":"rtx-4090","vram_mb":24576}],"job_types":["embedding_dry_run",'
    b'"lora_train"]},"governor_limits":{"max_jobs":2,"max_vram_mb":24576},"version":"worker/1.0.0",'
    b'"heartbeat_interval_seconds":30,"public_key":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}')
DOC_SIGNATURE = ("cIXe2dpXIENN5rb6eujOP1ip2Wjs1FGOqzc9JYFCfiWhfasl5Np9YUoERkqJ3Dx6anfATSkb91RPBmhzuXo+DQ==")
DOC_VKEY = "nodelane.local/receipts+31f6a790+ASVDuS/xCVURR2rcg2nbbdyTNmWhGXjdoUBO4QZsqVWd"


def check_doc_vectors() -> List[str]:
    """Recompute a few worked examples of PROTOCOL.md; return what was checked."""
    done = []
    s = Signer.from_seed(DOC_SEED)
    assert s.public_raw.hex() == "26b40b8f93fff3d897112f7ebc582b232dbd72517d082fe83cfb30ddce43d1bb"
    assert s.public_key == "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"
    assert s.keyid == "sWwtG-rRJiY5dk_bDuTTd0WZM2vUk0BM2ksRNsWfIGI"
    done.append("§4.7 signing-key")
    assert len(DOC_REGISTER_BODY) == 376
    sh = sign_request(s, "POST", "cp.example.com", "/workers/register", DOC_REGISTER_BODY,
                      created=1796029140, nonce=b64url_nopad(b"nodelane-nonce-1"))
    assert sh.headers["Content-Digest"] == "sha-256=:vSG5Q5zM1hu/0xqY8oXONy72Gfk1VQApMU5pjqa2cgo=:"
    assert sh.headers["Signature"] == "nodelane=:" + DOC_SIGNATURE + ":", sh.headers["Signature"]
    done.append("§4.7 signed-request and signature-base")
    assert credential_token_ok(DOC_TOKEN)
    assert credential_id_of(DOC_TOKEN) == "000102030405060708090a0b0c0d0e0f"
    assert make_token("nlc_", bytes(range(16)) + bytes(range(0x20, 0x40)), 65) == DOC_TOKEN
    done.append("§2.1 credential-token")
    vk = parse_verifier_key(DOC_VKEY, DEFAULT_ORIGIN)
    assert vk.public_key.hex() == "2543b92ff1095511476adc8369db6ddc933665a11978dda1404ee1066ca9559d"
    done.append("§10.3 checkpoint-keys")
    return done


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="register, lease one job, run it, complete it, verify the receipts")
    r.add_argument("--url", required=True)
    r.add_argument("--provisioning-token-file", default=None,
                   help="file holding the node:register token (default: $NODELANE_PROVISIONING_TOKEN); "
                        "never the token itself on the command line, which every local user can read")
    r.add_argument("--receipt-public-key", required=True)
    r.add_argument("--origin", default=None, help="expected log origin (default: the key name)")
    r.add_argument("--node-id", default="py-worker-%s" % os.urandom(4).hex())
    r.add_argument("--wait-seconds", type=int, default=10)
    r.add_argument("--job-type", action="append", default=None)
    v = sub.add_parser("verify", help="verify a saved complete answer (JSON) offline")
    v.add_argument("--receipt-public-key", required=True)
    v.add_argument("--origin", default=None)
    v.add_argument("answer", help="file with the JSON answer of complete, or - for stdin")
    sub.add_parser("vectors", help="check the worked examples of PROTOCOL.md")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "run":
            if a.provisioning_token_file:
                with open(a.provisioning_token_file, encoding="utf-8") as f:
                    prov = f.read().strip()
            else:
                prov = os.environ.pop("NODELANE_PROVISIONING_TOKEN", "").strip()
            if not prov:
                print("no provisioning token: give --provisioning-token-file or NODELANE_PROVISIONING_TOKEN",
                      file=sys.stderr)
                return 1
            out = run_once(a.url, prov, a.receipt_public_key, a.origin, a.node_id,
                           a.wait_seconds, a.job_type, log=lambda s: print(s, file=sys.stderr))
            print(json.dumps(out))
            return 0 if out.get("verified") else 3
        if a.cmd == "verify":
            data = sys.stdin.read() if a.answer == "-" else open(a.answer, encoding="utf-8").read()
            res = verify_completion(json.loads(data), a.receipt_public_key, a.origin)
            print(json.dumps({"verified": True, "receipt_id": res.completed["id"],
                              "checkpoint_size": res.checkpoint.size}))
            return 0
        if a.cmd == "vectors":
            for line in check_doc_vectors():
                print("ok", line)
            return 0
    except VerificationError as e:
        print("verification failed: %s" % e, file=sys.stderr)
        return 2
    except APIError as e:
        print("control plane: %s" % e, file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
