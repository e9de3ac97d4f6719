#!/usr/bin/env python3
"""The job of cmd/commands/train.py, as a worker of the Python SDK.

    PYTHONPATH=python python3 python/examples/lora_worker.py \\
        --server http://127.0.0.1:8080 --provisioning-token-file provisioning-token

It registers its GPUs (--gpu SKU:VRAM_MB, repeatable; one rtx-4090:24576 by
default) and the job type lora_train, and runs each lora_train job as train.py does under
`cmd/worker -config cmd/commands/worker.toml`: the same payload
({"epochs": 2, "step_seconds": 0.2, "rank": 8}), a progress event per epoch,
an adapter file in a fresh output directory per job, uploaded as an artifact
(its bytes stored by the control plane, or, when it stores none, its URI,
SHA-256 and size reported), and the metrics {"loss", "epochs"}.
It trains nothing. A cancel stops it within a step; SIGTERM drains it. Standard
library and the SDK only.
"""

import argparse
import logging
import os
import socket
import ssl
import sys
import tempfile

import nodelane
from nodelane import JobContext, JobError, Result


def lora_train(ctx: JobContext, workdir: str) -> Result:
    try:
        epochs = int(ctx.payload.get("epochs", 2))
        step_seconds = float(ctx.payload.get("step_seconds", 0.2))
        rank = int(ctx.payload.get("rank", 8))
    except (TypeError, ValueError) as e:
        raise JobError("bad payload: %s" % e, code="bad_payload", retryable=False)
    if epochs < 1 or epochs > 1000:
        # train.py exits 2 here: a failure that no retry mends.
        raise JobError("epochs must be 1 to 1000", code="bad_payload", retryable=False)
    # A fresh directory per attempt, as the command worker's run directories.
    out = tempfile.mkdtemp(prefix="%s-a%d-" % (ctx.job_id, ctx.attempt), dir=workdir)
    ctx.log("job %s attempt %d" % (ctx.job_id, ctx.attempt))

    loss = 2.0
    for epoch in range(1, epochs + 1):
        ctx.sleep(step_seconds)  # raises Cancelled once the job must stop (cancel, lost lease, drain)
        loss *= 0.5
        ctx.log("epoch %d/%d loss %.4f" % (epoch, epochs, loss))
        ctx.progress(epoch / epochs, "epoch %d/%d" % (epoch, epochs), {"epoch": epoch, "loss": loss})

    ctx.check()  # the last progress answer may have said the job was cancelled
    path = os.path.join(out, "adapter", "adapter_model.safetensors")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"simulated LoRA adapter, rank %d, loss %.6f\n" % (rank, loss))
    # The bytes go to the control plane's artifact store (checked against their SHA-256 there); a
    # control plane that stores none gets the file's URI, SHA-256 and size only.
    ctx.upload(path, name="adapter_model.safetensors", kind="adapter", metadata={"rank": rank, "epochs": epochs},
               uri="file://" + path)
    return Result(output_uri="file://" + out, metrics={"loss": loss, "epochs": epochs})


def gpu(spec: str) -> dict:
    sku, _, vram = spec.partition(":")
    if not sku or not vram.isdigit():
        raise argparse.ArgumentTypeError("a GPU is SKU:VRAM_MB, such as rtx-4090:24576")
    return {"sku": sku, "vram_mb": int(vram)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="http://127.0.0.1:8080", help="control plane base URL")
    ap.add_argument("--provisioning-token-file",
                    help="file holding the node:register token, needed until the worker has registered "
                         "(default: $NODELANE_PROVISIONING_TOKEN); never the token itself on the command line")
    ap.add_argument("--identity", default="nodelane-py-worker.json",
                    help="the node's key and worker token, created 0600 on first start")
    ap.add_argument("--node-id", default=socket.gethostname() + "-py", help="node id to register")
    ap.add_argument("--gpu", type=gpu, action="append", help="GPU as SKU:VRAM_MB (repeatable; default rtx-4090:24576)")
    ap.add_argument("--tag", action="append", default=[],
                    help="registration tag, beside example and python (repeatable): the pools it joins")
    ap.add_argument("--insecure-http", action="store_true",
                    help="allow an http:// --server that is not this machine (its tokens cross the network in clear)")
    ap.add_argument("--ca-file", help="PEM file of the certificate authorities to trust for an https --server, "
                                      "instead of the system's (a private PKI)")
    ap.add_argument("--workdir", default="nodelane-py-work", help="directory for the jobs' output directories")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    token = os.environ.pop("NODELANE_PROVISIONING_TOKEN", "")
    if args.provisioning_token_file:
        with open(args.provisioning_token_file, encoding="utf-8") as f:
            token = f.read()
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, mode=0o700, exist_ok=True)

    ctx = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
    tags = ["example", "python"] + [t for t in args.tag if t not in ("example", "python")]
    worker = nodelane.Worker(
        args.server,
        identity=args.identity,
        provisioning_token=token.strip() or None,
        ssl_context=ctx,
        insecure_http=args.insecure_http,
        registration={"node_id": args.node_id, "tags": tags,
                      "capabilities": {"gpus": args.gpu or [gpu("rtx-4090:24576")]}},
    )

    @worker.job("lora_train")
    def train(ctx: JobContext) -> Result:
        return lora_train(ctx, workdir)

    try:
        worker.run()  # until SIGTERM or SIGINT, then drain
    except nodelane.NodelaneError as e:  # cannot register, or the server refuses this node
        sys.exit("lora_worker: %s" % e)


if __name__ == "__main__":
    main()
