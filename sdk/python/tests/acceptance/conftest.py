"""Fixtures of the acceptance scenarios: a fresh kernel per test, the docs/protocol/conformance.md §3
scripted server, and the environment the seed agent reads."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx2
import pytest

from rebuno import Agent
from rebuno.signing import sign_v1

from ..e2e.harness import KernelProcess, Served, register
from .script_server import ScriptServer

SECRET = "acceptance-secret-0123456789"
MODEL = "scripted-model"


@pytest.fixture
def kernel(kernel_proc: KernelProcess) -> KernelProcess:
    """The real kernel of the test, by the name the scenarios use (the unit
    tests' `kernel` is the in-memory fake)."""
    return kernel_proc


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The LocalDirectory root of the test (`REBUNO_LOCAL_RESOURCES`)."""
    return tmp_path / "resources"


@pytest.fixture
async def script(root: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ScriptServer]:
    """The scripted server with the default script, and the environment the
    seed agent reads (`LLM_MODEL`, `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
    `REBUNO_LOCAL_RESOURCES`). Tests may replace `script.script`."""
    server = ScriptServer()
    async with Served(server.app) as served:
        server.url = served.url
        monkeypatch.setenv("LLM_MODEL", MODEL)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", served.url + "/v1")
        monkeypatch.setenv("REBUNO_LOCAL_RESOURCES", str(root))
        yield server


@contextlib.asynccontextmanager
async def serving(kernel: KernelProcess, agent_id: str,
                  process: Callable[..., Awaitable[Any]]) -> AsyncIterator[Agent]:
    """Serve `process` as agent `agent_id` in this process and (re-)register
    the agent with this server's webhook; stopping the server stops the agent."""
    agent = Agent(agent_id, secret=SECRET, base_url=kernel.url)
    agent.bind(process)
    async with Served(agent.app) as served:
        await register(kernel, agent_id, served.url + "/webhook", SECRET)
        yield agent


async def agent_post(kernel: KernelProcess, agent_id: str, path: str, body: dict[str, Any], *,
                     dispatch_id: str, attempt: int) -> tuple[int, str]:
    """One v1-signed agent request for a given dispatch attempt, as a handler
    of that attempt would send it (docs/protocol/auth.md §3)."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/json", "Rebuno-Agent-Id": agent_id, "Rebuno-Timestamp": ts,
               "Rebuno-Dispatch-Id": dispatch_id, "Rebuno-Dispatch-Attempt": str(attempt),
               "Rebuno-Signature": sign_v1(SECRET, "POST", path, ts, dispatch_id, str(attempt), raw)}
    async with httpx2.AsyncClient(base_url=kernel.url) as c:
        r = await c.post(path, content=raw, headers=headers)
    return r.status_code, r.text
