"""A scripted stand-in for the worker routes, on loopback, for tests of the SDK's own logic.

It does not check signatures and keeps no jobs: each route answers what the
test's handler for it returns, and every request is recorded (path, JSON
body) so that a test can look at what the SDK sent. The end-to-end tests run
the real server (serverproc.py); these pin down what the worker sends and
does with answers, including answers the real server gives only rarely.
"""

from __future__ import annotations

import datetime
import http.server
import json
import threading
from typing import Any, Callable, Dict, List, Tuple

#: A route handler: (the request's JSON body) -> (HTTP status, answer object).
Route = Callable[[Dict[str, Any]], Tuple[int, Any]]


def now_rfc3339(offset: float = 0.0) -> str:
    """The current UTC time (plus offset seconds) as the server writes it, with microseconds."""
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def error(status: int, code: str, message: str = "") -> Tuple[int, Any]:
    """An error answer of PROTOCOL.md §12."""
    return status, {"error": {"code": code, "message": message or code, "server_time": now_rfc3339()}}


def heartbeat_answer(**extra: Any) -> Dict[str, Any]:
    """A heartbeat answer with a 90 s deadline, nothing to do, and extra fields."""
    ans: Dict[str, Any] = {"ok": True, "worker_id": "wrk_fake", "server_time": now_rfc3339(),
                           "next_heartbeat_seconds": 30, "heartbeat_deadline": now_rfc3339(90),
                           "policy_version": 1, "leases": [], "lost_jobs": [], "cancel_jobs": [],
                           "ended_jobs": []}
    ans.update(extra)
    return ans


def grant(job_id: str, job_type: str, state: str = "running") -> Dict[str, Any]:
    """One grant of a lease answer, accepted (state running) unless state says otherwise."""
    return {"lease_id": "lse_" + job_id, "lease_token": "nll_" + job_id,
            "job": {"id": job_id, "job_type": job_type, "payload": {}, "state": state, "attempt": 1,
                    "cancel_requested": False},
            "expires_at": now_rfc3339(600), "accept_by": now_rfc3339(60)}


class FakeServer:
    """Answers the worker routes with the handlers in `routes` (path -> Route); 404 not_found for others."""

    def __init__(self) -> None:
        self.routes: Dict[str, Route] = {}
        self.requests: List[Tuple[str, Dict[str, Any]]] = []
        self.cond = threading.Condition()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                path = self.path
                with srv.cond:
                    srv.requests.append((path, body))
                    srv.cond.notify_all()
                route = srv.routes.get(path)
                if route is None and path.startswith("/workers/jobs/") and path != "/workers/jobs/lease":
                    route = srv.routes.get("/workers/jobs/*/" + path.rsplit("/", 1)[1])
                status, ans = route(body) if route is not None else error(404, "not_found", "no route " + path)
                raw = json.dumps(ans).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:
                    pass  # the client cut the request (a long-poll aborted at the worker's stop)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def sent(self, path: str) -> List[Dict[str, Any]]:
        """The bodies sent to path so far, in order."""
        with self.cond:
            return [b for p, b in self.requests if p == path]

    def wait_for(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until cond() (called under the lock at each request) is true; fail after timeout seconds."""
        with self.cond:
            v = self.cond.wait_for(cond, timeout)
        if not v:
            raise AssertionError("timed out waiting for " + what)
        return v

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
