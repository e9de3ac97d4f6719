"""Fixtures: the real example server, built once per session and run on SQLite."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/: the nodelane package from the source tree
sys.path.insert(0, HERE)

from serverproc import ServerProcess, build_server  # noqa: E402

import nodelane  # noqa: E402


@pytest.fixture(scope="session")
def server_binary() -> Iterator[str]:
    """./cmd/server, built with go build into a temporary directory."""
    tmp = tempfile.mkdtemp(prefix="nodelane-build-")
    try:
        yield build_server(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def start_server(server_binary: str) -> Iterator[Callable[..., ServerProcess]]:
    """A factory of servers with extra flags; every server it started is stopped at the end."""
    started: List[ServerProcess] = []

    def start(*extra: str) -> ServerProcess:
        s = ServerProcess(server_binary, list(extra))
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """The shared server. Its envelope is active, so that every job type is leased."""
    s = start_server()
    op = nodelane.Operator(s.url, s.operator_token)
    nodelane.client.expect(op.post("/operator/envelope/activate", {"reason": "python sdk tests"}),
                           "/operator/envelope/activate", 200)
    return s


@pytest.fixture
def operator(server: ServerProcess) -> nodelane.Operator:
    """An Operator of the shared server."""
    return nodelane.Operator(server.url, server.operator_token)
