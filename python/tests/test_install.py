"""The README's install recipe, run as written: a fresh venv over Debian's packages, no package index.

The block after README.md's `<!-- install-recipe -->` marker runs line for
line from a copy of the repository's python/ directory, without a package
index (PIP_NO_INDEX, and an index URL nothing listens on) and, where
`unshare -rn` works, without any network. Its `apt-get install` line is not
run (that needs root and an archive): the packages it names must be
installed instead. Then the venv's python must import the installed copy,
with its py.typed, once the source is gone. And the README's Worker options
table must have a row for every keyword a Worker takes.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
from typing import Dict, List, Optional

import pytest

import nodelane

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "python", "README.md")
MARKER = "<!-- install-recipe"
#: A port nothing listens on: an index asked for anyway is refused at once.
CLOSED_INDEX = "http://127.0.0.1:9/simple/"
#: How long one step of the recipe may take (it takes seconds).
STEP_TIMEOUT = 300


def recipe() -> List[str]:
    """The lines of README.md's install block: the ```sh block right after the one install-recipe marker."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    assert len(marks) == 1, "README.md has %d %r markers, not one" % (len(marks), MARKER)
    start = marks[0] + 1
    assert start < len(lines) and lines[start] == "```sh", "the install-recipe marker is not followed by ```sh"
    try:
        end = lines.index("```", start + 1)
    except ValueError:
        raise AssertionError("the install block is not closed") from None
    block = lines[start + 1:end]
    assert any(line.strip() for line in block), "the install block is empty"
    return block


def apt_packages(line: str) -> Optional[List[str]]:
    """The packages of an `apt-get install` line (sudo or not), or None for any other line."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["sudo"]:
        words = words[1:]
    if words[:2] != ["apt-get", "install"]:
        return None
    return [w for w in words[2:] if not w.startswith("-")]


def not_installed(packages: List[str]) -> List[str]:
    """Those of the Debian packages that dpkg does not have installed."""
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", p], capture_output=True, text=True)
        if r.returncode != 0 or r.stdout.strip() != "install ok installed":
            missing.append(p)
    return missing


def need(what: str) -> None:
    """Skip for want of what, or, under CI, fail: CI installs it (.ci/run)."""
    if os.environ.get("CI"):
        pytest.fail(what)
    pytest.skip(what)


def no_network() -> List[str]:
    """The prefix that runs a command without a network (unshare -rn), or [] where it does not work here."""
    try:
        ok = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ["unshare", "-rn"] if ok else []


def offline_env(home: str) -> Dict[str, str]:
    """A fresh box's environment that keeps pip off every index and away from the caller's pip settings."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home,
            "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_INDEX_URL": CLOSED_INDEX,
            "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def copy_sources(root: str) -> None:
    """Copy the repository's python/ directory into root, without what a build or a test run left."""
    shutil.copytree(os.path.join(REPO, "python"), os.path.join(root, "python"),
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build", "*.egg-info", ".venv"))


def run(argv: List[str], cwd: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    """Run argv to its end and keep its output (stderr folded into stdout)."""
    return subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=STEP_TIMEOUT)


#: Run by the installed venv's python, from a directory without the sources: where nodelane comes from.
WHERE = """
import importlib.resources, json, sysconfig
import nodelane
print(json.dumps({"file": nodelane.__file__, "purelib": sysconfig.get_paths()["purelib"],
                  "typed": importlib.resources.files("nodelane").joinpath("py.typed").is_file(),
                  "worker": nodelane.Worker.__module__}))
"""


def test_readme_install_recipe_runs_offline(tmp_path) -> None:
    """The README's install block, as written, installs nodelane with py.typed into a fresh venv offline."""
    block = recipe()
    packages = [p for line in block for p in apt_packages(line) or []]
    assert packages, "the install block names no Debian package (an apt-get install line)"
    missing = not_installed(packages) if shutil.which("dpkg-query") else packages
    if missing:
        need("the install recipe's Debian packages are not installed: apt-get install " + " ".join(missing))
    # Every line as written, in one shell that stops at the first failure; the apt-get lines were checked above.
    script = "\n".join(":" if apt_packages(line) is not None else line for line in block)
    root = str(tmp_path / "repo")
    os.makedirs(root)
    copy_sources(root)
    env = offline_env(str(tmp_path / "home"))
    r = run(no_network() + ["/bin/sh", "-ex", "-c", script], root, env)
    assert r.returncode == 0, "the README's install recipe failed (exit %d):\n%s" % (r.returncode, r.stdout)
    assert "ok §4.7 signing-key" in r.stdout, r.stdout

    # The installed copy stands alone: the sources are gone, and nothing is imported from them.
    shutil.rmtree(os.path.join(root, "python"))
    venv_python = os.path.join(root, ".venv", "bin", "python")
    r = run([venv_python, "-c", WHERE], root, env)
    assert r.returncode == 0, r.stdout
    got = json.loads(r.stdout.strip().splitlines()[-1])
    pkg = os.path.join(got["purelib"], "nodelane")
    assert got["purelib"].startswith(os.path.join(root, ".venv") + os.sep), got
    assert os.path.dirname(got["file"]) == pkg, got
    assert got["typed"] and os.path.isfile(os.path.join(pkg, "py.typed")), got
    assert got["worker"] == "nodelane.worker", got
    r = run([os.path.join(root, ".venv", "bin", "nodelane-worker"), "vectors"], root, env)
    assert r.returncode == 0 and "ok §10.3 checkpoint-keys" in r.stdout, r.stdout


def test_readme_install_without_wheel_names_it(tmp_path) -> None:
    """The recipe's pip line, in a venv that sees no python3-wheel, fails saying wheel is missing."""
    pip_lines = [line for line in recipe() if " install " in line and "/pip " in line]
    assert len(pip_lines) == 1, "the install block has %d pip install lines, not one" % len(pip_lines)
    root = str(tmp_path / "repo")
    os.makedirs(root)
    copy_sources(root)
    env = offline_env(str(tmp_path / "home"))
    # A venv without --system-site-packages: its pip and setuptools, but neither wheel nor cryptography.
    r = run(["/usr/bin/python3", "-m", "venv", ".venv"], root, env)
    if r.returncode != 0:
        need("/usr/bin/python3 -m venv does not work here (python3-venv):\n" + r.stdout)
    r = run(no_network() + ["/bin/sh", "-c", pip_lines[0]], root, env)
    assert r.returncode != 0, "pip installed without wheel:\n" + r.stdout
    assert "missing: 'wheel'" in r.stdout, r.stdout


def test_readme_documents_every_worker_option() -> None:
    """README's Worker options table has a row for every keyword of Worker and of the Client it passes on."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## Worker options\n")
    section = text[start:text.index("\n## ", start + 1)]
    rows = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    worker = [p for p in inspect.signature(nodelane.Worker.__init__).parameters.values()
              if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    # The Client's base_url and identity are the Worker's url and identity; its logger cannot be passed through.
    client = [p for p in inspect.signature(nodelane.Client.__init__).parameters
              if p not in ("self", "base_url", "identity", "logger")]
    missing = [p.name for p in worker if p.name not in rows] + [p for p in client if p not in rows]
    assert not missing, "README.md's Worker options table lacks " + ", ".join(missing)
