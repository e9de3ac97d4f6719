"""A worker process for the process tests: python3 proc_parent.py CONFIG_JSON

Runs nodelane.process.run_command once, as a worker's job would, with the
config's argv, output_dir, kill_grace, record and a RunningFile at the
config's running path, and prints one JSON line per event on stdout: "log"
(an output line of the command: message, payload) and, if it ever gets
there, "end" (outcome, error code). The tests kill it (SIGKILL) while the
command runs, to see what its shim and a restarted worker do.
"""

from __future__ import annotations

import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nodelane import process  # noqa: E402
from nodelane.errors import NodelaneError  # noqa: E402
from scriptio import say  # noqa: E402


class PrintSink:
    """Prints what the run reports."""

    def log(self, message: str, payload: object) -> None:
        say(event="log", message=message, payload=payload)

    def progress(self, fraction: object, message: str, metrics: object) -> None:
        say(event="progress", fraction=fraction, message=message)

    def upload(self, path: str, name: str, kind: str, metadata: object) -> dict:
        say(event="upload", path=path, name=name)
        return {}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    env = process.scrubbed_env({"NODELANE_OUTPUT_DIR": cfg["output_dir"]})
    try:
        r = process.run_command(cfg["argv"], sink=PrintSink(), stop=threading.Event(), stop_reason=lambda: None,
                                env=env, cwd=None, output_dir=cfg["output_dir"], kill_grace=cfg["kill_grace"],
                                registry=process.RunningFile(cfg["running"]), record=cfg["record"])
        say(event="end", outcome="succeeded", metrics=r.metrics)
    except NodelaneError as e:
        say(event="end", outcome="failed", error=str(e), code=getattr(e, "code", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
