"""nodelane.process: commands run under the command shim, as real processes: /bin/sh and python3 scripts,
real signals, a real worker process (proc_parent.py) killed with SIGKILL, and the running file a restarted
worker reaps (docs/COMMANDS.md §2–§5)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import pytest

from helpers import gone, wait_for
from nodelane import Cancelled, ConfigError, JobError
from nodelane import process
from nodelane.process import RunningFile, run_command, scrubbed_env

HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder:
    """A Sink that records what a run reports. progress_gate and upload_gate, when set, hold those calls
    until they are set; fail names the artifacts whose upload raises."""

    def __init__(self, fail: Sequence[str] = ()):
        self.mu = threading.Lock()
        self.logs: List[tuple] = []
        self.progresses: List[tuple] = []
        self.uploads: List[tuple] = []
        self.fail = set(fail)
        self.progress_gate: Optional[threading.Event] = None
        self.upload_gate: Optional[threading.Event] = None
        self.upload_called = threading.Event()

    def log(self, message: str, payload: Optional[dict]) -> None:
        with self.mu:
            self.logs.append((message, payload))

    def progress(self, fraction: Optional[float], message: str, metrics: Optional[dict]) -> None:
        if self.progress_gate is not None:
            assert self.progress_gate.wait(30)
        with self.mu:
            self.progresses.append((fraction, message, metrics))

    def upload(self, path: str, name: str, kind: str, metadata: Optional[dict]) -> dict:
        self.upload_called.set()
        if self.upload_gate is not None:
            assert self.upload_gate.wait(30)
        with open(path, "rb") as f:
            data = f.read()
        with self.mu:
            self.uploads.append((path, name, kind, metadata, data))
        if name in self.fail:
            raise JobError("the store is out of reach", code="store_unreachable")
        return {"artifact_id": "a-%d" % len(self.uploads)}

    def lines(self, stream: Optional[str] = None) -> List[str]:
        """The messages logged (of one stream when given)."""
        with self.mu:
            return [m for m, p in self.logs if stream is None or (p or {}).get("stream") == stream]

    def warned(self, needle: str) -> List[tuple]:
        """The log lines with a warning whose message or warning holds needle."""
        with self.mu:
            return [(m, p) for m, p in self.logs if p and "warning" in p and (needle in m or needle in p["warning"])]

    def value(self, key: str) -> Optional[str]:
        """The first word after "key " in a logged line ("leader 123" -> "123")."""
        for m in self.lines():
            if m.startswith(key + " "):
                return m.split()[1]
        return None


def run(tmp_path: Any, argv: Sequence[str], sink: Optional[Recorder] = None, *, extra: Optional[Dict[str, str]] = None,
        **kw: Any) -> process.RunResult:
    """run_command with a fresh output directory, a scrubbed environment and a short grace."""
    out = tmp_path / "output"
    out.mkdir(exist_ok=True)
    env = scrubbed_env(dict({"NODELANE_OUTPUT_DIR": str(out)}, **(extra or {})))
    opts: Dict[str, Any] = dict(sink=sink or Recorder(), stop=threading.Event(), stop_reason=lambda: None, env=env,
                                cwd=None, output_dir=str(out), kill_grace=1.0)
    opts.update(kw)
    return run_command(list(argv), **opts)


def sh(script: str) -> List[str]:
    return ["/bin/sh", "-c", script]


def start_time(pid: int) -> int:
    with open("/proc/%d/stat" % pid) as f:
        st = f.read()
    return int(st[st.rindex(")") + 2:].split()[19])


def all_gone(pids: Sequence[int]) -> bool:
    return all(gone(p) for p in pids)


def kill_quietly(pids: Sequence[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# A script whose shell ignores SIGTERM and prints its pid, with a child in its group that ignores
# SIGTERM too and one that left the group (setsid), each printing its pid.
STUBBORN = r"""trap '' TERM
sh -c 'trap "" TERM; echo "child $$"; exec sleep 1000' &
setsid sh -c 'trap "" TERM; echo "escaped $$"; exec sleep 1000' &
echo "leader $$"
while :; do sleep 1; done
"""


def stubborn_pids(rec: Recorder) -> List[int]:
    wait_for(lambda: all(rec.value(k) for k in ("leader", "child", "escaped")), 15, "the script's pids")
    return [int(rec.value(k) or 0) for k in ("leader", "child", "escaped")]


# -- output -----------------------------------------------------------------------

def test_output_lines_reach_the_log_with_their_stream(tmp_path):
    rec = Recorder()
    r = run(tmp_path, sh("echo one; echo two >&2; printf 'three\\r\\n'; echo 'nodelane:progressbar 50%'; "
                         "printf 'no line end'"), rec)
    assert r.returncode == 0 and r.metrics is None and r.output_dir == str(tmp_path / "output")
    assert rec.lines("stdout") == ["one", "three", "nodelane:progressbar 50%", "no line end"]
    assert rec.lines("stderr") == ["two"]
    assert not rec.progresses and not rec.warned("")


def test_progress_and_artifact_lines(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    (tmp_path / "secret").write_text("not the command's")
    script = r"""
cd "$NODELANE_OUTPUT_DIR"
mkdir adapter && printf 'weights' > adapter/model.bin && printf 'log' > train.log
ln -s adapter/model.bin inside-link
ln -s ../secret outside-link
mkdir a-dir
echo 'nodelane:progress {"fraction": 0.5, "message": "epoch 1/2", "metrics": {"loss": 0.7}}'
echo 'nodelane:progress {"fraction": 0.25}'
echo 'nodelane:progress null'
meta='"metadata": {"rank": 8}'
echo 'nodelane:artifact {"name": "adapter_model", "path": "adapter/model.bin", "kind": "adapter", '"$meta}"
echo 'nodelane:artifact {"path": "train.log"}'
echo 'nodelane:artifact {"path": "inside-link"}'
echo 'nodelane:progress {"fracton": 0.5}'
echo 'nodelane:progress {"fraction": 1.5}'
echo 'nodelane:progress {"metrics": [1]}'
echo 'nodelane:progress {"fraction": }'
echo 'nodelane:progress {"fraction": NaN}'
echo 'nodelane:progress {"fraction": 0.5} x'
echo 'nodelane:artifact {"path": "/etc/passwd"}'
echo 'nodelane:artifact {"path": "adapter/../../secret"}'
echo 'nodelane:artifact {"name": "x"}'
echo "nodelane:artifact {\"path\": \"train.log\", \"name\": \"$(printf '%0256d' 0)\"}"
echo 'nodelane:artifact {"path": "outside-link"}'
echo 'nodelane:artifact {"path": "a-dir"}'
echo 'nodelane:artifact {"path": "missing.bin"}'
echo 'nodelane:progress {"fraction": 1, "message": "done"}'
"""
    rec = Recorder()
    run(tmp_path, sh(script), rec)
    assert rec.progresses == [(0.5, "epoch 1/2", {"loss": 0.7}), (0.25, "25%", None), (None, "", None),
                              (1.0, "done", None)]
    assert [(os.path.relpath(p, out), n, k, md, d) for p, n, k, md, d in rec.uploads] == [
        ("adapter/model.bin", "adapter_model", "adapter", {"rank": 8}, b"weights"),
        ("train.log", "train.log", "file", None, b"log"),
        ("adapter/model.bin", "inside-link", "file", None, b"weights"),  # a link that stays inside: its file
    ]
    for needle in ("unknown field", "between 0 and 1", "metrics is not a JSON object", "bad JSON",
                   "NaN is not JSON", "text after the object"):
        assert rec.warned(needle), needle
    assert len(rec.warned("not a relative path inside NODELANE_OUTPUT_DIR")) == 2
    assert rec.warned("path is required") and rec.warned("at most 255 bytes")
    # Each refused line is logged as it was, on stdout, with the warning.
    bad = rec.warned("between 0 and 1")[0]
    assert bad == ('nodelane:progress {"fraction": 1.5}',
                   {"stream": "stdout", "warning": "nodelane:progress: fraction 1.5 is not between 0 and 1"})
    assert rec.warned('"outside-link" leads out of NODELANE_OUTPUT_DIR')[0][1] == {"warning": "bad artifact"}
    assert rec.warned('"a-dir" is not a regular file')
    assert rec.warned('artifact missing.bin not reported: path "missing.bin": No such file or directory')
    assert not any("secret" in str(u) for u in rec.uploads)


def test_a_long_line_is_cut(tmp_path):
    rec = Recorder()
    long_progress = 'nodelane:progress {"message": "%s"}' % ("y" * 20000)
    run(tmp_path, sh("head -c 20000 /dev/zero | tr '\\0' x; echo; echo '%s'; printf 'x'; i=0; "
                     "while [ $i -lt 10000 ]; do printf '\\303\\251'; i=$((i+1)); done; echo; echo after"
                     % long_progress), rec)
    lines = rec.lines("stdout")
    assert process.MAX_LINE_BYTES == 16320
    assert lines[0] == "x" * 16320 + " ...(truncated)"
    assert lines[1].endswith(" ...(truncated)") and len(lines[1].encode()) == 16320 + len(" ...(truncated)")
    assert rec.warned("over 16320 bytes: not read")
    # The cut splits a two-byte character: it is dropped, not half kept.
    assert lines[2] == "x" + "\u00e9" * 8159 + " ...(truncated)"
    assert lines[3] == "after" and not rec.progresses


def test_a_flood_is_dropped_and_counted(tmp_path):
    rec = Recorder()
    start = time.monotonic()
    run(tmp_path, ["python3", "-c", "import sys; sys.stdout.write(''.join('line %d\\n' % i for i in range(5000)))"],
        rec)
    took = time.monotonic() - start
    logged = [m for m in rec.lines("stdout")]
    counts = [int(m.split()[0]) for m, p in rec.logs
              if m.endswith(" output lines dropped: over the limit of 100 lines per second") and p is None]
    assert 1000 <= len(logged) <= 1000 + 100 * took + 1
    assert counts and sum(counts) + len(logged) == 5000
    assert logged[:3] == ["line 0", "line 1", "line 2"]


def test_progress_never_blocks_the_output(tmp_path):
    # The control plane answers slowly: the output is read on, at most 64 progress reports wait, and the
    # newest replaces the last waiting one.
    rec = Recorder()
    rec.progress_gate = threading.Event()
    script = ("import sys\nfor i in range(1, 201):\n    print('nodelane:progress {\"fraction\": %s}' % (i / 200))\n"
              "print('printed', flush=True)\nsys.stdin.read()\n")
    errors: List[BaseException] = []
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, ["python3", "-c", script], rec))
    t.start()
    wait_for(lambda: "printed" in rec.lines("stdout"), 15, "the line after the progress lines")
    assert t.is_alive() and not rec.progresses
    rec.progress_gate.set()
    t.join(30)
    assert not errors
    # 64 waited (the last one replaced by each newer), and one more if the report thread had taken the
    # first before the rest came.
    assert process.MAX_PENDING_PROGRESS <= len(rec.progresses) <= 1 + process.MAX_PENDING_PROGRESS
    assert rec.progresses[0][0] == 0.005 and rec.progresses[-1][0] == 1.0
    fractions = [p[0] for p in rec.progresses]
    assert fractions == sorted(fractions)


def _run_catching(errors: List[BaseException], tmp_path: Any, argv: Sequence[str], rec: Recorder, **kw: Any) -> None:
    try:
        run(tmp_path, argv, rec, **kw)
    except BaseException as e:
        errors.append(e)


def test_the_run_ends_after_its_uploads(tmp_path):
    rec = Recorder()
    rec.upload_gate = threading.Event()
    errors: List[BaseException] = []
    script = ('printf data > "$NODELANE_OUTPUT_DIR/w.bin"; echo \'nodelane:artifact {"path": "w.bin"}\'; '
              'echo "leader $$"')
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, sh(script), rec))
    t.start()
    assert rec.upload_called.wait(15)
    leader = int(wait_for(lambda: rec.value("leader"), 15, "the leader's pid"))
    wait_for(lambda: gone(leader), 15, "the command to exit")
    t.join(0.5)
    assert t.is_alive(), "the run returned while its upload was under way"
    rec.upload_gate.set()
    t.join(15)
    assert not t.is_alive() and not errors
    assert [u[1] for u in rec.uploads] == ["w.bin"]


def test_a_failed_upload_fails_the_run(tmp_path):
    rec = Recorder(fail=["b.bin"])
    script = ('cd "$NODELANE_OUTPUT_DIR"; printf a > a.bin; printf b > b.bin; '
              'echo \'nodelane:artifact {"path": "a.bin"}\'; echo \'nodelane:artifact {"path": "b.bin"}\'')
    with pytest.raises(JobError) as e:
        run(tmp_path, sh(script), rec)
    assert e.value.code == "artifact_not_reported" and e.value.retryable
    assert "b.bin" in str(e.value) and "a.bin" not in str(e.value)
    assert rec.warned("artifact b.bin not reported: store_unreachable")[0][1] == {"warning": "artifact not reported"}
    assert [u[1] for u in rec.uploads] == ["a.bin", "b.bin"]


def test_at_most_1000_artifacts(tmp_path):
    rec = Recorder()
    script = ('printf a > "$NODELANE_OUTPUT_DIR/a"; i=0; while [ $i -lt 1001 ]; do '
              'echo \'nodelane:artifact {"path": "a"}\'; i=$((i+1)); done')
    run(tmp_path, sh(script), rec)
    assert len(rec.uploads) == 1000
    assert len(rec.warned("over 1000 artifacts: not reported")) == 1


# -- how it ends ----------------------------------------------------------------------

@pytest.mark.parametrize("script,retry,code,retryable,says", [
    ("echo bye >&2; exit 3", (), "exit_3", False, "exited with status 3; last stderr line: bye"),
    ("echo bye >&2; exit 3", (3, 75), "exit_3", True, "exited with status 3"),
    ("echo crash >&2; kill -SEGV $$", (), "signal_SIGSEGV", True, "killed by SIGSEGV; last stderr line: crash"),
    ("exec python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'", (), "signal_SIGKILL", True,
     "killed by SIGKILL"),
], ids=["exit 3", "exit 3 retried", "SIGSEGV", "SIGKILL at once"])
def test_exit_mapped(tmp_path, script, retry, code, retryable, says):
    with pytest.raises(JobError) as e:
        run(tmp_path, sh(script), retry_on_exit=retry)
    assert e.value.code == code and e.value.retryable is retryable
    assert says in str(e.value)


def test_the_last_stderr_line_is_bounded(tmp_path):
    with pytest.raises(JobError) as e:
        run(tmp_path, sh("head -c 2000 /dev/zero | tr '\\0' e >&2; echo >&2; exit 1"))
    assert str(e.value).endswith("; last stderr line: " + "e" * 512 + "...")


def test_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(JobError) as e:
        run(tmp_path, sh("trap '' TERM; echo started; sleep 1000"), timeout=0.5, kill_grace=0.5)
    took = time.monotonic() - start
    assert e.value.code == "timeout" and not e.value.retryable
    assert "timeout of 0.5s" in str(e.value)
    assert 1.0 <= took < 5, took  # SIGTERM ignored: SIGKILL after the grace


def test_start_failed(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    bad_interpreter = tmp_path / "bad.sh"
    bad_interpreter.write_text("#!/no/such/interpreter\n")
    bad_interpreter.chmod(0o755)
    for argv, says in ((["no-such-program-nodelane"], "no executable no-such-program-nodelane"),
                       ([str(tmp_path / "none")], "No such file"),
                       ([str(script)], "Permission denied"),
                       ([str(bad_interpreter)], "No such file")):
        with pytest.raises(JobError) as e:
            run(tmp_path, argv)
        assert e.value.code == "start_failed" and not e.value.retryable, argv
        assert says in str(e.value), (argv, str(e.value))


@pytest.mark.parametrize("content,says", [
    ("[1, 2]", "not a JSON object"),
    ("{\"loss\": ", "not a JSON object"),
    ("{\"x\": \"%s\"}" % ("a" * (16 << 10)), "over 16384 bytes"),
    (None, "leads out"),
], ids=["a list", "not JSON", "too large", "a link out"])
def test_bad_result(tmp_path, content, says):
    out = tmp_path / "output"
    out.mkdir()
    if content is None:
        (tmp_path / "elsewhere.json").write_text('{"stolen": 1}')
        (out / "result.json").symlink_to(tmp_path / "elsewhere.json")
    else:
        (out / "result.json").write_text(content)
    with pytest.raises(JobError) as e:
        run(tmp_path, sh("true"))
    assert e.value.code == "bad_result" and not e.value.retryable
    assert says in str(e.value)


def test_result_json(tmp_path):
    r = run(tmp_path, sh('echo \'{"loss": 0.25, "epochs": 3}\' > "$NODELANE_OUTPUT_DIR/result.json"'))
    assert r.metrics == {"loss": 0.25, "epochs": 3}


# -- the environment -------------------------------------------------------------------

ENV_SCRIPT = r"""
import json, os, sys
with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
    shim = f.read().decode()
print(json.dumps({"env": dict(os.environ), "pgid": os.getpgrp(), "pid": os.getpid(), "sid": os.getsid(0),
                  "stdin": sys.stdin.read(), "cwd": os.getcwd(), "shim_cmdline": shim}))
"""


def test_the_environment_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("NODELANE_PROVISIONING_TOKEN", "provisioning-secret")
    monkeypatch.setenv("SOME_SECRET", "x-secret")
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    out = tmp_path / "output"
    out.mkdir()
    env = scrubbed_env({"NODELANE_JOB_ID": "job-1", "NODELANE_OUTPUT_DIR": str(out), "HF_TOKEN": "hf-secret"},
                       pass_through=["HF_HOME", "NOT_SET_ANYWHERE"])
    rec = Recorder()
    run_command([sys.executable, "-c", ENV_SCRIPT], sink=rec, stop=threading.Event(), stop_reason=lambda: None,
                env=env, cwd=None, output_dir=str(out), kill_grace=1.0)
    got = json.loads(rec.lines("stdout")[0])
    assert set(got["env"]) == {"PATH", "HOME", "LANG", "HF_HOME", "NODELANE_JOB_ID", "NODELANE_OUTPUT_DIR",
                               "HF_TOKEN", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"} - (
        set() if "HOME" in os.environ else {"HOME"})
    assert got["env"]["PATH"] == os.environ["PATH"] and got["env"]["HF_HOME"] == "/models"
    assert got["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and got["env"]["CUDA_VISIBLE_DEVICES"] == ""
    # Its own session and process group, stdin /dev/null, the output directory as its working directory.
    assert got["pgid"] == got["pid"] == got["sid"]
    assert got["stdin"] == "" and got["cwd"] == str(out)
    # The environment reached the shim through a pipe, not on its command line.
    assert "_shim.py" in got["shim_cmdline"] and "hf-secret" not in got["shim_cmdline"]


def test_path_defaults(monkeypatch):
    monkeypatch.delenv("PATH")
    monkeypatch.delenv("HOME", raising=False)
    env = scrubbed_env({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "CUDA_VISIBLE_DEVICES": "0,1", **({"LANG": os.environ["LANG"]} if "LANG" in os.environ else {})}


@pytest.mark.parametrize("names", [["PATH"], ["HOME"], ["LANG"], ["NODELANE_PROVISIONING_TOKEN"], ["NODELANE_X"],
                                   ["CUDA_VISIBLE_DEVICES"], ["CUDA_DEVICE_ORDER"], [""], ["A=B"], "HF_HOME"])
def test_pass_through_refused(names):
    with pytest.raises(ConfigError):
        scrubbed_env({}, pass_through=names)


def test_extra_refused():
    with pytest.raises(ConfigError, match="provisioning token"):
        scrubbed_env({"NODELANE_PROVISIONING_TOKEN": "x"})
    with pytest.raises(ConfigError, match="PCI_BUS_ID"):
        scrubbed_env({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    with pytest.raises(ConfigError):
        scrubbed_env({"A": 1})  # type: ignore[dict-item]


def test_cwd_and_a_relative_program(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.sh").write_text("#!/bin/sh\npwd\n")
    (work / "train.sh").chmod(0o755)
    rec = Recorder()
    run(tmp_path, ["./train.sh"], rec, cwd=str(work))
    assert rec.lines("stdout") == [str(work)]


def test_bad_arguments(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    for kw in (dict(argv="echo hi"), dict(argv=[]), dict(argv=[""]), dict(argv=["echo", 1]), dict(timeout=0),
               dict(timeout=-1), dict(kill_grace=0), dict(kill_grace=True), dict(retry_on_exit=[0]),
               dict(retry_on_exit=[256]), dict(output_dir=str(tmp_path / "none")), dict(cwd=str(tmp_path / "none")),
               dict(env={"A=B": "x"}), dict(record={"x": object()})):
        args: Dict[str, Any] = dict(argv=["true"], sink=Recorder(), stop=threading.Event(), stop_reason=lambda: None,
                                    env=scrubbed_env({}), cwd=None, output_dir=str(out), kill_grace=1.0)
        args.update(kw)
        with pytest.raises(ConfigError):
            run_command(**args)
    # Stopped already: nothing starts.
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled, match="drained"):
        run_command(["sh", "-c", "touch started"], sink=Recorder(), stop=stop, stop_reason=lambda: "drained",
                    env=scrubbed_env({}), cwd=str(tmp_path), output_dir=str(out))
    assert not (tmp_path / "started").exists()


def test_linux_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ConfigError, match="ctx.run needs Linux"):
        run(tmp_path, ["true"])


# -- stopping ------------------------------------------------------------------------------

def test_stop_ends_the_group_and_what_left_it(tmp_path):
    rec = Recorder()
    stop = threading.Event()
    errors: List[BaseException] = []
    grace = 1.0
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, sh(STUBBORN), rec, stop=stop,
                                                      stop_reason=lambda: "canceled", kill_grace=grace))
    t.start()
    pids = stubborn_pids(rec)
    try:
        start = time.monotonic()
        stop.set()
        t.join(grace + 10)
        took = time.monotonic() - start
        assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], Cancelled) and errors[0].reason == "canceled", errors
        assert all_gone(pids), [p for p in pids if not gone(p)]  # gone when run_command returns
        assert grace - 0.1 <= took <= grace + 2, took  # SIGTERM first (ignored), SIGKILL after the grace
    finally:
        kill_quietly(pids)


def test_a_command_that_heeds_sigterm_ends_at_once(tmp_path):
    rec = Recorder()
    stop = threading.Event()
    errors: List[BaseException] = []
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, sh("echo \"leader $$\"; exec sleep 1000"), rec,
                                                      stop=stop, stop_reason=lambda: "lease_lost", kill_grace=30))
    t.start()
    leader = int(wait_for(lambda: rec.value("leader"), 15, "the leader's pid"))
    start = time.monotonic()
    stop.set()
    t.join(15)
    assert time.monotonic() - start < 5 and gone(leader)
    assert isinstance(errors[0], Cancelled) and errors[0].reason == "lease_lost"


def test_what_a_command_leaves_is_killed_when_it_exits(tmp_path):
    rec = Recorder()
    script = r"""cd "$NODELANE_OUTPUT_DIR"
sh -c 'trap "" TERM; echo $$ > child.tmp; mv child.tmp child.pid; exec sleep 1000' &
setsid sh -c 'echo $$ > escaped.tmp; mv escaped.tmp escaped.pid; exec sleep 1000' &
while [ ! -s child.pid ] || [ ! -s escaped.pid ]; do sleep 0.01; done
echo left
"""
    start = time.monotonic()
    run(tmp_path, sh(script), rec, kill_grace=30)
    assert time.monotonic() - start < 5  # no grace: SIGKILL at once
    pids = [int((tmp_path / "output" / n).read_text()) for n in ("child.pid", "escaped.pid")]
    try:
        assert rec.lines("stdout") == ["left"]
        assert all_gone(pids), [p for p in pids if not gone(p)]
    finally:
        kill_quietly(pids)


def test_a_killed_shim_fails_the_run_and_its_group_is_killed(tmp_path):
    rec = Recorder()
    errors: List[BaseException] = []
    script = "echo \"shim $PPID\"; echo \"leader $$\"; trap '' TERM; while :; do sleep 1; done"
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, sh(script), rec, kill_grace=30))
    t.start()
    shim = int(wait_for(lambda: rec.value("shim"), 15, "the shim's pid"))
    leader = int(wait_for(lambda: rec.value("leader"), 15, "the leader's pid"))
    try:
        os.kill(shim, signal.SIGKILL)
        t.join(15)
        assert not t.is_alive() and gone(leader)
    finally:
        kill_quietly([leader])
    assert isinstance(errors[0], JobError) and errors[0].code == "signal_SHIM_LOST" and errors[0].retryable


# -- the worker's death and its restart ------------------------------------------------------

def start_parent(tmp_path: Any, grace: float, stderr: Any = subprocess.PIPE) -> "tuple[subprocess.Popen, str]":
    """proc_parent.py running STUBBORN (its stderr a pipe, or the fd given); returns it and its running
    file's path."""
    out = tmp_path / "output"
    out.mkdir()
    running = str(tmp_path / "state" / "running.json")
    cfg = tmp_path / "parent.json"
    cfg.write_text(json.dumps({"argv": sh(STUBBORN), "output_dir": str(out), "kill_grace": grace,
                               "running": running, "record": {"job_id": "job-old", "attempt": 2}}))
    parent = subprocess.Popen([sys.executable, os.path.join(HERE, "proc_parent.py"), str(cfg)],
                              stdout=subprocess.PIPE, stderr=stderr, text=True)
    return parent, running


def parent_pids(parent: subprocess.Popen) -> Dict[str, int]:
    """The pids the command printed, read from the parent's event lines."""
    found: Dict[str, int] = {}
    for line in parent.stdout:
        ev = json.loads(line)
        if ev["event"] == "log" and ev["message"].split()[0] in ("leader", "child", "escaped"):
            found[ev["message"].split()[0]] = int(ev["message"].split()[1])
        if len(found) == 3:
            return found
    raise AssertionError("the parent ended before the command printed its pids: %s" % parent.stderr.read())


def listed(running: str) -> Dict[str, Any]:
    """The one run the running file lists."""
    def one() -> Optional[Dict[str, Any]]:
        try:
            with open(running) as f:
                runs = json.load(f)["runs"]
        except (OSError, ValueError):
            return None
        return runs[0] if len(runs) == 1 else None
    return wait_for(one, 15, "the running file to list the run")


def test_the_worker_killed_its_command_ends_within_the_grace(tmp_path):
    grace = 1.0
    parent, running = start_parent(tmp_path, grace)
    pids: Dict[str, int] = {}
    try:
        pids = parent_pids(parent)
        run = listed(running)
        assert os.stat(running).st_mode & 0o777 == 0o600
        assert run["job_id"] == "job-old" and run["attempt"] == 2
        assert run["pgid"] == pids["leader"] and run["leader_start"] == start_time(pids["leader"])
        assert run["session"] == pids["leader"]
        shim = run["shim_pid"]
        assert run["shim_start"] == start_time(shim)
        everything = [shim] + list(pids.values())
        parent.kill()  # SIGKILL: the worker cannot say anything
        start = time.monotonic()
        parent.wait()
        wait_for(lambda: all_gone(everything), grace + 2, "the shim and every process of the command to end")
        took = time.monotonic() - start
        assert took >= grace - 0.1, "gone after %.2fs, before kill_grace: no SIGTERM first?" % took
        # The shim said why on the worker's stderr, then let it go.
        err = parent.stderr.read()
        said = "nodelane command shim %d: the worker is gone; SIGTERM to process group %d" % (shim, pids["leader"])
        assert said in err, err
    finally:
        parent.kill()
        parent.wait()
        kill_quietly(list(pids.values()))


def test_a_full_stderr_does_not_hold_the_shim(tmp_path):
    # The worker's stderr is a pipe that is full and that nobody reads: the shim's line cannot be
    # written, and the shim goes on ending the command all the same.
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    grace = 1.0
    parent, running = start_parent(tmp_path, grace, stderr=w)
    os.close(w)
    pids: Dict[str, int] = {}
    try:
        pids = parent_pids(parent)
        everything = [listed(running)["shim_pid"]] + list(pids.values())
        parent.kill()
        parent.wait()
        wait_for(lambda: all_gone(everything), grace + 2, "the shim and every process of the command to end")
    finally:
        parent.kill()
        parent.wait()
        kill_quietly(list(pids.values()))
        os.close(r)


def test_a_restarted_worker_reaps_what_a_worker_killed_with_its_shim_left(tmp_path, caplog):
    parent, running = start_parent(tmp_path, 30.0)
    pids: Dict[str, int] = {}
    try:
        pids = parent_pids(parent)
        run = listed(running)
        # SIGKILL to the worker and its shim together (the OOM killer, a cgroup's kill): first stop the
        # worker, so that it cannot see its shim die and end the group itself.
        os.kill(parent.pid, signal.SIGSTOP)
        os.kill(run["shim_pid"], signal.SIGKILL)
        parent.kill()
        parent.wait()
        wait_for(lambda: gone(run["shim_pid"]), 5, "the shim to die")
        assert not gone(pids["leader"]) and not gone(pids["child"]), "the command should have been left running"
        caplog.set_level(logging.WARNING)
        killed = RunningFile.reap(running, logging.getLogger("test.reap"), wait=5)
        assert len(killed) == 1
        k = killed[0]
        assert k["job_id"] == "job-old" and k["attempt"] == 2 and k["pgid"] == pids["leader"]
        assert {pids["leader"], pids["child"]} <= set(k["pids"])  # and the loop's sleep 1, if it was there
        assert run["shim_pid"] not in k["pids"] and pids["escaped"] not in k["pids"]
        assert gone(pids["leader"]) and gone(pids["child"])  # reap waited for them
        assert not os.path.exists(running)
        msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(m.startswith("killed the processes a previous run of the worker left behind: job job-old, "
                                "attempt 2, pgid %d" % pids["leader"]) for m in msgs), msgs
        # What left the group (setsid) was beyond reach once its shim was dead (COMMANDS.md §5.2).
        assert not gone(pids["escaped"])
        assert RunningFile.reap(running, logging.getLogger("test.reap")) == []  # no file: nothing
    finally:
        parent.kill()
        parent.wait()
        kill_quietly(list(pids.values()))


def test_reap_never_takes_a_reused_pid(tmp_path):
    # Two processes recorded with other start times: the pids now name other processes.
    group = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    shim = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        path = tmp_path / "running.json"
        path.write_text(json.dumps({"runs": [{"job_id": "j", "attempt": 1, "pgid": group.pid,
                                              "leader_start": start_time(group.pid) - 1, "session": group.pid,
                                              "shim_pid": shim.pid, "shim_start": start_time(shim.pid) + 1}]}))
        assert RunningFile.reap(str(path), logging.getLogger("test.reap"), wait=2) == []
        assert group.poll() is None and shim.poll() is None
        assert not path.exists()
        # Recorded right, they are killed.
        path.write_text(json.dumps({"runs": [{"job_id": "j", "attempt": 1, "pgid": group.pid,
                                              "leader_start": start_time(group.pid), "session": group.pid,
                                              "shim_pid": shim.pid, "shim_start": start_time(shim.pid)}]}))
        killed = RunningFile.reap(str(path), logging.getLogger("test.reap"), wait=5)
        assert sorted(killed[0]["pids"]) == sorted([group.pid, shim.pid])
        assert group.wait(5) == -signal.SIGKILL and shim.wait(5) == -signal.SIGKILL
    finally:
        kill_quietly([group.pid, shim.pid])
        group.wait()
        shim.wait()


def test_reap_refuses_a_bad_file(tmp_path):
    path = tmp_path / "running.json"
    for content in ("{", " " * (process.MAX_STATE_BYTES + 1), '{"runs": [{"pgid": "x"}]}', '{"runs": 7}'):
        path.write_text(content)
        with pytest.raises(ConfigError, match="running.json"):
            RunningFile.reap(str(path), logging.getLogger("test.reap"))
        assert path.exists()


def test_the_running_file_lists_a_run_while_it_runs(tmp_path):
    state = tmp_path / "state"
    registry = RunningFile(str(state / "running.json"))
    rec = Recorder()
    stop = threading.Event()
    errors: List[BaseException] = []
    t = threading.Thread(target=lambda: _run_catching(errors, tmp_path, sh("echo \"leader $$\"; sleep 1000"), rec,
                                                      stop=stop, registry=registry,
                                                      record={"job_id": "job-1", "attempt": 1}))
    t.start()
    leader = int(wait_for(lambda: rec.value("leader"), 15, "the leader's pid"))
    run = listed(registry.path)
    assert run["pgid"] == leader and run["job_id"] == "job-1" and registry.entries() == [run]
    assert os.stat(registry.path).st_mode & 0o777 == 0o600
    assert [n for n in os.listdir(state) if n != "running.json"] == []  # no temporary file left
    stop.set()
    t.join(15)
    with open(registry.path) as f:
        assert json.load(f) == {"runs": []}
    assert registry.entries() == []


def test_two_runs_at_once_share_the_running_file(tmp_path):
    registry = RunningFile(str(tmp_path / "running.json"))
    stop = threading.Event()
    recs = [Recorder(), Recorder()]
    errors: List[BaseException] = []
    threads = []
    for i, rec in enumerate(recs):
        d = tmp_path / ("run%d" % i)
        d.mkdir()
        threads.append(threading.Thread(target=lambda d=d, rec=rec, i=i: _run_catching(
            errors, d, sh("echo \"leader $$\"; sleep 1000"), rec, stop=stop, stop_reason=lambda: "drained",
            registry=registry, record={"job_id": "job-%d" % i, "attempt": 1})))
    for t in threads:
        t.start()
    leaders = [int(wait_for(lambda rec=rec: rec.value("leader"), 15, "a leader's pid")) for rec in recs]
    assert leaders[0] != leaders[1]

    def both() -> Optional[List[Dict[str, Any]]]:
        with open(registry.path) as f:
            runs = json.load(f)["runs"]
        return runs if len(runs) == 2 else None
    runs = wait_for(both, 15, "the running file to list both runs")
    assert sorted((r["job_id"], r["pgid"]) for r in runs) == [("job-0", leaders[0]), ("job-1", leaders[1])]
    assert runs[0]["shim_pid"] != runs[1]["shim_pid"]
    stop.set()
    for t in threads:
        t.join(15)
    assert [type(e) for e in errors] == [Cancelled, Cancelled] and all_gone(leaders)
    assert registry.entries() == []
