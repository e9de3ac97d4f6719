"""A fault-injecting HTTP proxy in front of the real server, on loopback.

It forwards each request unchanged (Host included, so signatures still
verify) and, for the first `count` requests whose path contains `match`,
injects a fault: "drop" forwards the request and then closes the client's
connection without the answer (the server acted, the answer was lost);
"503" answers 503 unavailable with Retry-After without forwarding; "cut"
forwards the head and half the body, then closes both connections (a
connection lost mid-upload: the server gets a short body, the client no
answer). The first `skip` matching requests pass untouched.
"""

from __future__ import annotations

import socket
import threading
from typing import List


class FaultProxy:
    """Forwards to 127.0.0.1:upstream_port; see the module doc for the faults."""

    def __init__(self, upstream_port: int, match: str, fault: str = "drop", count: int = 1,
                 retry_after: int = 1, skip: int = 0):
        assert fault in ("drop", "503", "cut")
        self.upstream_port = upstream_port
        self.match, self.fault, self.left, self.retry_after = match, fault, count, retry_after
        self.skip = skip  # matching requests passed through before the faults begin
        self.paths: List[str] = []
        self.faults = 0
        self._mu = threading.Lock()
        self._ls = socket.socket()
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(16)
        self.port = self._ls.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections."""
        self._closed = True
        self._ls.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                c, _ = self._ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            data = bytearray()
            while b"\r\n\r\n" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = bytes(data).partition(b"\r\n\r\n")
            body = bytearray(rest)
            lines = head.split(b"\r\n")
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            while len(body) < length:
                chunk = c.recv(65536)
                if not chunk:
                    return
                body += chunk
            path = lines[0].split(b" ")[1].decode()
            with self._mu:
                self.paths.append(path)
                inject = self.match in path and self.left > 0
                if inject and self.skip > 0:
                    self.skip -= 1
                    inject = False
                if inject:
                    self.left -= 1
                    self.faults += 1
            if inject and self.fault == "503":
                msg = b'{"error":{"code":"unavailable","message":"injected by the test proxy"}}'
                c.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                          b"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                          % (self.retry_after, len(msg), msg))
                return
            req = lines[0] + b"\r\nConnection: close\r\n" + b"\r\n".join(
                ln for ln in lines[1:] if not ln.lower().startswith(b"connection:")) + b"\r\n\r\n"
            up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=90)
            if inject and self.fault == "cut":
                try:
                    up.sendall(req)
                    up.sendall(memoryview(body)[:len(body) // 2])
                finally:
                    up.close()
                return
            try:
                up.sendall(req)
                up.sendall(body)
                answer = bytearray()
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            finally:
                up.close()
            if inject:  # the server acted; its answer is lost
                c.shutdown(socket.SHUT_RDWR)
                return
            c.sendall(answer)
        except OSError:
            pass
        finally:
            c.close()
