"""Output of the worker scripts of this directory (drain_worker.py, restart_worker.py,
artifact_worker.py): one JSON object a line on stdout, whole, whichever thread writes it."""

from __future__ import annotations

import json
import sys
import threading

_lock = threading.Lock()


def say(**kw: object) -> None:
    """Write kw as one JSON line. print() writes the text and the newline in two calls, so
    two threads (a handler and the on_job_end hook) could share a line; one write under a
    lock cannot."""
    line = json.dumps(kw) + "\n"
    with _lock:
        sys.stdout.write(line)
        sys.stdout.flush()
