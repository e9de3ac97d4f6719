#!/usr/bin/env python3
"""A LoRA training script run by cmd/worker -config (docs/COMMANDS.md).

It trains nothing: it reads the job's payload, reports progress once per
epoch, writes an adapter file into NODELANE_OUTPUT_DIR, reports it as an
artifact, and writes result.json. Standard library only.

The contract it follows:
  - the payload is the JSON file NODELANE_PAYLOAD names;
  - `nodelane:progress {json}` and `nodelane:artifact {json}` lines on
    stdout are status events and artifact records; every other line, on
    stdout or stderr, is a log line;
  - NODELANE_OUTPUT_DIR/result.json (a JSON object) is the completion's
    metrics;
  - exit 0 completes the job; exit 75 fails it as retryable when the job
    table says retry_on_exit = [75]; any other code fails it for good;
  - SIGTERM means stop now: the worker sends SIGKILL after kill_grace.
"""

import json
import os
import signal
import sys
import time

EX_TEMPFAIL = 75  # "try again": listed in retry_on_exit


def report(line_type, **fields):
    # One line, flushed at once: the worker reads the pipe as it goes.
    print("nodelane:%s %s" % (line_type, json.dumps(fields)), flush=True)


def on_sigterm(signum, frame):
    # A cancel, a lost lease or a drain: stop quickly. A real trainer
    # might save a checkpoint here, within kill_grace.
    print("SIGTERM: stopping", file=sys.stderr, flush=True)
    sys.exit(143)


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    with open(os.environ["NODELANE_PAYLOAD"]) as f:
        payload = json.load(f) or {}
    epochs = int(payload.get("epochs", 2))
    step_seconds = float(payload.get("step_seconds", 0.2))
    rank = int(payload.get("rank", 8))
    if epochs < 1 or epochs > 1000:
        print("epochs must be 1 to 1000", file=sys.stderr)
        return 2  # not in retry_on_exit: the job fails for good
    out = os.environ["NODELANE_OUTPUT_DIR"]
    print("job %s attempt %s on GPUs [%s]" % (
        os.environ["NODELANE_JOB_ID"], os.environ["NODELANE_ATTEMPT"],
        os.environ.get("CUDA_VISIBLE_DEVICES", "")), flush=True)

    loss = 2.0
    for epoch in range(1, epochs + 1):
        time.sleep(step_seconds)
        loss *= 0.5
        print("epoch %d/%d loss %.4f" % (epoch, epochs, loss), flush=True)
        report("progress", fraction=epoch / epochs,
               message="epoch %d/%d" % (epoch, epochs),
               metrics={"epoch": epoch, "loss": loss})

    os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
    path = os.path.join("adapter", "adapter_model.safetensors")
    with open(os.path.join(out, path), "wb") as f:
        f.write(b"simulated LoRA adapter, rank %d, loss %.6f\n" % (rank, loss))
    # The path is relative to NODELANE_OUTPUT_DIR; the worker computes the
    # artifact's sha256 and size itself.
    report("artifact", name="adapter_model.safetensors", path=path,
           kind="adapter", metadata={"rank": rank, "epochs": epochs})

    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"loss": loss, "epochs": epochs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
