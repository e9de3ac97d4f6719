"""The worked examples of docs/PROTOCOL.md (§2.1, §4.7, §10.3), recomputed by check_doc_vectors."""

from __future__ import annotations

from typing import List

from .signing import Signer, b64url_nopad, sign_request
from .tokens import credential_id_of, credential_token_ok, make_token
from .verify import DEFAULT_ORIGIN, parse_verifier_key

#: The seed of the RFC 9421 Appendix B.1.4 test key "test-key-ed25519". Never use it but in tests.
DOC_SEED = bytes.fromhex("9f8362f87a484a954e6e740c5b4c0e84229139a20aa8ab56ff66586f6a7d29c5")
#: The credential token of §2.1.
DOC_TOKEN = "nlc_000RxY9kz6ouWMJLgFtBDiYDMREKtrwCJfLBML0eaQHzOzSDhgW39sPXcZ1SIERix0BQRXB"
#: The register body of §4.7.
DOC_REGISTER_BODY = (
    b'{"node_id":"studio-gpu-1","name":"Studio-GPU","hostname":"studio.local","role":"local_gpu_compute",'
    b'"capabilities":{"gpus":[{"sku":"rtx-4090","vram_mb":24576}],"job_types":["embedding_dry_run",'
    b'"lora_train"]},"governor_limits":{"max_jobs":2,"max_vram_mb":24576},"version":"worker/1.0.0",'
    b'"heartbeat_interval_seconds":30,"public_key":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}')
#: The signature of §4.7's request.
DOC_SIGNATURE = "cIXe2dpXIENN5rb6eujOP1ip2Wjs1FGOqzc9JYFCfiWhfasl5Np9YUoERkqJ3Dx6anfATSkb91RPBmhzuXo+DQ=="
#: The verifier key of §10.3's examples.
DOC_VKEY = "nodelane.local/receipts+31f6a790+ASVDuS/xCVURR2rcg2nbbdyTNmWhGXjdoUBO4QZsqVWd"


def check_doc_vectors() -> List[str]:
    """Recompute a few worked examples of PROTOCOL.md; return what was checked, raise AssertionError."""
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
