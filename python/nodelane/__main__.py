"""The nodelane command: `python3 -m nodelane run|verify|vectors` (see --help)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from .client import Client
from .errors import APIError, TransportError, VerificationError
from .signing import Signer
from .vectors import check_doc_vectors
from .verify import verify_completion


def run_once(url: str, provisioning_token: str, receipt_public_key: str, origin: Optional[str],
             node_id: str, wait_seconds: int = 10, job_types: Optional[List[str]] = None,
             log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
    """Register, lease one job, accept it, report, complete it and verify its receipts offline."""
    c = Client(url, Signer())
    job_types = job_types or ["status_check"]
    reg = c.register(provisioning_token, node_id, name=node_id, hostname="localhost",
                     role="local_gpu_compute", version="nodelane-python/0.1",
                     capabilities={"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}], "job_types": job_types},
                     governor_limits={"max_jobs": 1, "max_vram_mb": 24576}, heartbeat_interval_seconds=30)
    log("registered %s as %s" % (node_id, reg["worker_id"]))
    lease = c.lease(wait_seconds=wait_seconds)
    if not lease.get("lease_token"):
        return {"worker_id": c.worker_id, "leased": False, "message": lease.get("message")}
    job, tok = lease["job"], lease["lease_token"]
    log("leased %s (%s)" % (job["id"], job["job_type"]))
    c.accept(job["id"], tok)
    c.status(job["id"], tok, "progress", "started", {"step": 1})
    c.log(job["id"], tok, 1, "hello from python")
    metrics = {"ok": 1}
    ans = c.complete(job["id"], tok, output_uri="file:///dev/null", metrics=metrics, final_message="done",
                     wait_for_proofs=True)
    v = verify_completion(ans, receipt_public_key, origin, job_id=job["id"], worker_id=c.worker_id,
                          lease_id=lease["lease_id"], metrics=metrics)
    log("completed %s; receipts verified against checkpoint size %d" % (job["id"], v.checkpoint.size))
    return {"worker_id": c.worker_id, "leased": True, "job_id": job["id"], "receipt_id": ans["receipt_id"],
            "actual_ms": ans["actual_ms"], "actual_cost_usd": ans["actual_cost_usd"],
            "checkpoint_size": v.checkpoint.size, "verified": True}


def main(argv: Optional[List[str]] = None) -> int:
    """The command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python3 -m nodelane", description="A nodelane worker (protocol v1).")
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
            if a.answer == "-":
                data = sys.stdin.read()
            else:
                with open(a.answer, encoding="utf-8") as f:
                    data = f.read()
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
    except (APIError, TransportError) as e:
        print("control plane: %s" % e, file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
