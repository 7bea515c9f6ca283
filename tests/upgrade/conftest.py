"""Fixtures of the upgrade suite: the real kernel binary (manual clock), the two
SDKs' interpreters, agent processes on either, and the scripted LLM server.

``REBUNO_BIN`` names the kernel binary built with the ``rebuno_test`` tag (the
Makefile's ``test-upgrade`` sets it); without it the binary is built once per
session. The published client runs from tests/compat/.venv and this project's
SDK from sdk/python/.venv (override with ``REBUNO_UPGRADE_OLD_PYTHON`` and
``REBUNO_UPGRADE_NEW_PYTHON``); the two are never installed together.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_harness import Gates, Kernel, Records, free_port
from scripted_llm import ScriptedLLM
from upgrade_harness import CURRENT, PUBLISHED, PUBLISHED_VERSION, REPO, AgentProc, default_python, probe_sdk


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    # Keeps each phase's report on the item, so that fixtures print the logs
    # of the kernel and the agents when the test failed.
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def pythons() -> dict[str, str]:
    """The interpreter of each SDK, checked: the published one imports exactly
    rebuno 0.29.2, the current one this repository's sdk/python/src."""
    found = {PUBLISHED: default_python(PUBLISHED), CURRENT: default_python(CURRENT)}
    for sdk, python in found.items():
        if not os.access(python, os.X_OK):
            pytest.fail(f"no interpreter for the {sdk} SDK at {python}: run `make test-upgrade`")
    old, new = probe_sdk(found[PUBLISHED]), probe_sdk(found[CURRENT])
    assert old["version"] == PUBLISHED_VERSION, f"{found[PUBLISHED]} imports rebuno {old}"
    assert Path(new["file"]).resolve().is_relative_to(REPO / "sdk/python/src"), (
        f"{found[CURRENT]} imports rebuno from {new['file']}, not this repository's SDK"
    )
    return found


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
def kernel(kernel_binary: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Kernel]:
    """A kernel with the manual test clock (docs/protocol/configuration.md §4) on a fresh database."""
    k = Kernel(kernel_binary, tmp_path / "rebuno.db", manual_clock=True).start()
    yield k
    k.close()
    if _failed(request):
        print(f"===== kernel log ({k.url}) =====\n{k.log()[-20000:]}")


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return Records(tmp_path / "records.jsonl")


@pytest.fixture
def gates(tmp_path: Path) -> Gates:
    return Gates(tmp_path / "gates")


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture
def spawn(
    pythons: dict[str, str],
    kernel: Kernel,
    records: Records,
    gates: Gates,
    llm: ScriptedLLM,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., AgentProc]]:
    """Factory: ``spawn(sdk, agent_id, port=None, register=True)`` starts the
    agent of ``sdk`` (``"published"`` or ``"current"``) and waits until it
    serves; with ``register`` it first registers the agent with the kernel
    (the SDKs publish metadata at start-up, which needs the registration).
    Every process is stopped at the end of the test."""
    procs: list[AgentProc] = []

    def start(sdk: str, agent_id: str, *, port: int | None = None, register: bool = True) -> AgentProc:
        secret = f"upgrade-secret-{agent_id}-0123456789"
        p = AgentProc(
            sdk=sdk,
            python=pythons[sdk],
            agent_id=agent_id,
            secret=secret,
            port=port or free_port(),
            kernel=kernel,
            records=records,
            gates=gates,
            log=tmp_path / f"agent-{len(procs)}-{sdk}.log",
            llm_url=llm.url,
        )
        procs.append(p)
        if register:
            kernel.register_agent(agent_id, p.webhook_url, secret)
        return p.start()

    yield start
    for p in procs:
        p.stop()
    if _failed(request):
        for p in procs:
            print(f"===== {p.sdk} agent (port {p.port}) log =====\n{p.log()[-20000:]}")
        print(f"===== records =====\n{records.path.read_text()}")
