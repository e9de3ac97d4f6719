"""The `server` fixture of the interop tests: the real example server, built and run on SQLite.

It is python/tests/serverproc.py's, shared with the SDK's own tests.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

from serverproc import ServerProcess, build_server  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[Dict[str, Any]]:
    """{"url", "tokens", "proc", "tmp"} of a fresh server with the §7 price of rtx-4090."""
    tmp = tempfile.mkdtemp(prefix="nodelane-interop-")
    s = None
    try:
        s = ServerProcess(build_server(tmp))
        yield {"url": s.url, "tokens": s.tokens, "proc": s.proc, "tmp": s.dir}
    finally:
        if s is not None:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
