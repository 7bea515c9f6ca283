"""Test-side plumbing of the upgrade suite: agent processes on either SDK, each
run by its own virtualenv's python, and a readable account of how an upgraded
run diverged from the history the published client recorded.

The kernel process, the record and gate files and the small HTTP readers come
from tests/compat/kernel_harness.py (on the path through pytest.ini); this file
adds only what needs two interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx2

from kernel_harness import Gates, Kernel, Records, wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AGENTS = HERE / "agents"

PUBLISHED = "published"
CURRENT = "current"
SCRIPTS = {PUBLISHED: "published_agent.py", CURRENT: "current_agent.py"}
PUBLISHED_VERSION = "0.29.2"

def default_python(sdk: str) -> str:
    """The interpreter of each SDK's virtualenv: ``REBUNO_UPGRADE_OLD_PYTHON`` /
    ``REBUNO_UPGRADE_NEW_PYTHON``, else the venvs the Makefile installs."""
    if sdk == PUBLISHED:
        return os.environ.get("REBUNO_UPGRADE_OLD_PYTHON") or str(REPO / "tests/compat/.venv/bin/python")
    return os.environ.get("REBUNO_UPGRADE_NEW_PYTHON") or str(REPO / "sdk/python/.venv/bin/python")

def probe_sdk(python: str) -> dict[str, str]:
    """The ``rebuno`` distribution an interpreter imports: its version and the
    file it is loaded from."""
    code = (
        "import importlib.metadata as m, json, rebuno;"
        "print(json.dumps({'version': m.version('rebuno'), 'file': rebuno.__file__}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, env=_clean_env())
    if out.returncode != 0:
        raise RuntimeError(f"{python} cannot import rebuno:\n{out.stderr}")
    return json.loads(out.stdout)

def _clean_env() -> dict[str, str]:
    # Each agent gets exactly its own venv: nothing inherited from the test
    # process's interpreter may leak into its module search path.
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env

class AgentProc:
    """One agent process: ``agents/<script>`` run by ``python``, serving its
    webhook on ``port``. It can be killed with SIGKILL; the next process may
    take the same port, so the kernel's registration stays valid."""

    def __init__(
        self,
        *,
        sdk: str,
        python: str,
        agent_id: str,
        secret: str,
        port: int,
        kernel: Kernel,
        records: Records,
        gates: Gates,
        log: Path,
        llm_url: str,
    ):
        self.sdk = sdk
        self.python = python
        self.agent_id = agent_id
        self.secret = secret
        self.port = port
        self.kernel = kernel
        self.records = records
        self.gates = gates
        self.log_path = log
        self.llm_url = llm_url
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhook"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> "AgentProc":
        env = _clean_env()
        env.update(
            {
                "REBUNO_URL": self.kernel.url,
                "REBUNO_AGENT_SECRET": self.secret,
                "UPGRADE_AGENT_ID": self.agent_id,
                "UPGRADE_PORT": str(self.port),
                "UPGRADE_RECORD": str(self.records.path),
                "UPGRADE_GATES": str(self.gates.path),
                "UPGRADE_LLM_URL": self.llm_url,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [self.python, str(AGENTS / SCRIPTS[self.sdk])],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(AGENTS),
            )
        wait_until(self._serving, timeout=60, what=f"{self.sdk} agent serving on port {self.port}")
        return self

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.sdk} agent exited with {self.proc.returncode}:\n{self.log()}")
        try:
            # Both SDKs refuse an unsigned webhook with 401: the probe goes
            # through the very route the kernel will call, and starts nothing.
            r = httpx2.post(self.webhook_url, content=b"{}", timeout=1)
        except httpx2.HTTPError:
            return False
        return r.status_code == 401

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no outcome reported, connections just drop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (uvicorn's graceful shutdown), then SIGKILL after 10 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

def args_text(args: Any) -> str:
    """A stable text of decoded args for comparing and showing them (sorted
    keys; ``1.0`` and ``1`` stay different)."""
    return json.dumps(args, sort_keys=True, ensure_ascii=False)

def divergence(recorded: list[dict[str, Any]], after: list[dict[str, Any]], execution: dict[str, Any]) -> str:
    """What the upgraded run did that the published client's history did not
    foresee: steps proposed anew (an identity the kernel had not seen, shown
    beside the recorded step of the same kind and target) and the outcome."""
    known = {s["step_id"] for s in recorded}
    lines = [f"execution {execution.get('status')}: failure_reason={execution.get('failure_reason')!r}"]
    for s in after:
        if s["step_id"] in known:
            continue
        twins = [r for r in recorded if r["kind"] == s["kind"] and r["target"] == s["target"]]
        lines.append(
            f"  NEW STEP {s['kind']} {s['target']!r} ({s['status']}): this SDK sent args {args_text(s['args'])}"
        )
        for r in twins:
            lines.append(f"      rebuno {PUBLISHED_VERSION} recorded args {args_text(r['args'])} (step {r['step_id'][:12]})")
        if not twins:
            lines.append(f"      rebuno {PUBLISHED_VERSION} recorded no {s['kind']} step named {s['target']!r}")
    return "\n".join(lines)

class Incompatible(AssertionError):
    """The new SDK did not continue the published client's history, or the
    two SDKs put different steps on the wire."""
