"""Fixtures of the compatibility suite: the real kernel binary, agent processes
running the published ``rebuno`` 0.29.2 client, and the scripted LLM server.

``REBUNO_BIN`` names the kernel binary built with the ``rebuno_test`` tag (the
Makefile's ``test-compat`` sets it); without it the binary is built once per
session with ``go build -tags rebuno_test``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_harness import AgentProcess, Gates, Kernel, Records, free_port
from scripted_llm import ScriptedLLM

REPO = Path(__file__).resolve().parents[2]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    # Keeps each phase's report on the item, so fixtures can print the kernel's
    # and the agents' logs when the test itself failed.
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def kernel_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    b = os.environ.get("REBUNO_BIN")
    if b:
        if not os.access(b, os.X_OK):
            pytest.fail(f"REBUNO_BIN={b} is not an executable")
        return b
    out = tmp_path_factory.mktemp("bin") / "rebuno-test"
    subprocess.run(["go", "build", "-tags", "rebuno_test", "-o", str(out), "./cmd/rebuno"], cwd=REPO, check=True)
    return str(out)


@pytest.fixture
def start_kernel(kernel_binary: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Kernel]]:
    """Factory: ``start_kernel(args=[...], manual_clock=True)`` starts a kernel on
    a fresh database file; every kernel is stopped at the end of the test."""
    started: list[Kernel] = []

    def start(*, args: list[str] | None = None, manual_clock: bool = True) -> Kernel:
        db = tmp_path / f"kernel-{len(started)}" / "rebuno.db"
        db.parent.mkdir()
        k = Kernel(kernel_binary, db, args=args, manual_clock=manual_clock)
        started.append(k)
        return k.start()

    yield start
    failed = _failed(request)
    for k in started:
        k.close()
        if failed:
            print(f"===== kernel log ({k.url}) =====\n{k.log()[-20000:]}")


@pytest.fixture
def kernel(start_kernel: Callable[..., Kernel], request: pytest.FixtureRequest) -> Kernel:
    """A kernel with the manual test clock (docs/protocol/configuration.md §4); extra flags come from the
    test's ``@pytest.mark.kernel_args(...)``."""
    marker = request.node.get_closest_marker("kernel_args")
    return start_kernel(args=list(marker.args) if marker else None)


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return Records(tmp_path / "records.jsonl")


@pytest.fixture
def gates(tmp_path: Path) -> Gates:
    return Gates(tmp_path / "gates")


@pytest.fixture
def spawn_agent(
    kernel: Kernel, records: Records, gates: Gates, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., AgentProcess]]:
    """Factory: ``spawn_agent(script, agent_id, lease_timeout_seconds=None,
    env=None, register=True, wait=True)`` registers the agent over the admin API
    (before the process starts, so its start-up metadata publish is accepted) and
    starts the process; with ``wait=False`` the caller waits with ``wait_ready()``
    (to start several processes at once). All processes are stopped at the end
    of the test."""
    procs: list[AgentProcess] = []

    def spawn(
        script: str,
        agent_id: str,
        *,
        lease_timeout_seconds: int | None = None,
        env: dict[str, str] | None = None,
        register: bool = True,
        secret: str | None = None,
        wait: bool = True,
    ) -> AgentProcess:
        p = AgentProcess(
            script=script,
            agent_id=agent_id,
            secret=secret or f"compat-secret-{agent_id}-0123456789",
            kernel=kernel,
            records=records,
            gates=gates,
            logdir=tmp_path,
            env=env,
        )
        procs.append(p)
        p.port = free_port()
        if register:
            kernel.register_agent(agent_id, p.webhook_url, p.secret, lease_timeout_seconds)
        return p.start(wait=wait)

    yield spawn
    failed = _failed(request)
    for p in procs:
        p.terminate()
    for p in procs:
        p.stop()
        if failed:
            print(f"===== agent {p.agent_id} log =====\n{p.log()[-20000:]}")
    if failed:
        print(f"===== records =====\n{records.path.read_text()}")


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    yield server
    server.stop()
