"""A worker process for the drain tests: python3 drain_worker.py URL TOKEN_FILE JOB_TYPE JOB_SECONDS DRAIN_TIMEOUT

Runs one handler that works JOB_SECONDS (watching for cancellation), prints
one JSON line per event on stdout, and drains on SIGTERM.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nodelane  # noqa: E402
from scriptio import say  # noqa: E402


def main() -> int:
    url, token_file, job_type, seconds, drain_timeout = sys.argv[1:6]
    with open(token_file, encoding="utf-8") as f:
        token = f.read().strip()
    w = nodelane.Worker(url, provisioning_token=token, wait_seconds=5, heartbeat_interval=0.5,
                        drain_timeout=float(drain_timeout), drain_grace=2,
                        registration={"node_id": "drain-" + os.urandom(4).hex()},
                        on_job_end=lambda e: say(event="ended", job=e.job["id"], outcome=e.outcome))

    @w.job(job_type)
    def work(ctx: nodelane.JobContext) -> dict:
        say(event="started", job=ctx.job_id)
        ctx.sleep(float(seconds))  # raises Cancelled if the job must stop
        return {"worked": float(seconds)}

    say(event="running")
    w.run()
    say(event="exited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
