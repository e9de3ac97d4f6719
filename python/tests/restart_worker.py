"""A worker process for the restart tests: python3 restart_worker.py URL TOKEN_FILE IDENTITY NODE_ID JOB_TYPE...

Runs one handler per JOB_TYPE and prints one JSON line per event on stdout:
"started" (the start or register answer), "job" (a handler began: job id,
type, attempt), "ended" (a job's end). A handler works forever (until
cancelled) on the first attempt of a job whose payload says
{"block_first": true}, and returns at once otherwise.
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nodelane  # noqa: E402
from scriptio import say  # noqa: E402


def main() -> int:
    url, token_file, identity, node_id = sys.argv[1:5]
    types = sys.argv[5:]
    with open(token_file, encoding="utf-8") as f:
        token = f.read().strip()
    w = nodelane.Worker(url, identity=identity, provisioning_token=token, wait_seconds=2, heartbeat_interval=1,
                        drain_timeout=5, drain_grace=1, timeout=10,
                        registration={"node_id": node_id,
                                      "capabilities": {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}},
                        on_job_end=lambda e: say(event="ended", job=e.job["id"], outcome=e.outcome))

    def work(ctx: nodelane.JobContext) -> dict:
        say(event="job", job=ctx.job_id, job_type=ctx.job_type, attempt=ctx.attempt)
        if ctx.payload.get("block_first") and ctx.attempt == 1:
            ctx.sleep(600)  # raises Cancelled if the job must stop
        return {"attempt": ctx.attempt}

    for t in types:
        w.handle(t, work)

    def announce() -> None:
        w.ready.wait()
        say(event="started", answer=w.start_answer)
    threading.Thread(target=announce, daemon=True).start()
    w.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
