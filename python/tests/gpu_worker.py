"""A worker process for the ctx.run tests: python3 gpu_worker.py URL TOKEN_FILE IDENTITY NODE_ID JOB_TYPE NVIDIA_SMI

Runs one handler for JOB_TYPE that runs the job's payload["argv"] with ctx.run
(kill_grace 1 s) on its first attempt, and returns at once on later ones. It
prints one JSON line per event on stdout: "started" (the start or register
answer), "job" (a handler began: job id, attempt), "ended" (a job's end).
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nodelane  # noqa: E402
from scriptio import say  # noqa: E402


def main() -> int:
    url, token_file, identity, node_id, job_type, smi = sys.argv[1:7]
    with open(token_file, encoding="utf-8") as f:
        token = f.read().strip()
    w = nodelane.Worker(url, identity=identity, provisioning_token=token, wait_seconds=2, heartbeat_interval=1,
                        drain_timeout=5, drain_grace=1, timeout=10, kill_grace=1, nvidia_smi=smi,
                        registration={"node_id": node_id},
                        on_job_end=lambda e: say(event="ended", job=e.job["id"], outcome=e.outcome))

    @w.job(job_type)
    def work(ctx: nodelane.JobContext) -> dict:
        say(event="job", job=ctx.job_id, attempt=ctx.attempt)
        if ctx.attempt == 1:
            ctx.run(ctx.payload["argv"], gpus=1)
        return {"attempt": ctx.attempt}

    def announce() -> None:
        w.ready.wait()
        say(event="started", answer=w.start_answer)
    threading.Thread(target=announce, daemon=True).start()
    w.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
