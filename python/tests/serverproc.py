"""Build and run the real example server (./cmd/server) for the tests, on SQLite.

Used by python/tests/conftest.py and interop/python/conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON_DIR = os.path.join(ROOT, "python")
#: 1.802000 USD per GPU-hour, the price of PROTOCOL.md §7, so that costs are not zero.
RATE_MICRO_USD = 1_802_000


def build_server(tmp: str) -> str:
    """go build ./cmd/server into tmp; return the binary's path."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        raise RuntimeError("the go toolchain is needed to build ./cmd/server")
    binary = os.path.join(tmp, "server")
    subprocess.run([go, "build", "-o", binary, "./cmd/server"], cwd=ROOT, check=True, timeout=600)
    return binary


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ServerProcess:
    """One running example server with a fresh SQLite database in its own directory."""

    def __init__(self, binary: str, extra_args: Optional[List[str]] = None):
        self.dir = tempfile.mkdtemp(prefix="nodelane-py-")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        tokens_file = os.path.join(self.dir, "tokens.json")
        self.log_path = os.path.join(self.dir, "server.log")
        self._log = open(self.log_path, "wb")
        args = [binary, "-addr", "127.0.0.1:%d" % self.port,
                "-db", "sqlite:" + os.path.join(self.dir, "db.sqlite"),
                "-secrets-file", os.path.join(self.dir, "secrets.json"), "-tokens-file", tokens_file,
                "-price", "rtx-4090=%d" % RATE_MICRO_USD] + list(extra_args or [])
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir)
        self.tokens: Dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.server_log())
            try:
                with open(tokens_file, encoding="utf-8") as f:
                    t = json.load(f)
                if all(t.get(k) for k in ("operator_token", "provisioning_token", "receipt_public_key")):
                    self.tokens = t
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("tokens file not written in time")

    @property
    def operator_token(self) -> str:
        """The bootstrap operator credential (every scope)."""
        return self.tokens["operator_token"]

    @property
    def provisioning_token(self) -> str:
        """The bootstrap node:register credential."""
        return self.tokens["provisioning_token"]

    @property
    def receipt_public_key(self) -> str:
        """The receipt log's verifier key."""
        return self.tokens["receipt_public_key"]

    def server_log(self) -> str:
        """What the server printed so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the server, wait for it, and remove its directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
