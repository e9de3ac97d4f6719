"""The shared signature vectors of replay/testdata/, reproduced byte for byte."""

from __future__ import annotations

import base64
import os
import re
from typing import Dict, List, Tuple

import pytest

from nodelane import Signer, sign_request
from nodelane.signing import (content_digest, derive_components, new_nonce, rfc9421_signature_base, signature_base,
                              verify_signature)
from nodelane.vectors import DOC_SEED, check_doc_vectors

from serverproc import ROOT

TESTDATA = os.path.join(ROOT, "replay", "testdata")


def read(name: str) -> str:
    with open(os.path.join(TESTDATA, name), encoding="utf-8") as f:
        return f.read()


def section(text: str, label: str) -> str:
    """The lines after `label:` up to the next blank line."""
    m = re.search(r"^%s[^\n]*:\n(.*?)(?:\n\n|\Z)" % re.escape(label), text, re.S | re.M)
    assert m, label
    return m.group(1)


def parse_request(block: str) -> Tuple[str, str, Dict[str, str], bytes]:
    """(method, target, headers, body) of a request as the vector files write it."""
    head, _, body = block.partition("\n\n")
    lines = head.split("\n")
    method, target, _ = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(": ")
        headers[k] = v
    return method, target, headers, body.split("\n")[0].encode()


def one_byte_changes(b: bytes) -> List[bytes]:
    return [b[:i] + bytes([b[i] ^ 1]) + b[i + 1:] for i in range(0, len(b), max(1, len(b) // 16))]


def test_rfc9421_b26_ed25519():
    text = read("rfc9421-b26-ed25519.txt")
    pem = section(text, "PRIVATE_KEY_PKCS8_PEM").encode() + b"\n"
    signer = Signer.from_pem(pem)
    assert signer.public_key == "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"
    req = text[text.index("REQUEST"):]
    req = req[req.index("\n") + 1:]
    method, target, headers, body = parse_request(req[:req.index("\n\nSIGNATURE_BASE")] )
    want_base = section(text, "SIGNATURE_BASE").encode()
    sig_input = section(text, "SIGNATURE_INPUT_HEADER").split(": ", 1)[1]
    label, _, params = sig_input.partition("=")
    names = re.findall(r'"([^"]+)"', params[:params.index(")")])
    comps = derive_components(method, headers["Host"], target, headers, names)
    base = rfc9421_signature_base(comps, params)
    assert base == want_base
    sig_header = section(text, "SIGNATURE_HEADER").split(": ", 1)[1]
    want_sig = base64.b64decode(sig_header[len(label) + 2:-1])
    assert signer.sign(base) == want_sig
    assert verify_signature(signer.public_raw, base, want_sig)
    for bad in one_byte_changes(base):
        assert not verify_signature(signer.public_raw, bad, want_sig)
    for bad in one_byte_changes(want_sig):
        assert not verify_signature(signer.public_raw, base, bad)
    # the Content-Digest of the RFC's request is sha-512; ours is sha-256 over the same body
    assert content_digest(body).startswith("sha-256=:")


def profile_cases() -> List[Dict[str, str]]:
    text = read("nodelane-signature-v1.txt")
    cases = []
    for chunk in text.split("=== CASE ")[1:]:
        req = chunk[chunk.index("REQUEST:\n") + len("REQUEST:\n"):chunk.index("\n\nSIGNATURE_BASE")]
        base = chunk[chunk.index("SIGNATURE_BASE:\n") + len("SIGNATURE_BASE:\n"):]
        base = base.split("\n\n")[0].rstrip("\n")
        cases.append({"name": chunk.split("\n")[0], "request": req, "base": base})
    assert len(cases) == 2
    return cases


@pytest.mark.parametrize("case", profile_cases(), ids=lambda c: c["name"])
def test_nodelane_signature_v1(case):
    text = read("nodelane-signature-v1.txt")
    signer = Signer.from_seed(DOC_SEED)
    assert signer.public_key == re.search(r"PUBLIC_KEY[^:]*: (\S+)", text).group(1)
    assert signer.keyid == re.search(r"KEYID: (\S+)", text).group(1)
    nonce = re.search(r"NONCE[^:]*: (\S+)", text).group(1)
    assert nonce == base64.urlsafe_b64encode(bytes(range(16))).rstrip(b"=").decode()
    method, target, headers, body = parse_request(case["request"])
    sh = sign_request(signer, method, headers["Host"], target, body, created=1767225600, nonce=nonce)
    assert sh.base == case["base"].encode()
    for k in ("Content-Type", "Content-Digest", "Signature-Input", "Signature"):
        assert sh.headers[k] == headers[k], k
    assert sh.expires == 1767225900
    sig = base64.b64decode(sh.headers["Signature"][len("nodelane=:"):-1])
    assert verify_signature(signer.public_raw, sh.base, sig)
    for bad in one_byte_changes(sh.base):
        assert not verify_signature(signer.public_raw, bad, sig)


def test_doc_vectors():
    assert len(check_doc_vectors()) == 4


def test_signing_bad_input():
    with pytest.raises(ValueError):
        Signer.from_seed(b"short")
    with pytest.raises(ValueError):
        Signer.from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    for n in (15, 65):
        with pytest.raises(ValueError):
            new_nonce(n)
    assert len(new_nonce()) == 22 and new_nonce() != new_nonce()
    with pytest.raises(ValueError, match="control character"):
        signature_base("POST", "example.com", "/workers/heartbeat\n", "sha-256=:x:", "application/json", "()")
    # the default port of the scheme is not part of @authority
    s = Signer.from_seed(DOC_SEED)
    a = sign_request(s, "POST", "Example.COM:80", "/x", b"{}", created=1, nonce=new_nonce())
    assert b'"@authority": example.com\n' in a.base
