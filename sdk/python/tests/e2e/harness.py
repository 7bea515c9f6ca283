"""End-to-end harness: the real `rebuno` binary, agents served by uvicorn
(in this process or in a child process that can be killed with SIGKILL), and
helpers that wait for conditions with a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx2
import uvicorn

from rebuno import Agent, Client

SDK_DIR = Path(__file__).resolve().parents[2]
REPO_ROOT = SDK_DIR.parents[1]
HERE = Path(__file__).resolve().parent

_built: str | None = None


def kernel_binary() -> str:
    """`$REBUNO_BIN` (the Makefile builds `bin/rebuno-test`), else a test
    build made once per session with the `rebuno_test` tag."""
    global _built
    env = os.environ.get("REBUNO_BIN")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"REBUNO_BIN={env} does not exist")
        return env
    if _built is None:
        out = os.path.join(tempfile.mkdtemp(prefix="rebuno-sdk-bin-"), "rebuno-test")
        subprocess.run(["go", "build", "-tags", "rebuno_test", "-o", out, "./cmd/rebuno"], cwd=REPO_ROOT,
                       check=True, capture_output=True)
        _built = out
    return _built


_URL = re.compile(r"url:\s+(http://\S+)")


class KernelProcess:
    """One `rebuno dev` process on a fresh SQLite file, with the manual clock."""

    def __init__(self, workdir: Path, *, args: list[str] | None = None, manual_clock: bool = True) -> None:
        self.db = str(workdir / "rebuno.db")
        self.args = args or []
        self.manual_clock = manual_clock
        self.listen = "127.0.0.1:0"
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: list[str] = []

    def start(self) -> None:
        env = dict(os.environ)
        env.pop("REBUNO_BEARER_TOKEN", None)
        if self.manual_clock:
            env["REBUNO_TEST_CLOCK"] = "manual"
        cmd = [kernel_binary(), "dev", "--db", self.db, "--listen-addr", self.listen, "--no-repl", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        found: list[str] = []
        ready = threading.Event()

        def pump(stream: Any) -> None:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace")
                self._log.append(line)
                m = _URL.search(line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, args=(self.proc.stderr,), daemon=True).start()
        if not ready.wait(30) or not found:
            raise RuntimeError("kernel did not start:\n" + self.log())
        self.url = found[0]
        self.listen = self.url.removeprefix("http://")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx2.get(self.url + "/v0/ready", timeout=2).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.01)
        raise RuntimeError("kernel not ready:\n" + self.log())

    def log(self) -> str:
        return "".join(self._log)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same database and port."""
        self.stop()
        self.start()

    def client(self) -> Client:
        return Client(self.url)

    async def advance(self, seconds: float) -> None:
        """Move the kernel's manual clock (docs/protocol/configuration.md §4)."""
        async with httpx2.AsyncClient() as c:
            r = await c.post(self.url + "/v0/test/clock", json={"advance": f"{seconds}s"})
            r.raise_for_status()


async def eventually(cond: Callable[[], Any] | Callable[[], Awaitable[Any]], *, timeout: float = 20.0,
                     what: str = "condition") -> Any:
    """Poll `cond` until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.02)


class Served:
    """An ASGI app served by uvicorn inside this test's event loop."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on"))
        self.task: asyncio.Task[None] | None = None
        self.url = ""

    async def __aenter__(self) -> Served:
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self.task = asyncio.create_task(self.server.serve())
        await eventually(lambda: self.server.started or self.task.done(), what="uvicorn start")  # type: ignore[union-attr]
        if not self.server.started:
            raise RuntimeError("server did not start")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


async def register(kernel: KernelProcess, agent_id: str, url: str, secret: str, **kw: Any) -> None:
    async with kernel.client() as c:
        await c.register_agent(agent_id, url, secret, **kw)


class ChildAgent:
    """An agent script (`python SCRIPT ARGS...`) in a child process, so that it
    can be killed with SIGKILL. It reaches the kernel through `REBUNO_URL`,
    `REBUNO_AGENT_SECRET` and `AGENT_ID`, and prints `PORT <n>` once serving
    (see `child.serve`)."""

    def __init__(self, script: Path, kernel: KernelProcess, agent_id: str, secret: str, *,
                 args: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        full = dict(os.environ)
        full.update({"REBUNO_URL": kernel.url, "REBUNO_AGENT_SECRET": secret, "AGENT_ID": agent_id,
                     "PYTHONPATH": str(SDK_DIR), "PYTHONUNBUFFERED": "1"})
        full.update(env or {})
        self.proc = subprocess.Popen([sys.executable, str(script), *(args or [])], env=full,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(SDK_DIR))
        self.output: list[str] = []
        self.port: int | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.output.append(line)
            if line.startswith("PORT ") and self.port is None:
                self.port = int(line.split()[1])
                self._ready.set()
        self._ready.set()

    async def webhook(self) -> str:
        """The webhook URL, once the agent serves."""
        await eventually(self._ready.is_set, timeout=60, what="agent process start")
        if self.port is None:
            raise RuntimeError("agent process failed:\n" + "".join(self.output))
        return f"http://127.0.0.1:{self.port}/webhook"

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing reported."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def agent_process(scenario: str, kernel: KernelProcess, agent_id: str, secret: str, markers: Path,
                  env: dict[str, str] | None = None) -> ChildAgent:
    """`agent_app.py SCENARIO` in a child process."""
    return ChildAgent(HERE / "agent_app.py", kernel, agent_id, secret, args=[scenario],
                      env={"MARKERS": str(markers), **(env or {})})


def files_of(path: str | os.PathLike[str]) -> dict[str, str]:
    """A directory's regular files, relative path -> text."""
    out = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, path)] = Path(full).read_text()
    return out


def markers(path: Path) -> list[str]:
    """Lines the agent processes appended to the marker file (one per body run)."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def count(path: Path, name: str) -> int:
    return markers(path).count(name)


def serve_agent(agent: Agent) -> Served:
    return Served(agent.app)
