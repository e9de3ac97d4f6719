"""python/examples/lora_worker.py, run as a process against the real server: the job of train.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List

import pytest

import nodelane
from helpers import unique, wait_for
from serverproc import PYTHON_DIR, ROOT

EXAMPLE = os.path.join(PYTHON_DIR, "examples", "lora_worker.py")
TRAIN_PY = os.path.join(ROOT, "cmd", "commands", "train.py")
GPU = {"gpu_sku": "rtx-4090", "gpu_count": 1, "min_vram_mb": 16000}


class ExampleWorker:
    """lora_worker.py as a process, with its own identity, node id and work directory."""

    def __init__(self, server: Any, tmp_path: Any):
        tok = tmp_path / "provisioning-token"
        tok.write_text(server.provisioning_token + "\n")
        tok.chmod(0o600)
        self.token = server.provisioning_token
        self.workdir = tmp_path / "work"
        self.identity = tmp_path / "identity.json"
        self.log_path = tmp_path / "worker.log"
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        env.pop("NODELANE_PROVISIONING_TOKEN", None)
        self.proc = subprocess.Popen(
            [sys.executable, EXAMPLE, "--server", server.url, "--provisioning-token-file", str(tok),
             "--identity", str(self.identity), "--node-id", unique("lora-py"),
             "--gpu", "rtx-4090:24576", "--tag", "lab-a", "--workdir", str(self.workdir)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=str(tmp_path), env=env)

    def wait_registered(self, operator: Any) -> str:
        """Wait for the worker to have registered (its identity file holds a worker id); return the id."""
        def worker_id():
            assert self.proc.poll() is None, "lora_worker.py exited:\n" + self.output()
            try:
                return json.loads(self.identity.read_text()).get("worker_id")
            except (OSError, ValueError):
                return None
        wid = wait_for(worker_id, 30, "lora_worker.py to register")
        w = nodelane.client.expect(operator.get("/operator/workers/" + wid), "/operator/workers/{id}", 200)["worker"]
        assert w["capabilities"]["job_types"] == ["lora_train"] and sorted(w["tags"]) == ["example", "lab-a", "python"], w
        assert w["capabilities"]["gpus"] == [{"sku": "rtx-4090", "vram_mb": 24576}], w
        return wid

    def output(self) -> str:
        """What the process printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM the process and return its exit status (it must exit within 30 s)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("lora_worker.py did not exit after SIGTERM; output:\n" + self.output())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def example_worker(server, tmp_path) -> Iterator[ExampleWorker]:
    w = ExampleWorker(server, tmp_path)
    try:
        yield w
    finally:
        w.close()
    out = w.output()
    assert w.token not in out and "nlc_" not in out, "a token was printed"


def wait_ended(operator, job_id: str, worker: ExampleWorker) -> Dict[str, Any]:
    def ended():
        assert worker.proc.poll() is None, "lora_worker.py exited:\n" + worker.output()
        jv = operator.job(job_id)
        return jv if jv["job"]["state"] in ("succeeded", "failed", "canceled") else None
    return wait_for(ended, 60, "job %s to end" % job_id)


def train_py(tmp_path: Any, payload: Dict[str, Any]) -> Dict[str, Any]:
    """Run cmd/commands/train.py as the command worker does; return what it reported."""
    out = tmp_path / "train-py-output"
    out.mkdir()
    (tmp_path / "payload.json").write_text(json.dumps(payload))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NODELANE_JOB_ID": "job-train-py",
           "NODELANE_JOB_TYPE": "lora_train", "NODELANE_ATTEMPT": "1", "CUDA_VISIBLE_DEVICES": "0",
           "NODELANE_PAYLOAD": str(tmp_path / "payload.json"), "NODELANE_OUTPUT_DIR": str(out)}
    p = subprocess.run([sys.executable, TRAIN_PY], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines: Dict[str, List[Dict[str, Any]]] = {"progress": [], "artifact": []}
    for line in p.stdout.splitlines():
        if line.startswith("nodelane:"):
            kind, _, body = line[len("nodelane:"):].partition(" ")
            lines[kind].append(json.loads(body))
    assert len(lines["artifact"]) == 1
    a = lines["artifact"][0]
    return {"progress": lines["progress"], "artifact": a, "adapter": (out / a["path"]).read_bytes(),
            "metrics": json.loads((out / "result.json").read_text())}


def test_lora_worker_runs_the_job_of_train_py(server, operator, example_worker, tmp_path):
    payload = {"epochs": 2, "step_seconds": 0.05}
    example_worker.wait_registered(operator)
    d = operator.dispatch("lora_train", payload, requirements=dict(GPU, tags=["lab-a"]), max_attempts=2)
    assert d["leasable"], d
    jid = d["job"]["id"]
    jv = wait_ended(operator, jid, example_worker)
    assert jv["job"]["state"] == "succeeded", (jv["job"], example_worker.output())

    # two progress events, one per epoch
    progress = [e for e in jv["events"] if e["kind"] != "log" and e["event_type"] == "progress"]
    assert [e["message"] for e in progress] == ["epoch 1/2", "epoch 2/2"]
    assert [e["payload"] for e in progress] == [{"fraction": 0.5, "metrics": {"epoch": 1, "loss": 1.0}},
                                                {"fraction": 1.0, "metrics": {"epoch": 2, "loss": 0.5}}]
    logs = [e["message"] for e in jv["events"] if e["kind"] == "log"]
    assert "epoch 2/2 loss 0.5000" in logs, logs

    # the adapter: a file in the job's own output directory, its sha256 and size read from it
    assert len(jv["artifacts"]) == 1, jv["artifacts"]
    a = jv["artifacts"][0]
    assert (a["artifact_type"], a["name"], a["status"]) == ("adapter", "adapter_model.safetensors", "trained")
    assert a["uri"].startswith("file://") and a["metadata"] == {"rank": 8, "epochs": 2}
    path = a["uri"][len("file://"):]
    out = os.path.dirname(os.path.dirname(path))  # <workdir>/<job id>-a1-<random>/adapter/<name>
    assert os.path.dirname(out) == str(example_worker.workdir) and os.path.basename(out).startswith(jid + "-a1-")
    content = open(path, "rb").read()
    assert content == b"simulated LoRA adapter, rank 8, loss 0.500000\n"
    assert a["checksum_sha256"] == hashlib.sha256(content).hexdigest() and a["size_bytes"] == len(content)
    # and its bytes, uploaded to the control plane's store (by default a directory beside its database)
    assert a["stored"] is True, a
    back = tmp_path / "adapter-from-the-control-plane"
    assert operator.download(a["artifact_id"], str(back)).status == 200
    assert back.read_bytes() == content

    result = jv["result"]
    assert result["metrics"] == {"loss": 0.5, "epochs": 2}
    assert result["output_uri"] == "file://" + out

    # what train.py reports for the same payload under the command worker
    ref = train_py(tmp_path, payload)
    assert [{"fraction": p["fraction"], "metrics": p["metrics"]} for p in ref["progress"]] == \
        [e["payload"] for e in progress]
    assert [p["message"] for p in ref["progress"]] == [e["message"] for e in progress]
    assert (ref["artifact"]["kind"], ref["artifact"]["name"], ref["artifact"]["metadata"]) == \
        (a["artifact_type"], a["name"], a["metadata"])
    assert ref["adapter"] == content and ref["metrics"] == result["metrics"]

    # SIGTERM: the idle worker drains and exits 0
    t0 = time.monotonic()
    assert example_worker.stop() == 0, example_worker.output()
    assert time.monotonic() - t0 < 15


def test_lora_worker_fails_a_bad_payload_for_good(server, operator, example_worker):
    # train.py exits 2 (not in retry_on_exit): the job fails without a retry
    for payload, message in (({"epochs": 0}, "epochs must be 1 to 1000"), ({"epochs": "many"}, "bad payload")):
        jid = operator.dispatch("lora_train", payload, requirements=GPU, max_attempts=3)["job"]["id"]
        job = wait_ended(operator, jid, example_worker)["job"]
        assert job["state"] == "failed" and job["attempt"] == 1, job
        assert job["last_error"]["code"] == "bad_payload" and message in job["last_error"]["message"], job
    assert example_worker.stop() == 0, example_worker.output()


def test_lora_worker_stops_a_cancelled_job(server, operator, example_worker):
    example_worker.wait_registered(operator)
    jid = operator.dispatch("lora_train", {"epochs": 1000, "step_seconds": 0.2}, requirements=GPU)["job"]["id"]
    wait_for(lambda: any(e["event_type"] == "progress" for e in operator.job(jid)["events"] if e["kind"] != "log"),
             30, "the job's first progress event")
    t0 = time.monotonic()
    operator.cancel(jid)
    jv = wait_ended(operator, jid, example_worker)
    assert jv["job"]["state"] == "canceled", jv["job"]
    assert time.monotonic() - t0 < 10
    assert jv["artifacts"] == [] and jv["result"] is None, jv
    assert example_worker.stop() == 0, example_worker.output()
