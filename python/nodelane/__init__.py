"""nodelane: a Python worker SDK for the nodelane control plane (docs/PROTOCOL.md, protocol v1).

Depends only on the standard library and `cryptography`.

- Worker, JobContext, Result, JobEnd: run decorated handlers for leased jobs
  (`@worker.job("lora_train")`, plain or `async def`), with cancellation,
  lease-loss propagation and drain on SIGTERM; their print and logging output
  and tracebacks go to the job's logs.
- JobContext.run (RunResult): a training command in a process group of its
  own, on the job's GPUs (found with nvidia-smi: gpus), killed whole on
  cancel, lost lease, drain, timeout or the worker's death (process).
- testing.run_local: a handler run without a control plane, for unit tests.
- Client: the signed worker routes, with retries, idempotency keys and clock
  offset correction; Operator: the operator routes a test or verifier needs.
- artifacts: artifact bytes: upload_file (JobContext.upload) sends a file to the
  control plane's store in parts, resuming a dropped connection; download_file
  fetches a checkpoint to resume from (JobContext.resume_from), checking its SHA-256.
- Identity: the node's Ed25519 key and worker token, kept in a 0600 file.
- signing: the RFC 9421 profile of PROTOCOL.md §4 (sign_request, signature_base).
- verify: offline verification of receipts, inclusion and consistency proofs and
  signed checkpoints (verify_completion, verify_receipt_response, Witness).
- Errors: NodelaneError, APIError, LeaseLost, ArtifactStorageOff, ArtifactMismatch,
  TransportError, VerificationError, ConfigError, Cancelled, JobError.
"""

from .client import Abort, Client, Connection, Operator, Response
from .times import parse_api_time
from .errors import (APIError, ArtifactMismatch, ArtifactStorageOff, Cancelled, ConfigError, JobError, LeaseLost,
                     NodelaneError, TransportError, VerificationError)
from .artifacts import download_file, upload_file
from .identity import Identity
from .signing import Signer, content_digest, sign_request, signature_base
from .verify import (DEFAULT_ORIGIN, Checkpoint, VerifiedCompletion, VerifierKey, Witness, parse_verifier_key,
                     verify_checkpoint, verify_completion, verify_consistency, verify_inclusion, verify_receipt,
                     verify_receipt_response)
from .process import RunResult
from .worker import JobContext, JobEnd, Result, Worker, check_job_type

__version__ = "0.1.0"

__all__ = [
    "Abort", "APIError", "ArtifactMismatch", "ArtifactStorageOff", "Cancelled", "Checkpoint", "Client",
    "ConfigError", "Connection", "DEFAULT_ORIGIN", "Identity", "JobContext", "JobEnd", "JobError", "LeaseLost",
    "NodelaneError", "Operator", "Response", "Result", "RunResult", "Signer", "TransportError", "VerificationError",
    "VerifiedCompletion", "VerifierKey", "Witness", "Worker", "check_job_type", "content_digest",
    "download_file", "parse_api_time", "parse_verifier_key", "sign_request", "signature_base", "upload_file",
    "verify_checkpoint", "verify_completion", "verify_consistency", "verify_inclusion", "verify_receipt",
    "verify_receipt_response",
]
