"""Request signing: the RFC 9421 profile of docs/PROTOCOL.md §4, without an RFC 9421 library.

A worker request carries Content-Digest (RFC 9530, §4.2), Signature-Input
(§4.3) and Signature (§4.5): an Ed25519 signature over a seven-line
signature base (§4.4). sign_request builds all three; signature_base and
rfc9421_signature_base build the bytes that are signed, so that the shared
vectors of replay/testdata/ can be reproduced byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: The tag of the profile's signatures (§4.3).
TAG = "nodelane-worker/v1"
#: The label of the profile's Signature and Signature-Input members (§4.3).
LABEL = "nodelane"
#: The covered components, in order (§4.3).
COMPONENTS = ("@method", "@authority", "@path", "@query", "content-digest", "content-type")
#: The Content-Type every worker request carries and signs.
CONTENT_TYPE = "application/json"
#: How long a signature is valid after it is created (§4.3: expires = created + 300).
VALIDITY_SECONDS = 300


# -- Encodings (§1, §4.1) ------------------------------------------------------


def b64url_nopad(b: bytes) -> str:
    """Base64url (RFC 4648 §5) without padding."""
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def b64url_nopad_decode(s: str) -> bytes:
    """Decode canonical unpadded base64url; raise ValueError for anything else."""
    if not isinstance(s, str) or not re.fullmatch(r"[A-Za-z0-9_-]*", s):
        raise ValueError("not base64url")
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if b64url_nopad(raw) != s:
        raise ValueError("not canonical base64url")
    return raw


def b64std(b: bytes) -> str:
    """Standard base64 with padding."""
    return base64.b64encode(b).decode("ascii")


def b64std_decode(s: str) -> bytes:
    """Decode canonical standard base64 with padding; raise ValueError for anything else."""
    if not isinstance(s, str):
        raise ValueError("not a string")
    raw = base64.b64decode(s, validate=True)
    if b64std(raw) != s:
        raise ValueError("not canonical base64")
    return raw


# -- The node key (§4.1) -------------------------------------------------------


class Signer:
    """A node's Ed25519 key: it signs signature bases and names itself by public_key and keyid.

    public_key is the 32 raw bytes in unpadded base64url (the register body's
    field); keyid is the SHA-256 of those bytes, in unpadded base64url.
    """

    def __init__(self, private_key: Optional[Ed25519PrivateKey] = None):
        self.private_key = private_key or Ed25519PrivateKey.generate()
        self.public_raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = b64url_nopad(self.public_raw)
        self.keyid = key_id(self.public_raw)

    @classmethod
    def from_pem(cls, pem: bytes) -> "Signer":
        """A Signer of a PKCS#8 PEM Ed25519 private key."""
        k = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(k, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 key")
        return cls(k)

    @classmethod
    def from_seed(cls, seed: bytes) -> "Signer":
        """A Signer of a 32-byte Ed25519 seed."""
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed has 32 bytes, not %d" % len(seed))
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def seed(self) -> bytes:
        """The 32-byte seed of the private key."""
        return self.private_key.private_bytes(serialization.Encoding.Raw,
                                              serialization.PrivateFormat.Raw,
                                              serialization.NoEncryption())

    def pem(self) -> bytes:
        """The private key as PKCS#8 PEM."""
        return self.private_key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of data."""
        return self.private_key.sign(data)

    def __repr__(self) -> str:
        return "Signer(keyid=%s)" % self.keyid


def key_id(public_raw: bytes) -> str:
    """The keyid of a 32-byte public key: unpadded base64url of its SHA-256 (§4.1)."""
    return b64url_nopad(hashlib.sha256(public_raw).digest())


def new_nonce(nbytes: int = 16) -> str:
    """A fresh nonce: nbytes (16 to 64) random bytes in unpadded base64url (§4.3)."""
    if not 16 <= nbytes <= 64:
        raise ValueError("a nonce has 16 to 64 bytes")
    return b64url_nopad(os.urandom(nbytes))


# -- The signature base (§4.2-§4.4) --------------------------------------------


def content_digest(body: bytes) -> str:
    """The Content-Digest of body: sha-256=:<base64>: (§4.2)."""
    return digest_header(hashlib.sha256(body).digest())


def digest_header(sha256: bytes) -> str:
    """The Content-Digest of a body whose 32-byte SHA-256 is sha256 (a body hashed while streamed)."""
    if len(sha256) != 32:
        raise ValueError("a SHA-256 has 32 bytes, not %d" % len(sha256))
    return "sha-256=:" + b64std(sha256) + ":"


def signature_params(created: int, expires: int, nonce: str, keyid: str) -> str:
    """The profile's inner list with its parameters, in the order signers use (§4.3)."""
    comps = " ".join('"%s"' % c for c in COMPONENTS)
    return '(%s);created=%d;expires=%d;nonce="%s";keyid="%s";tag="%s"' % (
        comps, created, expires, nonce, keyid, TAG)


def authority_for_signing(host: str, scheme: str = "http") -> str:
    """@authority: the Host as sent, lowercased, without the scheme's default port (§4.4)."""
    host = host.lower()
    default = ":443" if scheme == "https" else ":80"
    if host.endswith(default):
        host = host[: -len(default)]
    return host


def rfc9421_signature_base(components: Sequence[Tuple[str, str]], params: str) -> bytes:
    """A generic RFC 9421 §2.5 signature base: one `"name": value` line per covered component,
    then `"@signature-params": params`; lines joined by LF, none after the last.

    components are (name, value) pairs in the order of the covered components,
    values already derived (RFC 9421 §2.1-§2.2). A control character in any line
    raises ValueError.
    """
    lines = ['"%s": %s' % (name, value) for name, value in components]
    lines.append('"@signature-params": %s' % params)
    for line in lines:
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in line):
            raise ValueError("control character in a signed component")
    return "\n".join(lines).encode("utf-8")


def derive_components(method: str, authority: str, target: str,
                      headers: Dict[str, str], names: Sequence[str]) -> Tuple[Tuple[str, str], ...]:
    """Derive the values of the named components of a request (RFC 9421 §2.1-§2.2).

    target is the request-target as sent (path and query, not decoded);
    headers' names are matched without case and their values trimmed of
    spaces and tabs.
    """
    path, _, query = target.partition("?")
    lower = {k.lower(): v for k, v in headers.items()}
    out = []
    for name in names:
        if name == "@method":
            v = method
        elif name == "@authority":
            v = authority_for_signing(authority)
        elif name == "@path":
            v = path or "/"
        elif name == "@query":
            v = "?" + query
        elif name.startswith("@"):
            raise ValueError("unsupported derived component %s" % name)
        else:
            if name not in lower:
                raise ValueError("the request has no %s header" % name)
            v = lower[name].strip(" \t")
        out.append((name, v))
    return tuple(out)


def signature_base(method: str, authority: str, target: str, digest: str,
                   content_type: str, params: str) -> bytes:
    """The profile's seven-line signature base (§4.4)."""
    comps = derive_components(method, authority, target,
                              {"content-digest": digest, "content-type": content_type}, COMPONENTS)
    return rfc9421_signature_base(comps, params)


@dataclass
class SignedHeaders:
    """The headers sign_request made, with the signature base and parameters they carry."""

    headers: Dict[str, str]
    base: bytes
    created: int
    expires: int
    nonce: str


def sign_request(signer: Signer, method: str, authority: str, target: str, body: Optional[bytes],
                 content_type: str = CONTENT_TYPE, created: Optional[int] = None,
                 expires: Optional[int] = None, nonce: Optional[str] = None,
                 now: Optional[float] = None, digest: Optional[str] = None) -> SignedHeaders:
    """Sign one request: return its Content-Type, Content-Digest, Signature-Input and Signature.

    created defaults to `now` (the caller's estimate of the server's clock, in
    Unix seconds; the local clock when None), expires to created + 300, nonce to
    16 fresh random bytes. The method, authority (the Host header as sent) and
    target (the request-target as sent) must be those of the request. A body
    streamed from a file rather than held in memory is signed by its
    Content-Digest: pass digest (digest_header of its SHA-256) and body None.
    """
    if (digest is None) == (body is None):
        raise ValueError("sign_request takes a body or the digest of one, not both")
    if created is None:
        created = int(now if now is not None else time.time())
    if expires is None:
        expires = created + VALIDITY_SECONDS
    if nonce is None:
        nonce = new_nonce()
    if digest is None:
        digest = content_digest(body)
    params = signature_params(created, expires, nonce, signer.keyid)
    base = signature_base(method, authority, target, digest, content_type, params)
    headers = {
        "Content-Type": content_type,
        "Content-Digest": digest,
        "Signature-Input": LABEL + "=" + params,
        "Signature": LABEL + "=:" + b64std(signer.sign(base)) + ":",
    }
    return SignedHeaders(headers, base, created, expires, nonce)


def verify_signature(public_raw: bytes, base: bytes, signature: bytes) -> bool:
    """Whether signature is the Ed25519 signature of base by the 32-byte public key."""
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, base)
        return True
    except (InvalidSignature, ValueError):
        return False
