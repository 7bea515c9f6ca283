"""Test-side plumbing of the compatibility suite: the kernel process, agent
processes running the published ``rebuno`` client, the files agents record into,
and small readers of what the kernel exposes over HTTP.

Everything here talks to the real ``rebuno dev`` binary over HTTP; nothing reads
the kernel's database.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2

HERE = Path(__file__).resolve().parent
AGENTS = HERE / "agents"
TERMINAL = ("completed", "failed", "cancelled")

_URL_LINE = re.compile(r"url:\s+(http://\S+)")


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 20.0, what: str = "condition", interval: float = 0.01
) -> Any:
    """Polls ``predicate`` until it returns a truthy value, which is returned;
    fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# The kernel process
# ---------------------------------------------------------------------------


class Kernel:
    """One ``rebuno dev`` process on a fresh SQLite file and a free port."""

    def __init__(self, binary: str, db: Path, *, args: list[str] | None = None, manual_clock: bool = True):
        self.binary = binary
        self.db = db
        self.args = list(args or [])
        self.manual_clock = manual_clock
        self.url = ""
        self._listen = "127.0.0.1:0"
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()
        self.http: httpx2.Client | None = None

    # -- lifecycle --

    def start(self) -> "Kernel":
        env = dict(os.environ)
        env.pop("REBUNO_TEST_CLOCK", None)
        if self.manual_clock:
            env["REBUNO_TEST_CLOCK"] = "manual"
        cmd = [self.binary, "dev", "--db", str(self.db), "--listen-addr", self._listen, "--no-repl", *self.args]
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._proc = proc
        found: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                with self._lines_lock:
                    self._lines.append(line)
                m = _URL_LINE.search(line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(30) or not found:
            self.stop()
            raise RuntimeError(f"kernel did not print its url:\n{self.log()}")
        self.url = found[0]
        # A restart reuses the port, so agents' webhooks and clients stay valid.
        self._listen = self.url.removeprefix("http://")
        if self.http is None:
            self.http = httpx2.Client(base_url=self.url, timeout=30.0)
        wait_until(self._ready, timeout=15, what="GET /v0/ready")
        return self

    def _ready(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"kernel exited:\n{self.log()}")
        try:
            return httpx2.get(self.url + "/v0/ready", timeout=2).status_code == 200
        except httpx2.HTTPError:
            return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop()
        if self.http is not None:
            self.http.close()
            self.http = None

    def log(self) -> str:
        with self._lines_lock:
            return "\n".join(self._lines)

    # -- HTTP --

    def request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        assert self.http is not None
        return self.http.request(method, path, **kwargs)

    def get_json(self, path: str, status: int = 200) -> Any:
        r = self.request("GET", path)
        assert r.status_code == status, f"GET {path}: {r.status_code} {r.text}"
        return r.json()

    def register_agent(
        self, agent_id: str, webhook_url: str, secret: str, lease_timeout_seconds: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": agent_id, "webhook_url": webhook_url, "secret": secret}
        if lease_timeout_seconds is not None:
            body["lease_timeout_seconds"] = lease_timeout_seconds
        r = self.request("POST", "/v0/agents", json=body)
        assert r.status_code == 201, f"register {agent_id}: {r.status_code} {r.text}"
        return r.json()

    def advance(self, seconds: float) -> str:
        """Moves the manual test clock (docs/protocol/configuration.md §4) and returns the kernel's new now."""
        r = self.request("POST", "/v0/test/clock", json={"advance": f"{seconds}s"})
        assert r.status_code == 200, f"advance clock: {r.status_code} {r.text}"
        return r.json()["now"]

    def create_execution(self, agent_id: str, input: Any = None, **fields: Any) -> dict[str, Any]:
        body = {"agent_id": agent_id, **fields}
        if input is not None:
            body["input"] = input
        r = self.request("POST", "/v0/executions", json=body)
        assert r.status_code == 201, f"create: {r.status_code} {r.text}"
        return r.json()

    def execution(self, eid: str) -> dict[str, Any]:
        return self.get_json(f"/v0/executions/{eid}")

    def events(self, eid: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get_json(f"/v0/executions/{eid}/events?after_seq={after}&limit=1000")
            out.extend(page)
            if len(page) < 1000:
                return out
            after = page[-1]["event_seq"]

    def event_types(self, eid: str) -> list[str]:
        return [e["type"] for e in self.events(eid)]

    def steps(self, eid: str, status: str = "") -> list[dict[str, Any]]:
        q = f"?status={status}" if status else ""
        return self.get_json(f"/v0/executions/{eid}/steps{q}")

    def wait_status(self, eid: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        want = statuses or TERMINAL
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.execution(eid)
            return last if last["status"] in want else None

        try:
            return wait_until(check, timeout=timeout, what=f"execution {eid} in {want}")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen {last}") from None

    def wait_event(
        self, eid: str, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 20.0, what: str = "event"
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            for e in self.events(eid):
                if predicate(e):
                    return e
            return None

        return wait_until(check, timeout=timeout, what=what)

    def metrics(self) -> str:
        r = self.request("GET", "/metrics")
        assert r.status_code == 200
        return r.text

    def metric(self, name: str, where: Callable[[dict[str, str]], bool] | None = None, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (and
        satisfy ``where``, when given)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            if all(got.get(k) == v for k, v in labels.items()) and (where is None or where(got)):
                total += float(m.group(4))
        return total


# ---------------------------------------------------------------------------
# Files the agent processes write and the test reads
# ---------------------------------------------------------------------------


class Records:
    """The JSON-lines file every agent process of a test appends to: one line per
    tool/step body run, gate and handler start or exit (see agents/agentkit.py)."""

    def __init__(self, path: Path):
        self.path = path
        path.touch()

    def all(self) -> list[dict[str, Any]]:
        out = []
        for line in self.path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
        return out

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.all() if r["event"] == event]

    def count(self, event: str) -> int:
        return len(self.of(event))

    def wait(self, event: str, n: int = 1, *, timeout: float = 20.0, **match: Any) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            got = [r for r in self.of(event) if all(r.get(k) == v for k, v in match.items())]
            return got if len(got) >= n else None

        try:
            return wait_until(check, timeout=timeout, what=f"{n} record(s) {event!r} {match or ''}")
        except AssertionError as e:
            raise AssertionError(f"{e}; records: {self.all()}") from None


class Gates:
    """A folder of release files: an agent waiting at gate NAME goes on once the
    file NAME exists."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def release(self, name: str) -> None:
        (self.path / name).touch()


# ---------------------------------------------------------------------------
# Agent processes (the published client, unchanged)
# ---------------------------------------------------------------------------


class AgentProcess:
    """One Python process running ``agents/<script>``: a ``rebuno.Agent`` serving its
    webhook with uvicorn through ``Agent.run``. It can be killed with SIGKILL and
    restarted on the same port, so the kernel's registration stays valid."""

    def __init__(
        self,
        *,
        script: str,
        agent_id: str,
        secret: str,
        kernel: Kernel,
        records: Records,
        gates: Gates,
        logdir: Path,
        env: dict[str, str] | None = None,
    ):
        self.script = AGENTS / script
        self.agent_id = agent_id
        self.secret = secret
        self.kernel = kernel
        self.records = records
        self.gates = gates
        self.logdir = logdir
        self.extra_env = dict(env or {})
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.generation = 0
        self.logs: list[Path] = []

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhook"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, port: int | None = None, wait: bool = True) -> "AgentProcess":
        """Starts the process on ``port`` (default: the previous one, else a free one)
        and, unless ``wait`` is false, waits until it serves HTTP (see ``wait_ready``)."""
        if port is not None:
            self.port = port
        if not self.port:
            self.port = free_port()
        self.generation += 1
        log = self.logdir / f"agent-{self.agent_id}-{self.generation}.log"
        self.logs.append(log)
        env = dict(os.environ)
        env.update(
            {
                "REBUNO_URL": self.kernel.url,
                "REBUNO_AGENT_SECRET": self.secret,
                "COMPAT_AGENT_ID": self.agent_id,
                "COMPAT_PORT": str(self.port),
                "COMPAT_RECORD": str(self.records.path),
                "COMPAT_GATES": str(self.gates.path),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(AGENTS),
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> "AgentProcess":
        wait_until(self._serving, timeout=30, what=f"agent {self.agent_id} serving on {self.port}")
        return self

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent process exited with {self.proc.returncode}:\n{self.log()}")
        try:
            # FastAPI serves its schema by default: a cheap readiness probe that
            # goes through the same app and server as the webhook.
            return httpx2.get(f"http://127.0.0.1:{self.port}/openapi.json", timeout=1).status_code == 200
        except httpx2.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no outcome reported, connections just drop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def terminate(self) -> None:
        """Sends SIGTERM (uvicorn's graceful shutdown) without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> "AgentProcess":
        self.kill()
        return self.start()

    def log(self) -> str:
        parts = []
        for p in self.logs:
            if p.exists():
                parts.append(f"--- {p.name} ---\n{p.read_text(errors='replace')}")
        return "\n".join(parts)


# ---------------------------------------------------------------------------
# Step identity (docs/protocol/identity.md), for asserting that the ids the kernel gave are bit-exact
# ---------------------------------------------------------------------------


def _canonical_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20:
            out.append(f"\\u{o:04x}")
        elif ch in "<>&\u2028\u2029":
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical(value: Any) -> bytes:
    """Canonical JSON of docs/protocol/identity.md §2 for values without floats (whose literal text a
    decoded Python value no longer has)."""

    def enc(v: Any) -> str:
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return _canonical_string(v)
        if isinstance(v, list):
            return "[" + ",".join(enc(x) for x in v) + "]"
        if isinstance(v, dict):
            items = sorted(v.items(), key=lambda kv: kv[0].encode("utf-8"))
            return "{" + ",".join(_canonical_string(k) + ":" + enc(x) for k, x in items) + "}"
        raise TypeError(f"canonical: unsupported {type(v).__name__}")

    return enc(value).encode("utf-8")


def args_hash(args: Any) -> str:
    return hashlib.sha256(canonical(args)).hexdigest()


def step_id(execution_id: str, kind: str, target: str, args: Any, occurrence: int = 0) -> str:
    fields = [execution_id, kind, target, args_hash(args), str(occurrence)]
    pre = b"".join(str(len(f.encode())).encode() + b":" + f.encode() for f in fields)
    return hashlib.sha256(pre).hexdigest()


# ---------------------------------------------------------------------------
# The published client's models against raw kernel JSON
# ---------------------------------------------------------------------------


def parse_with_models(kernel: Kernel, eid: str) -> None:
    """Validates the kernel's raw JSON for an execution, its events and its steps
    with the published client's pydantic models, which refuse ``null`` for their
    string, integer and list fields (docs/protocol/conformance.md §2.1 item 4)."""
    from rebuno.types import Event, Execution, Step

    Execution.model_validate(kernel.execution(eid))
    for e in kernel.events(eid):
        Event.model_validate(e)
    for s in kernel.steps(eid):
        Step.model_validate(s)
