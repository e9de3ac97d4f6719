"""The exceptions of the nodelane SDK.

Every exception the SDK raises on purpose is a NodelaneError. An answer of
the control plane that is an error (docs/PROTOCOL.md §12) is an APIError
with its HTTP status and PROTOCOL.md code; the lease_lost refusal is the
subclass LeaseLost, so that `except LeaseLost` reads as it means.
"""

from __future__ import annotations

from typing import Optional


class NodelaneError(Exception):
    """The base class of the SDK's exceptions."""


class ConfigError(NodelaneError, ValueError):
    """A missing or invalid setting or argument given to the SDK; nothing was sent."""


class VerificationError(NodelaneError):
    """Offline verification failed (PROTOCOL.md §11): a receipt, proof or checkpoint is not genuine."""


class TransportError(NodelaneError):
    """A request got no answer: the connection failed, timed out, or the answer could not be read.

    The control plane may or may not have acted on it.
    """

    def __init__(self, route: str, cause: BaseException):
        super().__init__("%s: %s" % (route, cause))
        self.route = route
        self.cause = cause


class APIError(NodelaneError):
    """An error answer of the control plane (PROTOCOL.md §12), or an answer that was not the one expected.

    Attributes:
        status: the HTTP status.
        code: the PROTOCOL.md code ("" when the body was not a PROTOCOL.md error, say a proxy's).
        message: the server's explanation.
        route: the path called, such as "/workers/heartbeat".
        request_id: the X-Request-Id the server answered with, or "".
        server_time: the error's server_time (RFC 3339 text), or "".
        retry_after: the server's Retry-After in seconds, or 0.
        unanswered: an earlier attempt of the same call got no answer, so the server may have
            acted on it (a 409 may then mean that attempt succeeded).
    """

    def __init__(self, status: int, code: str, message: str, route: str = "",
                 request_id: str = "", server_time: str = "", retry_after: float = 0.0,
                 body: bytes = b""):
        text = "%s: %d %s" % (route or "?", status, code or "error")
        if message:
            text += ": " + message
        super().__init__(text)
        self.status = status
        self.code = code
        self.message = message
        self.route = route
        self.request_id = request_id
        self.server_time = server_time
        self.retry_after = retry_after
        self.body = body
        self.unanswered = False

    @property
    def temporary(self) -> bool:
        """Whether the same request may succeed later: a 5xx or 429 answer."""
        return self.status >= 500 or self.status == 429


class LeaseLost(APIError):
    """409 lease_lost: the lease token is not the job's live lease; stop working on the job."""


class ArtifactStorageOff(APIError):
    """404 artifact_storage_off: the control plane stores no artifact bytes (it was started without
    an artifact store), or predates the upload route. Report the artifact as metadata only
    (JobContext.artifact), or pass uri to JobContext.upload."""


class ArtifactMismatch(APIError):
    """422 artifact_mismatch: the bytes the control plane stored are not the declared size or SHA-256
    (the file changed while it was uploaded); nothing was recorded and the stored parts were deleted."""


class Cancelled(NodelaneError):
    """Raised by JobContext.check() once the job must stop.

    `reason` says why: "canceled" (an operator canceled the job), "lease_lost",
    "lease_expiring" (the lease could not be extended in time), "offline" (no
    heartbeat got through before the control plane's deadline) or "drained"
    (the worker is shutting down).
    """

    def __init__(self, reason: str):
        super().__init__("job stopped: " + reason)
        self.reason = reason


class JobError(NodelaneError):
    """Raise from a handler to fail the job with an error code.

    retryable=True (the default) asks the control plane to queue the job again
    while it has attempts left; retryable=False ends it failed. Any other
    exception a handler raises fails the job for good, unless its class is in
    the handler's retry_on. `code` becomes the fail's error_code (at most
    255 bytes); `payload`, when given, is a JSON object stored with the failure.
    """

    def __init__(self, message: str, code: str = "handler_error", retryable: bool = True,
                 payload: Optional[dict] = None):
        super().__init__(message)
        if not isinstance(code, str) or not code or len(code.encode("utf-8")) > 255:
            raise ConfigError("JobError code must be 1 to 255 bytes")
        self.code = code
        self.retryable = retryable
        self.payload = payload
