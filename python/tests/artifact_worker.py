"""A worker process for the checkpoint tests: python3 artifact_worker.py URL TOKEN_FILE IDENTITY NODE_ID JOB_TYPE SCRATCH

One handler; one JSON line per event on stdout: "started" (the worker is
up), "job" (a handler began: job id, attempt, and the SHA-256, size and path
of ctx.resume_from when there is one), "uploaded" (the first attempt stored
its checkpoint: artifact_id, sha256), "ended" (a job's end). The first
attempt writes payload["size"] random bytes to a file, uploads it as a
checkpoint, then works until cancelled (the test kills the process); a later
attempt returns at once with the checkpoint's SHA-256 as its metrics.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nodelane  # noqa: E402
from scriptio import say  # noqa: E402


def main() -> int:
    url, token_file, identity, node_id, job_type, scratch = sys.argv[1:7]
    with open(token_file, encoding="utf-8") as f:
        token = f.read().strip()
    w = nodelane.Worker(url, identity=identity, provisioning_token=token, wait_seconds=2, heartbeat_interval=1,
                        drain_timeout=5, drain_grace=1, timeout=30, scratch_dir=scratch,
                        registration={"node_id": node_id,
                                      "capabilities": {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}},
                        on_job_end=lambda e: say(event="ended", job=e.job["id"], outcome=e.outcome))

    @w.job(job_type)
    def train(ctx: nodelane.JobContext) -> dict:
        resumed = None
        if ctx.resume_from is not None:
            with open(ctx.resume_from, "rb") as f:
                data = f.read()
            resumed = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "path": ctx.resume_from}
        say(event="job", job=ctx.job_id, attempt=ctx.attempt, resumed=resumed)
        if ctx.attempt == 1:
            path = os.path.join(ctx.scratch_dir, "ckpt.bin")
            data = os.urandom(int(ctx.payload.get("size", 1 << 20)))
            with open(path, "wb") as f:
                f.write(data)
            ans = ctx.upload(path, name="ckpt.bin", kind="checkpoint", metadata={"step": 100})
            say(event="uploaded", job=ctx.job_id, artifact_id=ans["artifact_id"],
                sha256=hashlib.sha256(data).hexdigest(), stored=ans.get("stored"))
            ctx.sleep(600)  # raises Cancelled if the job must stop; the test kills the process first
        return {"resumed_sha256": resumed["sha256"] if resumed else ""}

    def announce() -> None:
        w.ready.wait()
        say(event="started")
    threading.Thread(target=announce, daemon=True).start()
    w.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
