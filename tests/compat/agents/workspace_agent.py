"""Resources and forks with the published client: a framework-free tool loop over
the chat completions wire (through ``rebuno.http_client()``) with two tools over a
``resource("workspace")`` opened on the test tree's directory driver.

``write_file`` declares the workspace (``resources=["workspace"]``), ``read_file``
declares nothing. The loop asks the scripted server for its next move, runs the
tool calls it gets, feeds each result (or the tool error's text) back, and
returns ``{"answer": …}`` when the reply has no tool call.

Configured by the test through the environment (a fork keeps its source's input,
so nothing that must change between processes lives in the input):

- ``COMPAT_RESOURCE_ROOT``: the driver's root (required);
- ``COMPAT_EVERY_STEPS``: absent or ``0`` → no ``CheckpointPolicy``; else
  ``CheckpointPolicy(every_steps=N, on_completion=COMPAT_ON_COMPLETION != "0")``;
- ``COMPAT_COVERAGE_REUSE=1``: the driver's ``coverage_reuse``;
- ``COMPAT_FAIL_CHECKPOINTS=3,5``: the listed ``checkpoint()`` calls of this
  process (counted from 1) raise;
- ``COMPAT_CREATE_UNAVAILABLE=1``: ``create(ref)`` raises ``CheckpointUnavailable``
  without looking, as a provider answering 404 would;
- ``COMPAT_LLM_URL``: the scripted server.

A ``write_file`` of ``slow.txt`` writes, then waits at gate ``slow-<attempt>``.
Every driver call and tool body run is recorded with the execution id.
"""

from __future__ import annotations

import json
import os
import threading
from contextvars import ContextVar
from typing import Any

import rebuno
from openai import AsyncOpenAI
from rebuno import CheckpointPolicy, CheckpointUnavailable, ToolError, execution, resource, tool

from agentkit import gate, make_agent, record, serve
from dirdriver import DirDriver, Workspace

MODEL = "scripted-tools"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a text file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]

_workspace: ContextVar[Workspace] = ContextVar("workspace")


class RecordingDriver(DirDriver):
    """The directory driver, recording each call and failing the ones the test
    asked to fail."""

    def __init__(self) -> None:
        super().__init__(
            os.environ["COMPAT_RESOURCE_ROOT"], coverage_reuse=os.environ.get("COMPAT_COVERAGE_REUSE") == "1"
        )
        fail = os.environ.get("COMPAT_FAIL_CHECKPOINTS", "")
        self._fail = {int(n) for n in fail.split(",") if n}
        self._unavailable = os.environ.get("COMPAT_CREATE_UNAVAILABLE") == "1"

    # Driver methods run in worker threads, into which asyncio.to_thread copies
    # the context: execution() still names the calling execution there.

    def create(self, checkpoint_ref: str | None = None) -> tuple[Workspace, dict[str, Any]]:
        eid = execution().id
        if checkpoint_ref is not None and self._unavailable:
            record("driver:create", eid=eid, ref=checkpoint_ref, outcome="unavailable")
            raise CheckpointUnavailable(f"checkpoint {checkpoint_ref} not found (404)")
        try:
            handle, binding = super().create(checkpoint_ref)
        except CheckpointUnavailable as e:
            record("driver:create", eid=eid, ref=checkpoint_ref, outcome="unavailable", error=str(e))
            raise
        record("driver:create", eid=eid, ref=checkpoint_ref, outcome="created", path=binding["path"])
        return handle, binding

    def open(self, binding: dict[str, Any]) -> Workspace:
        record("driver:open", eid=execution().id, path=binding["path"])
        return super().open(binding)

    def checkpoint(self, handle: Workspace) -> str:
        n = _count_checkpoint()
        if n in self._fail:
            record("driver:checkpoint", eid=execution().id, n=n, outcome="failed")
            raise OSError(f"snapshot quota exceeded (call {n})")
        ref = super().checkpoint(handle)
        record("driver:checkpoint", eid=execution().id, n=n, outcome="captured", ref=ref, files=handle.files())
        return ref


_calls_lock = threading.Lock()
_calls = [0]


def _count_checkpoint() -> int:
    with _calls_lock:
        _calls[0] += 1
        return _calls[0]


def _policy() -> CheckpointPolicy | None:
    n = int(os.environ.get("COMPAT_EVERY_STEPS") or 0)
    if n == 0:
        return None
    return CheckpointPolicy(every_steps=n, on_completion=os.environ.get("COMPAT_ON_COMPLETION", "1") != "0")


@tool(resources=["workspace"])
async def write_file(path: str, content: str) -> str:
    record("tool:write_file", eid=execution().id, path=path, content=content)
    _workspace.get().write(path, content)
    if path == "slow.txt":
        await gate(f"slow-{execution().dispatch_attempt}")
    return f"wrote {path}"


@tool
async def read_file(path: str) -> str:
    record("tool:read_file", eid=execution().id, path=path)
    return _workspace.get().read(path)


TOOL_FUNCS = {"write_file": write_file, "read_file": read_file}


async def handler(task: str) -> dict:
    policy = _policy()
    record(
        "resource:policy",
        eid=execution().id,
        every_steps=policy.every_steps if policy else None,
        on_completion=policy.on_completion if policy else None,
    )
    ws = await resource("workspace", driver=RecordingDriver(), checkpoints=policy)
    _workspace.set(ws)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    async with rebuno.http_client() as http:
        llm = AsyncOpenAI(base_url=os.environ["COMPAT_LLM_URL"], api_key="sk-compat", http_client=http, max_retries=0)
        for _ in range(40):
            reply = await llm.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            msg = reply.choices[0].message
            if not msg.tool_calls:
                return {"answer": msg.content}
            messages.append(
                {
                    "role": "assistant",
                    "content": msg.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in msg.tool_calls
                    ],
                }
            )
            for call in msg.tool_calls:
                args = json.loads(call.function.arguments)
                try:
                    result = await TOOL_FUNCS[call.function.name](**args)
                except ToolError as e:
                    result = f"error: {e}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise RuntimeError("the script never answered")


if __name__ == "__main__":
    serve(make_agent(description="workspace agent: a tool loop over a directory resource"), handler)
