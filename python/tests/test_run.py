"""ctx.run against the real server: GPUs from a (simulated) nvidia-smi, one per job; a cancel that kills
the command's whole group; a worker killed with SIGKILL that leaves no process behind; a restart that
kills what a worker and its shim left; capabilities sent again on every start."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, List

import nodelane
from nodelane import JobContext

from helpers import ScriptWorker, gone, new_worker, parent_of, running, sequenced_receipt, unique, wait_for

#: Two RTX 4090s, as nvidia-smi lists them.
TWO_GPUS = ("0, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, NVIDIA GeForce RTX 4090, 24564\n"
            "1, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, NVIDIA GeForce RTX 4090, 24564\n")


def fake_nvidia_smi(tmp_path: Any, answer: str) -> str:
    """An nvidia-smi that answers the discovery query with answer (and refuses any other call)."""
    (tmp_path / "smi-answer").write_text(answer)
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n"
                    '[ "$1" = "--query-gpu=index,uuid,name,memory.total" ] && '
                    '[ "$2" = "--format=csv,noheader,nounits" ] || { echo "bad call: $*" >&2; exit 2; }\n'
                    'cat "%s"\n' % (tmp_path / "smi-answer"))
    path.chmod(0o755)
    return str(path)


#: A command that ignores SIGTERM, starts a grandchild that ignores it too, writes "PID GRANDCHILD_PID"
#: to argv[1] and waits forever.
STUBBORN = r"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = subprocess.Popen([sys.executable, "-c",
                      "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"])
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write("%d %d" % (os.getpid(), g.pid))
os.rename(tmp, sys.argv[1])
print("stubborn: started", flush=True)
while True:
    signal.pause()
"""


def dumpable() -> int:
    """prctl(PR_GET_DUMPABLE) of this process."""
    import ctypes
    return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)


def stubborn(tmp_path: Any) -> "tuple[List[str], Any]":
    """The argv of STUBBORN written into tmp_path, and the file it writes its pids to."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pids = tmp_path / "pids"
    return [sys.executable, str(script), str(pids)], pids


def read_pids(path: Any) -> List[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_two_jobs_on_a_two_gpu_box_get_different_gpus(server, operator, tmp_path):
    jt = unique("gpu_run")
    box = tmp_path / "box"
    box.mkdir()
    script = tmp_path / "seen.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "d = pathlib.Path(sys.argv[1])\n"
        "(d / ('seen-' + os.environ['NODELANE_JOB_ID'])).write_text(os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "print('cuda', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'], flush=True)\n"
        "end = time.monotonic() + 30\n"
        "while len(list(d.glob('seen-*'))) < 2 and time.monotonic() < end:\n"  # both jobs run at once
        "    time.sleep(0.02)\n"
        "print('nodelane:progress {\"fraction\": 1.0, \"message\": \"both ran\"}', flush=True)\n")
    w = new_worker(server, max_jobs=2, nvidia_smi=fake_nvidia_smi(tmp_path, TWO_GPUS),
                   registration={"node_id": unique("py-2gpu")})

    @w.job(jt)
    def train(ctx: JobContext) -> Dict[str, Any]:
        ctx.run([sys.executable, str(script), str(box)], gpus=1)
        return {"gpus": ctx.gpus}

    with running(w) as ends:
        jids = [operator.dispatch(jt, {}, requirements={"gpu_count": 1})["job"]["id"] for _ in range(2)]
        wait_for(lambda: len(ends) == 2, 60, "both jobs to end")
    assert [e.outcome for e in ends] == ["succeeded", "succeeded"], [e.error for e in ends]
    seen = {p.name[len("seen-"):]: p.read_text() for p in box.glob("seen-*")}
    assert sorted(seen) == sorted(jids) and sorted(seen.values()) == ["0", "1"], seen
    assert w.registration["capabilities"]["gpus"] == [{"sku": "rtx-4090", "vram_mb": 24564}] * 2
    for jid in jids:
        jv = operator.job(jid)
        assert jv["result"]["metrics"] == {"gpus": [seen[jid]]}
        logs = [(e["message"], e["payload"]) for e in jv["events"] if e["kind"] == "log"]
        assert ("cuda %s PCI_BUS_ID" % seen[jid], {"stream": "stdout"}) in logs, logs
        assert [e["message"] for e in jv["events"] if e.get("event_type") == "progress"] == ["both ran"]


def test_a_cancel_kills_the_command_and_its_stubborn_grandchild(server, operator, tmp_path):
    jt = unique("run_cancel")
    grace = 1.0
    argv, pids = stubborn(tmp_path)
    w = new_worker(server, kill_grace=grace)

    @w.job(jt)
    def train(ctx: JobContext) -> None:
        ctx.run(argv)

    with running(w) as ends:
        jid = operator.dispatch(jt, {})["job"]["id"]
        wait_for(lambda: len(read_pids(pids)) == 2, 30, "the command and its grandchild to start")
        child, grandchild = read_pids(pids)
        # a command of the same user cannot read the worker's memory (its token) through ptrace or /proc
        assert dumpable() == 0
        t0 = time.monotonic()
        operator.cancel(jid)
        wait_for(lambda: gone(child) and gone(grandchild), grace + 2, "both processes to end")
        took = time.monotonic() - t0
        wait_for(lambda: ends, 15, "the job to end")
    assert took <= grace + 2, took
    assert ends[0].outcome == "canceled", ends[0]
    assert operator.job(jid)["job"]["state"] == "canceled"


def test_sigkill_of_the_worker_leaves_no_process_and_the_restart_runs_the_job_again(server, operator, tmp_path):
    jt = unique("run_crash")
    argv, pids = stubborn(tmp_path)
    smi = fake_nvidia_smi(tmp_path, TWO_GPUS)
    ident, node = str(tmp_path / "identity.json"), unique("py-runcrash")
    first = ScriptWorker(server, tmp_path, "gpu_worker.py", ident, node, jt, smi)
    try:
        first.expect("started")
        jid = operator.dispatch(jt, {"argv": argv},
                                requirements={"gpu_count": 1}, max_attempts=3)["job"]["id"]
        assert first.expect("job")["job"] == jid
        wait_for(lambda: len(read_pids(pids)) == 2, 30, "the command and its grandchild to start")
        child, grandchild = read_pids(pids)
        shim = parent_of(child)
        assert shim != first.proc.pid and parent_of(shim) == first.proc.pid  # the command runs under the shim
        t0 = time.monotonic()
        first.proc.kill()
        first.proc.wait(timeout=10)
        wait_for(lambda: all(map(gone, (shim, child, grandchild))), 1 + 2, "every process to end")
        assert time.monotonic() - t0 <= 1 + 2
    finally:
        first.stop()
    second = ScriptWorker(server, tmp_path, "gpu_worker.py", ident, node, jt, smi)
    try:
        started = second.expect("started")["answer"]
        assert started["ended_jobs"] == [jid], started
        e = second.expect("job", 15)
        assert (e["job"], e["attempt"]) == (jid, 2)
        assert second.expect("ended", 15)["outcome"] == "succeeded"
    finally:
        second.stop()
    job = operator.job(jid)["job"]
    assert job["state"] == "succeeded" and job["last_error"]["code"] == "worker_restarted", job


def test_a_restart_kills_what_a_worker_killed_with_its_shim_left(server, operator, tmp_path):
    """SIGKILL to the worker and its shim at once (an OOM kill of the cgroup, say) leaves the command
    running; the next start kills it, from the running file, before it registers."""
    jt = unique("run_reap")
    argv, pids = stubborn(tmp_path)
    smi = fake_nvidia_smi(tmp_path, TWO_GPUS)
    ident, node = str(tmp_path / "identity.json"), unique("py-reap")
    first = ScriptWorker(server, tmp_path, "gpu_worker.py", ident, node, jt, smi)
    try:
        first.expect("started")
        operator.dispatch(jt, {"argv": argv}, requirements={"gpu_count": 1})
        first.expect("job")
        wait_for(lambda: len(read_pids(pids)) == 2, 30, "the command and its grandchild to start")
        child, grandchild = read_pids(pids)
        shim = parent_of(child)
        running_file = ident + ".running.json"
        assert os.path.exists(running_file)
        assert oct(os.stat(running_file).st_mode & 0o777) == "0o600"
        os.kill(first.proc.pid, signal.SIGKILL)
        os.kill(shim, signal.SIGKILL)
        first.proc.wait(timeout=10)
        wait_for(lambda: gone(shim), 10, "the shim to end")
        assert not gone(child) and not gone(grandchild)  # nothing left to stop them
    finally:
        first.stop()
    second = ScriptWorker(server, tmp_path, "gpu_worker.py", ident, node, jt, smi)
    try:
        second.expect("started")
        # killed before the worker registered: "started" comes after
        assert gone(child) and gone(grandchild)
        assert not os.path.exists(running_file)
    finally:
        second.stop()
    assert "left behind" in second.proc.stderr.read()


def test_discovered_gpus_are_sent_on_every_start(server, operator, tmp_path):
    jt = unique("gpu_caps")
    ident, node = str(tmp_path / "identity.json"), unique("py-gpucaps")
    one = TWO_GPUS.splitlines()[0] + "\n"
    smi = fake_nvidia_smi(tmp_path, one)
    w1 = new_worker(server, identity=ident, nvidia_smi=smi, registration={"node_id": node})
    w1.job(jt)(lambda ctx: None)
    with running(w1):
        pass
    assert w1.registration["capabilities"]["gpus"] == [{"sku": "rtx-4090", "vram_mb": 24564}]
    (tmp_path / "smi-answer").write_text(TWO_GPUS)  # a second GPU put in the box
    w2 = new_worker(server, identity=ident, nvidia_smi=smi, registration={"node_id": node})
    w2.job(jt)(lambda ctx: None)
    with running(w2):
        pass
    ans = w2.start_answer
    assert ans["changed"] is True, ans
    rec = nodelane.verify_receipt_response(sequenced_receipt(operator, ans["receipt_id"]), server.receipt_public_key)
    assert rec["kind"] == "worker_updated"
    assert rec["old_gpus"] == "rtx-4090:24564" and rec["gpus"] == "rtx-4090:24564 rtx-4090:24564", rec


def test_a_named_nvidia_smi_that_fails_stops_the_worker(server, tmp_path):
    smi = fake_nvidia_smi(tmp_path, "0, GPU-x, NVIDIA GeForce RTX 4090\n")  # three fields, not four
    w = new_worker(server, nvidia_smi=smi, registration={"node_id": unique("py-badsmi")})
    w.job(unique("bad_smi"))(lambda ctx: None)
    try:
        w.run(install_signal_handlers=False)
    except nodelane.NodelaneError as e:
        assert "fields" in str(e), e
    else:
        raise AssertionError("run() started with an nvidia-smi whose answer is malformed")
    assert w.identity.worker_id is None  # it never registered


def test_the_documented_train_py_runs_under_ctx_run(server, operator, tmp_path):
    """cmd/commands/train.py, the example of docs/COMMANDS.md, run by ctx.run: its progress lines become
    progress events, its artifact line an uploaded artifact whose bytes the operator reads back, its
    result.json the metrics."""
    from serverproc import ROOT
    jt = unique("train_py")
    w = new_worker(server, registration={"node_id": unique("py-trainpy"),
                                         "capabilities": {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}]}})

    @w.job(jt)
    def train(ctx: JobContext) -> nodelane.Result:
        run = ctx.run([sys.executable, os.path.join(ROOT, "cmd", "commands", "train.py")], gpus=1,
                      retry_on_exit=(75,))
        return nodelane.Result(metrics=run.metrics, output_uri="file://" + run.output_dir)

    with running(w) as ends:
        jid = operator.dispatch(jt, {"epochs": 2, "step_seconds": 0, "rank": 4},
                                requirements={"gpu_count": 1})["job"]["id"]
        wait_for(lambda: ends, 60, "the job to end")
    assert ends[0].outcome == "succeeded", ends[0].error
    jv = operator.job(jid)
    assert jv["result"]["metrics"] == {"loss": 0.5, "epochs": 2}
    progress = [(e["message"], e["payload"]) for e in jv["events"] if e.get("event_type") == "progress"]
    assert progress == [("epoch 1/2", {"fraction": 0.5, "metrics": {"epoch": 1, "loss": 1.0}}),
                        ("epoch 2/2", {"fraction": 1.0, "metrics": {"epoch": 2, "loss": 0.5}})]
    logs = [e["message"] for e in jv["events"] if e["kind"] == "log"]
    assert "job %s attempt 1 on GPUs [0]" % jid in logs and "epoch 2/2 loss 0.5000" in logs, logs
    [a] = jv["artifacts"]
    assert (a["artifact_type"], a["name"], a["metadata"]) == ("adapter", "adapter_model.safetensors",
                                                               {"rank": 4, "epochs": 2})
    dest = tmp_path / "adapter"
    operator.download(a["artifact_id"], str(dest))
    assert dest.read_bytes() == b"simulated LoRA adapter, rank 4, loss 0.500000\n"
