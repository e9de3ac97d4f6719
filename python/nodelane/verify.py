"""Offline verification of receipts, inclusion and consistency proofs, and checkpoints.

Everything here needs only the receipt log's verifier key (`receipt_public_key`,
PROTOCOL.md §10.3) and what the control plane answered: nothing is fetched and
nothing of the control plane is trusted. Each check raises VerificationError
when it fails.

- parse_verifier_key: the verifier key `<origin>+<8 hex>+<base64(0x01 || key)>` (§10.3).
- verify_checkpoint: the signed checkpoint note (§10.2, §11 step 2).
- verify_inclusion, verify_consistency: RFC 9162 proofs (§9.1, §9.2).
- decode_canonical, check_fields: a receipt body's canonical bytes and fields (§8).
- verify_receipt: one receipt and its proof against a verified checkpoint (§11 steps 3-4).
- verify_completion: a whole complete answer (§5.8, §11).
- Witness: keeps the latest checkpoint and checks that the log only grows (§11 step 5).
"""

from __future__ import annotations

import binascii
import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import VerificationError
from .signing import b64std_decode

#: The receipt log's default origin (§10.1).
DEFAULT_ORIGIN = "nodelane.local/receipts"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")




@dataclass(frozen=True)
class VerifierKey:
    """A parsed verifier key: the log's name (its origin), the 4-byte key hash and the Ed25519 key."""

    name: str
    key_hash: bytes  # 4 bytes
    public_key: bytes  # 32 bytes


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: the origin, tree size, 32-byte root hash, and the note's text."""

    origin: str
    size: int
    root: bytes
    text: str


def note_key_hash(name: str, public_key: bytes) -> bytes:
    """The 4-byte key hash of a note verifier key: SHA-256(name LF 0x01 key)[:4] (§10.3)."""
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
    """The Merkle leaf hash of a receipt body: SHA-256(0x00 || body) (§9)."""
    return hashlib.sha256(b"\x00" + body).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """An interior Merkle node hash: SHA-256(0x01 || left || right) (§9)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(leaves: List[bytes]) -> bytes:
    """The RFC 9162 root of a list of leaf hashes (for tests and small logs)."""
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
    """The canonical bytes of a receipt object (§8.2): keys in byte order, no spaces, minimal escapes."""
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
                       "ended_at"], ["lease_id", "output_uri", "metrics_sha256", "actual_ms", "gpu_count",
                                     "charged"]),
    "job_charged": (["job_id", "worker_id", "gpu_count", "rate_usd_per_gpu_hour", "started_at",
                     "ended_at", "actual_ms", "actual_hours", "actual_cost_usd"], ["lease_id", "gpu_sku"]),
    "job_failed": (["job_id", "worker_id", "job_type", "lease_epoch", "attempt", "error_code",
                    "outcome"], ["lease_id", "started_at", "ended_at", "payload_sha256", "actual_ms",
                                 "gpu_count", "charged"]),
    "envelope_activated": (["actor", "reason"], ["until"]),
    "envelope_deactivated": (["actor", "reason"], []),
    "credential_minted": (["credential_id", "principal_id", "scopes"], ["actor", "expires_at"]),
    "credential_revoked": (["credential_id"], ["principal_id", "actor", "reason"]),
    "principal_created": (["principal_id", "actor"], ["name"]),
    "worker_banned": (["worker_id"], ["node_id", "actor", "reason"]),
    "worker_retired": (["worker_id", "actor"], ["node_id", "reason"]),
    "worker_unbanned": (["worker_id"], ["node_id", "actor", "reason"]),
    "worker_approved": (["worker_id", "actor"], ["node_id", "reason", "job_types", "tags"]),
    "node_audit": (["worker_id", "event_type", "occurred_at", "payload_sha256"], ["node_id"]),
    "worker_updated": (["worker_id"], ["node_id", "old_job_types", "job_types", "old_tags", "tags", "old_gpus",
                                       "gpus", "old_max_jobs", "max_jobs", "old_max_vram_mb", "max_vram_mb"]),
    "job_retried": (["job_id", "job_type", "actor"], ["reason", "error_code"]),
    "envelope_safe_types_changed": (["actor"], ["reason", "job_types", "old_job_types"]),
}
INT_FIELDS = {"v", "policy_version", "lease_epoch", "attempt", "gpu_count", "actual_ms", "size_bytes",
              "old_max_jobs", "max_jobs", "old_max_vram_mb", "max_vram_mb"}
TIME_FIELDS = {"server_time", "started_at", "ended_at", "until", "expires_at", "occurred_at"}
MONEY_FIELDS = {"rate_usd_per_gpu_hour", "actual_cost_usd", "actual_hours"}


def parse_receipt_time(s: str) -> int:
    """Microseconds since the epoch of a six-digit receipt time."""
    if not TIME_RE.fullmatch(s):
        raise VerificationError("bad receipt time %r" % s)
    d = _dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.timezone.utc)
    return (d - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) // _dt.timedelta(microseconds=1)


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
    for k in opt:
        if k in INT_FIELDS and r.get(k) == 0:
            raise VerificationError("optional %r is 0 (a zero optional field is left out)" % k)
    if "started_at" in r and "ended_at" in r:
        if parse_receipt_time(r["ended_at"]) < parse_receipt_time(r["started_at"]):
            raise VerificationError("ended_at before started_at")
    if kind in ("job_completed", "job_failed"):
        if r.get("charged", "no") not in ("yes", "no"):
            raise VerificationError("charged %r is not yes or no" % r["charged"])
        if "actual_ms" in r:
            if "started_at" not in r or "ended_at" not in r:
                raise VerificationError("actual_ms needs started_at and ended_at")
            us = parse_receipt_time(r["ended_at"]) - parse_receipt_time(r["started_at"])
            if r["actual_ms"] != -(-us // 1000):
                raise VerificationError("actual_ms %d, expected %d" % (r["actual_ms"], -(-us // 1000)))
    if kind == "job_failed" and r["outcome"] not in ("requeued", "failed", "canceled"):
        raise VerificationError("outcome %r is not requeued, failed or canceled" % r["outcome"])
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
    """A verified complete answer: its checkpoint and its job_completed and job_charged receipts."""

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
    """Verify a complete answer offline, with only the verifier key (and what we sent).

    The answer must carry its proofs: a completion answered at once has none
    (§5.8), and VerificationError says so; complete with wait_for_proofs, or
    verify each receipt from GET /operator/receipts/{id}
    (verify_receipt_response)."""
    if not answer.get("proofs") and not answer.get("checkpoint"):
        raise VerificationError("the answer carries no proofs yet: complete with wait_for_proofs, or read "
                                "each receipt from GET /operator/receipts/{id}")
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
        """Verify note and adopt it if the log grew consistently; proof_fetcher(old, new) gives
        the consistency proof's base64 hashes (the operator route of §13)."""
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




def verify_receipt_response(answer: Dict[str, Any], receipt_public_key: str,
                            origin: Optional[str] = None) -> Dict[str, Any]:
    """Verify the answer of `GET /operator/receipts/{id}` ({receipt, proof, checkpoint}, §13) offline.

    Returns the receipt's decoded fields. A receipt not sequenced yet (proof or
    checkpoint null) fails: fetch it again later.
    """
    if not isinstance(answer, dict) or not answer.get("proof") or not answer.get("checkpoint"):
        raise VerificationError("the receipt has no proof or checkpoint yet")
    vkey = parse_verifier_key(receipt_public_key, origin)
    cp = verify_checkpoint(answer["checkpoint"], vkey, origin)
    return verify_receipt(answer.get("receipt") or {}, answer["proof"], cp)
