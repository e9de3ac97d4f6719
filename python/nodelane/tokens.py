"""The shapes of bearer credentials (`nlc_`, PROTOCOL.md §2.1) and lease tokens (`nll_`, §2.3).

A client treats tokens as opaque secrets; these checks only catch a token
mangled in transit or pasted wrong before it is sent.
"""

from __future__ import annotations

import os
import zlib

B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def base62(n: int, width: int) -> str:
    """n in base 62, most significant digit first, left-padded with 0 to width digits."""
    out = []
    while n:
        n, r = divmod(n, 62)
        out.append(B62[r])
    s = "".join(reversed(out))
    if len(s) > width:
        raise ValueError("number too large for width")
    return s.rjust(width, "0")


def make_token(prefix: str, payload: bytes, body_digits: int) -> str:
    """prefix + base62(payload) + base62(crc32(prefix + body), 6) (§2.1, §2.3)."""
    head = prefix + base62(int.from_bytes(payload, "big"), body_digits)
    return head + base62(zlib.crc32(head.encode("ascii")) & 0xFFFFFFFF, 6)


def token_shape_ok(token: str, prefix: str, length: int) -> bool:
    """Whether token has the prefix, the length, base62 digits and a good checksum."""
    if not isinstance(token, str) or len(token) != length or not token.startswith(prefix):
        return False
    if any(c not in B62 for c in token[len(prefix):]):
        return False
    head = token[:-6]
    return base62(zlib.crc32(head.encode("ascii")) & 0xFFFFFFFF, 6) == token[-6:]


def credential_token_ok(token: str) -> bool:
    """Whether token has the shape of an `nlc_` bearer credential (75 characters)."""
    return token_shape_ok(token, "nlc_", 75)


def credential_id_of(token: str) -> str:
    """The credential id (32 lowercase hex digits) of a well-formed `nlc_` token."""
    if not credential_token_ok(token):
        raise ValueError("not a credential token")
    n = 0
    for c in token[4:69]:
        n = n * 62 + B62.index(c)
    return n.to_bytes(48, "big")[:16].hex()


def lease_token_ok(token: str) -> bool:
    """Whether token has the shape of an `nll_` lease token (53 characters)."""
    return token_shape_ok(token, "nll_", 53)


def random_lease_token() -> str:
    """A well-formed lease token that is nobody's lease (for tests)."""
    return make_token("nll_", os.urandom(32), 43)
