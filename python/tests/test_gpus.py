"""nodelane.gpus: nvidia-smi discovery against fake nvidia-smi programs (/bin/sh scripts, as the Go tests'
cmd/internal/gpu/gputest), the SKU table of the Go worker, and the GPU pool."""

from __future__ import annotations

import os
import threading
import time
from typing import Dict, List

import pytest

from helpers import gone, wait_for
from nodelane import Cancelled, ConfigError
from nodelane.gpus import (DISCOVER_QUERY, MAX_DEVICES, MAX_OUTPUT_BYTES, MAX_SKU_BYTES, UNKNOWN_SKU, Device,
                           GPUError, GPUPool, NoNvidiaSMI, discover, sku)

TWO_4090 = ("0, GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f, NVIDIA GeForce RTX 4090, 24564\n"
            "1, GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d, NVIDIA GeForce RTX 4090, 24564\n")
SAMPLE_QUERY = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu"


def fake_smi(directory: str, answers: Dict[str, str]) -> str:
    """Write an executable fake nvidia-smi into directory and return its path. It exits 2, saying why on
    stderr, unless called with exactly --query-gpu=Q --format=csv,noheader,nounits for a Q of answers;
    then it prints answers[Q]. An answer starting with "#!" is run as shell commands instead."""
    script = ['#!/bin/sh',
              '[ $# -eq 2 ] || { echo "want 2 arguments, got $#: $*" >&2; exit 2; }',
              '[ "$2" = "--format=csv,noheader,nounits" ] || { echo "unexpected argument $2" >&2; exit 2; }',
              'case "$1" in']
    for q, a in answers.items():
        script.append("--query-gpu=%s)" % q)
        if a.startswith("#!"):
            script.append(a[2:])
        else:
            script.append("printf '%%s' '%s'" % a.replace("'", "'\\''"))
        script.append(";;")
    script += ['*) echo "unexpected argument $1" >&2; exit 2;;', "esac", ""]
    path = os.path.join(directory, "nvidia-smi")
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write("\n".join(script))
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path


def lines(n: int, fmt: str) -> str:
    return "".join(fmt % (i, i) for i in range(n))


def test_two_gpus_from_path(tmp_path, monkeypatch):
    fake_smi(str(tmp_path), {DISCOVER_QUERY: TWO_4090})
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % tmp_path)
    got = discover()
    assert got == [Device(0, "GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f", "NVIDIA GeForce RTX 4090", 24564),
                   Device(1, "GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", "NVIDIA GeForce RTX 4090", 24564)]
    assert [d.gpu() for d in got] == [{"sku": "rtx-4090", "vram_mb": 24564}] * 2


def test_a_path_given_none_on_path(tmp_path, monkeypatch):
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: TWO_4090})
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert len(discover(path)) == 2


def test_na_and_odd_spacing(tmp_path):
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: "\n  0 ,GPU-0,  [N/A] , [Not Supported]\r\n\n"
                                                    "1,GPU-1,NVIDIA H100 80GB HBM3,81559.0\n   \n"})
    got = discover(path)
    assert got == [Device(0, "GPU-0", "", 0), Device(1, "GPU-1", "NVIDIA H100 80GB HBM3", 81559)]
    assert got[0].gpu() == {"sku": UNKNOWN_SKU, "vram_mb": 0}
    assert got[1].gpu() == {"sku": "h100", "vram_mb": 81559}


def test_none_listed(tmp_path):
    assert discover(fake_smi(str(tmp_path), {DISCOVER_QUERY: ""})) == []


def test_64_gpus(tmp_path):
    got = discover(fake_smi(str(tmp_path), {DISCOVER_QUERY: lines(MAX_DEVICES, "%d, GPU-%d, NVIDIA L4, 23034\n")}))
    assert len(got) == MAX_DEVICES == 64


@pytest.mark.parametrize("answer,where,msg", [
    ("0, GPU-0, NVIDIA L4, 23034\n1, GPU-1, NVIDIA L4\n", 'line 2 ("1, GPU-1, NVIDIA L4")', "3 fields, want 4"),
    ("0, GPU-0, NVIDIA L4, 23034, 7\n", "line 1", "5 fields, want 4"),
    ("zero, GPU-0, NVIDIA L4, 23034\n", "line 1", 'index "zero" is not a number'),
    ("[N/A], GPU-0, NVIDIA L4, 23034\n", "line 1", 'index "" is not a number'),
    ("-1, GPU-0, NVIDIA L4, 23034\n", "line 1", 'index "-1"'),
    ("1_0, GPU-0, NVIDIA L4, 23034\n", "line 1", 'index "1_0"'),
    ("0, GPU-0, NVIDIA L4, 1\n\n0, GPU-1, NVIDIA L4, 1\n", "line 3", "index 0 is listed twice"),
    ("0, GPU-0, NVIDIA L4, 1\n1, GPU-0, NVIDIA L4, 1\n", "line 2", "uuid GPU-0 is listed twice"),
    ("0, [N/A], NVIDIA L4, 1\n", "line 1", "no uuid"),
    ('0, GPU 0"x, NVIDIA L4, 1\n', "line 1", "holds a character"),
    ("0, GPU-" + "0" * 64 + ", NVIDIA L4, 1\n", "line 1", "uuid is over 64 bytes"),
    ("0, GPU-0, NVIDIA L4, 23034 MiB\n", "line 1", 'memory.total "23034 MiB" is not a number'),
    ("0, GPU-0, NVIDIA L4, -5\n", "line 1", 'memory.total "-5"'),
    ("0, GPU-0, NVIDIA L4, 1e12\n", "line 1", 'memory.total "1e12"'),
    ("0, GPU-0, NVIDIA L4, nan\n", "line 1", 'memory.total "nan"'),
    ("index, uuid, name, memory.total [MiB]\n", "line 1", 'index "index"'),
    (lines(MAX_DEVICES + 1, "%d, GPU-%d, NVIDIA L4, 23034\n"), "nvidia-smi answer:", "more than 64 GPUs listed"),
], ids=["too few fields", "too many fields", "index not a number", "index N/A", "negative index",
        "index with underscore", "index twice", "uuid twice", "no uuid", "odd uuid", "long uuid",
        "memory not a number", "memory negative", "memory huge", "memory nan", "a header", "too many GPUs"])
def test_malformed_answers_refused(tmp_path, answer, where, msg):
    with pytest.raises(GPUError) as e:
        discover(fake_smi(str(tmp_path), {DISCOVER_QUERY: answer}))
    assert where in str(e.value) and msg in str(e.value)
    assert not isinstance(e.value, NoNvidiaSMI)
    if where.startswith("line "):
        assert e.value.line == int(where.split()[1])


def test_not_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NoNvidiaSMI) as e:
        discover()
    assert isinstance(e.value, ConfigError) and isinstance(e.value, GPUError)


def test_not_at_the_path_given(tmp_path):
    with pytest.raises(NoNvidiaSMI):
        discover(str(tmp_path / "nvidia-smi"))


def test_not_executable(tmp_path):
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: TWO_4090})
    os.chmod(path, 0o644)
    with pytest.raises(GPUError) as e:
        discover(path)
    assert not isinstance(e.value, NoNvidiaSMI)


def test_fails(tmp_path):
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: "#!echo 'NVIDIA-SMI has failed because it could not "
                                                    "communicate with the NVIDIA driver.'; exit 9"})
    with pytest.raises(GPUError, match="exit status 9: NVIDIA-SMI has failed because it could not communicate"):
        discover(path)


def test_wrong_arguments(tmp_path):
    # The fake knows only the sampler's query: discover's arguments are checked.
    path = fake_smi(str(tmp_path), {SAMPLE_QUERY: "0, GPU-0, 1, 1, 1, 1"})
    with pytest.raises(GPUError, match="unexpected argument --query-gpu=" + DISCOVER_QUERY):
        discover(path)


def test_hangs(tmp_path):
    pid_file = tmp_path / "sleep.pid"
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: "#!sleep 30 & echo $! > %s; wait" % pid_file})
    start = time.monotonic()
    with pytest.raises(GPUError, match="did not answer within 0.3s"):
        discover(path, timeout=0.3)
    assert time.monotonic() - start < 5, "a hung nvidia-smi held discover"
    # Its child, which held the pipes, was killed with it.
    pid = int(pid_file.read_text())
    wait_for(lambda: gone(pid), 5, "the fake's sleep to end")


def test_megabytes(tmp_path):
    endless = '#!i=0; while [ $i -lt 100000 ]; do echo "$i, GPU-$i, NVIDIA GeForce RTX 4090, 24564"; i=$((i+1)); done'
    path = fake_smi(str(tmp_path), {DISCOVER_QUERY: endless})
    start = time.monotonic()
    with pytest.raises(GPUError, match="output too large: over %d bytes" % MAX_OUTPUT_BYTES):
        discover(path)
    assert time.monotonic() - start < 5, "an endless nvidia-smi held discover"


def test_bad_arguments():
    with pytest.raises(ConfigError):
        discover(timeout=0)
    with pytest.raises(ConfigError):
        discover(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name,want", [
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 4090 D", "rtx-4090-d"),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "rtx-4090-laptop"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx-3090-ti"),
    ("NVIDIA GeForce GTX 1080 Ti", "gtx-1080-ti"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
    ("Quadro RTX 8000", "rtx-8000"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla V100-PCIE-32GB", "v100"),
    ("  nvidia   geforce rtx 4090  ", "rtx-4090"),
    ("NVIDIA GeForce RTX 5090 (GDDR7)", "rtx-5090"),
    ("Graphics Device", "graphics-device"),
    ("NVIDIA", UNKNOWN_SKU),
    ("", UNKNOWN_SKU),
    ("[N/A]", "n-a"),
    ("Ünïcode Ωmega 9000", "n-code-mega-9000"),
    ("x" * 100, "x" * MAX_SKU_BYTES),
    ("abcdefghi " * 10, "-".join(["abcdefghi"] * 6)),
])
def test_sku(name, want):
    got = sku(name)
    assert got == want
    assert len(got) <= MAX_SKU_BYTES
    assert sku(name) == got


# -- the pool ----------------------------------------------------------------------

def never() -> None:
    return None


def test_pool_hands_out_distinct_devices_and_waits():
    pool = GPUPool(["0", "1"])
    stop = threading.Event()
    a = pool.acquire(1, stop, never)
    b = pool.acquire(1, stop, never)
    assert sorted(a + b) == ["0", "1"]
    assert pool.free() == 0
    waits: List[int] = []
    got: List[List[str]] = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(1, stop, never, on_wait=lambda: waits.append(1))))
    t.start()
    wait_for(lambda: waits, 5, "the third acquire to wait")
    assert not got and t.is_alive()
    pool.release(a)
    t.join(5)
    assert got == [a] and waits == [1]
    assert pool.acquire(0, stop, never) == []


def test_pool_stop_cancels_the_wait():
    pool = GPUPool(["0"])
    stop = threading.Event()
    held = pool.acquire(1, stop, never)
    errors: List[BaseException] = []
    waiting = threading.Event()

    def acquire() -> None:
        try:
            pool.acquire(1, stop, lambda: "lease_lost", on_wait=waiting.set)
        except Cancelled as e:
            errors.append(e)
    t = threading.Thread(target=acquire)
    t.start()
    assert waiting.wait(5)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and errors[0].reason == "lease_lost"
    assert pool.free() == 0  # the cancelled acquire took nothing
    pool.release(held)
    assert pool.free() == 1
    # Set before: nothing is taken, even when free.
    with pytest.raises(Cancelled, match="canceled"):
        pool.acquire(1, stop, never)
    assert pool.free() == 1


def test_pool_refuses_at_once():
    pool = GPUPool(["0", "1"])
    stop = threading.Event()
    for n in (3, -1, True, "1"):
        with pytest.raises(ConfigError):
            pool.acquire(n, stop, never)  # type: ignore[arg-type]
    for devices in (["0", "0"], ["0,1"], [""], "01", [0]):
        with pytest.raises(ConfigError):
            GPUPool(devices)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        pool.release(["7"])


def test_pool_never_hands_a_device_to_two_holders():
    pool = GPUPool(["0", "1", "2", "3"])
    stop = threading.Event()
    mu = threading.Lock()
    held: Dict[str, bool] = {}
    errors: List[str] = []

    def work(i: int) -> None:
        n = i % 3 + 1
        ids = pool.acquire(n, stop, never)
        with mu:
            for d in ids:
                if held.get(d):
                    errors.append("device %s handed out twice" % d)
                held[d] = True
        with mu:
            for d in ids:
                held[d] = False
        pool.release(ids)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    assert pool.free() == 4
