"""A stand-in for the artifact routes (PROTOCOL.md §5.19–§5.21) and a bucket, on loopback, with faults.

It implements what the SDK's upload and download need, with a part size the
test picks (the real server's is at least 1 MiB) and faults the real one
cannot be made to show on demand: a part's connection cut mid-body, a bucket
that answers slowly, a download cut short. It checks what a worker must send:
the part's Content-Type, Content-Length, Content-Digest against the bytes,
the lease token header and a signature on the control-plane route; no
credential at all on the bucket's presigned URL. It does not verify signatures
(test_signatures.py and the real server do).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

LEASE = "nll_fake"


class FakeStore:
    """The upload, part, finish and content routes of one job, and a bucket (/bucket/...)."""

    def __init__(self, part_size: int = 1 << 16, direct: bool = False, storage: bool = True,
                 discard: bool = False):
        self.part_size, self.direct, self.storage = part_size, direct, storage
        # discard: keep no part's bytes, only a running SHA-256 of the parts as they come (in order,
        # no faults), so that a test can measure the client's memory in this process
        self.discard = discard
        self.running = hashlib.sha256()
        self.running_size = 0
        self.parts: Dict[int, bytes] = {}
        self.upload: Optional[Dict[str, Any]] = None
        self.finished: List[Dict[str, Any]] = []
        self.puts: List[Tuple[int, Dict[str, str], int]] = []  # (part, headers, bytes received)
        self.cut_parts: Dict[int, int] = {}  # part -> times to cut its connection mid-body
        self.expire_at_part = 0  # answer 409 upload_expired to this part of the first upload
        self.uploads = 0
        self.busy_parts: Dict[int, int] = {}  # part -> times to answer 429 too_many_uploads (Retry-After: 1)
        self.bucket_delay = 0.0
        self.bucket_error: Optional[Tuple[int, bytes]] = None  # what the bucket answers every PUT
        self.content = b""
        self.cut_content = 0  # times to cut a download mid-body
        self.ranges: List[str] = []
        self.mu = threading.Lock()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, obj: Any) -> None:
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def error(self, status: int, code: str, msg: str = "") -> None:
                self.answer(status, {"error": {"code": code, "message": msg or code}})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if body.get("lease_token") != LEASE:
                    return self.error(409, "lease_lost")
                if self.path.endswith("/uploads"):
                    return self.uploads(body)
                if self.path.endswith("/artifacts"):
                    return self.finish_upload(body)
                self.error(404, "not_found", "no route " + self.path)

            def uploads(self, body: Dict[str, Any]) -> None:
                if not srv.storage:
                    return self.error(404, "artifact_storage_off", "the server stores no artifact bytes")
                size = body["size_bytes"]
                parts, off, n = [], 0, 1
                while True:
                    sz = min(srv.part_size, size - off)
                    if srv.direct:
                        url, headers = "%s/bucket/%d?X-Sig=secret" % (srv.url, n), {"X-Test-Store": "yes"}
                    else:
                        url, headers = "/workers/jobs/job_1/uploads/upl_x/parts/%d" % n, {}
                    parts.append({"part_number": n, "offset": off, "size_bytes": sz, "method": "PUT",
                                  "url": url, "headers": headers})
                    off += sz
                    n += 1
                    if off >= size:
                        break
                with srv.mu:
                    srv.upload = dict(body)
                    srv.uploads += 1
                    srv.parts.clear()
                self.answer(201, {"upload_id": "upl_x", "part_size": srv.part_size, "direct": srv.direct,
                                  "expires_at": "2099-01-01T00:00:00Z", "parts": parts})

            def finish_upload(self, body: Dict[str, Any]) -> None:
                with srv.mu:
                    if srv.discard:
                        size, sha = srv.running_size, srv.running.hexdigest()
                    else:
                        data = b"".join(srv.parts[k] for k in sorted(srv.parts))
                        size, sha = len(data), hashlib.sha256(data).hexdigest()
                    srv.finished.append(body)
                if body.get("upload_id") != "upl_x":
                    return self.error(409, "upload_invalid")
                if size != body["size_bytes"] or sha != body["checksum_sha256"]:
                    return self.error(422, "artifact_mismatch", "the stored bytes are not those declared")
                self.answer(201, {"artifact_id": "art_1", "receipt_id": "rct_1", "stored": True})

            def do_PUT(self) -> None:
                h = {k.lower(): v for k, v in self.headers.items()}
                length = int(h.get("content-length") or -1)
                n = int(self.path.split("?")[0].rsplit("/", 1)[1])
                if self.path.startswith("/bucket/"):
                    if srv.bucket_delay:
                        time.sleep(srv.bucket_delay)
                    if srv.bucket_error is not None:
                        self.rfile.read(length)
                        with srv.mu:
                            srv.puts.append((n, h, length))
                        self.send_response(srv.bucket_error[0])
                        self.send_header("Content-Type", "application/xml")
                        self.send_header("Content-Length", str(len(srv.bucket_error[1])))
                        self.end_headers()
                        self.wfile.write(srv.bucket_error[1])
                        return
                    if any(k in h for k in ("authorization", "signature", "signature-input",
                                            "nodelane-lease-token")) or h.get("x-test-store") != "yes":
                        return self.error(403, "forbidden", "credentials sent to the bucket, or its header missing")
                else:
                    if (h.get("content-type") != "application/octet-stream" or h.get("nodelane-lease-token") != LEASE
                            or "signature" not in h or not h.get("authorization", "").startswith("Bearer ")):
                        return self.error(400, "invalid_request", "headers: %r" % sorted(h))
                with srv.mu:
                    expired = srv.uploads == 1 and n == srv.expire_at_part
                if expired:
                    self.rfile.read(length)
                    return self.error(409, "upload_expired", "the upload_id expired")
                with srv.mu:
                    busy = srv.busy_parts.get(n, 0) > 0
                    if busy:
                        srv.busy_parts[n] -= 1
                        srv.puts.append((n, h, 0))
                if busy:
                    self.rfile.read(length)
                    raw = b'{"error":{"code":"too_many_uploads","message":"busy"}}'
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                with srv.mu:
                    cut = srv.cut_parts.get(n, 0) > 0
                    if cut:
                        srv.cut_parts[n] -= 1
                if cut:
                    got = self.rfile.read(max(length // 2, 1))
                    with srv.mu:
                        srv.puts.append((n, h, len(got)))
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if srv.discard:
                    ph, left = hashlib.sha256(), length
                    while left:
                        b = self.rfile.read(min(left, 1 << 16))
                        if not b:
                            break
                        ph.update(b)
                        with srv.mu:
                            srv.running.update(b)
                            srv.running_size += len(b)
                        left -= len(b)
                    with srv.mu:
                        srv.puts.append((n, h, length - left))
                        srv.parts[n] = b""
                    self.answer(200, {"part_number": n, "size_bytes": length, "expires_at": "2099-01-01T00:00:00Z"})
                    return
                data = self.rfile.read(length)
                with srv.mu:
                    srv.puts.append((n, h, len(data)))
                if "content-digest" in h:
                    want = "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"
                    if h["content-digest"] != want:
                        return self.error(400, "invalid_request", "Content-Digest does not match the body")
                with srv.mu:
                    srv.parts[n] = data
                if self.path.startswith("/bucket/"):
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.answer(200, {"part_number": n, "size_bytes": len(data), "expires_at": "2099-01-01T00:00:00Z"})

            def do_GET(self) -> None:
                h = {k.lower(): v for k, v in self.headers.items()}
                if self.path.startswith("/bucket/"):
                    if any(k in h for k in ("authorization", "signature", "nodelane-lease-token")):
                        return self.error(403, "forbidden", "credentials sent to the bucket")
                elif h.get("nodelane-lease-token") != LEASE or "signature" not in h:
                    return self.error(409, "lease_lost")
                data, start = srv.content, 0
                rng = h.get("range")
                with srv.mu:
                    srv.ranges.append(rng or "")
                    cut = srv.cut_content > 0
                    if cut:
                        srv.cut_content -= 1
                if rng:
                    start = int(rng.split("=")[1].rstrip("-"))
                    self.send_response(206)
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
                else:
                    self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if cut:
                    self.wfile.write(data[start:start + (len(data) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stored(self) -> bytes:
        """The bytes of the parts stored, in order."""
        with self.mu:
            return b"".join(self.parts[k] for k in sorted(self.parts))

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
