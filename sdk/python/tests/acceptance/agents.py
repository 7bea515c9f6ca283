"""Agents of the acceptance scenarios (docs/protocol/conformance.md §3).

* `load_seed()`: the seed's LangChain docs agent, `examples/python/resources/agent_local.py`;
* `loop_agent(...)`: scenario 1b — the same two tools under a framework-free
  loop over the chat completions wire through `rebuno.http_client()`. Unlike
  LangChain's default tool node, the loop hands a tool's error to the model
  as the tool result, as hand-written loops usually do;
* `FailingCapture`: a wrapping driver whose chosen `checkpoint()` calls fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Awaitable, Callable

from rebuno import CheckpointPolicy, ToolError, http_client, resource, tool
from rebuno.drivers import LocalDirectory

REPO_ROOT = Path(__file__).resolve().parents[4]
SEED_AGENT = REPO_ROOT / "examples" / "python" / "resources" / "agent_local.py"

TOOLS_SCHEMA = [
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file in the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


def load_seed() -> ModuleType:
    spec = importlib.util.spec_from_file_location("acceptance_agent_local", SEED_AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FailingCapture:
    """Wraps a driver; the `checkpoint()` calls whose 1-based numbers are in
    `fail` raise. Everything else is delegated, identity included."""

    def __init__(self, inner: Any, fail: set[int]) -> None:
        self.inner = inner
        self.fail = fail
        self.calls = 0
        self.driver_id = inner.driver_id
        self.configuration = inner.configuration
        self.coverage_reuse = inner.coverage_reuse

    async def create(self, checkpoint_ref: str | None = None) -> Any:
        if checkpoint_ref is None:
            return await self.inner.create()
        return await self.inner.create(checkpoint_ref)

    async def open(self, binding: Any) -> Any:
        return await self.inner.open(binding)

    async def checkpoint(self, handle: Any) -> str:
        self.calls += 1
        if self.calls in self.fail:
            raise RuntimeError(f"snapshot quota exceeded (capture {self.calls})")
        ref: str = await self.inner.checkpoint(handle)
        return ref


def loop_agent(*, every_steps: int = 5, driver: Callable[[], Any] | None = None,
               tool_results: list[tuple[str, str]] | None = None) -> Callable[[str], Awaitable[dict[str, Any]]]:
    """The framework-free agent. `driver()` builds the driver on each
    dispatch (default `LocalDirectory()`, rooted by `REBUNO_LOCAL_RESOURCES`);
    `tool_results` collects (tool, text handed to the model) of every call."""

    async def process(task: str) -> dict[str, Any]:
        workspace = await resource("workspace", driver=driver() if driver else LocalDirectory(),
                                   checkpoints=CheckpointPolicy(every_steps=every_steps))

        @tool("write_file", resources=["workspace"])
        async def write_file(path: str, content: str) -> str:
            """Write a file in the workspace."""
            await workspace.files.write(path, content)
            return f"wrote {path}"

        @tool("read_file")
        async def read_file(path: str) -> str:
            """Read a file from the workspace."""
            return str(await workspace.files.read(path))

        tools: dict[str, Callable[..., Awaitable[str]]] = {"write_file": write_file, "read_file": read_file}
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        async with http_client(base_url=os.environ["OPENAI_BASE_URL"]) as llm:
            for _ in range(40):
                resp = await llm.post("/chat/completions", json={
                    "model": os.environ["LLM_MODEL"], "messages": messages, "tools": TOOLS_SCHEMA})
                resp.raise_for_status()
                message = resp.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    return {"answer": message["content"]}
                for call in calls:
                    name = call["function"]["name"]
                    try:
                        text = await tools[name](**json.loads(call["function"]["arguments"]))
                    except ToolError as e:
                        text = f"error: {e.message}"
                    if tool_results is not None:
                        tool_results.append((name, text))
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        raise RuntimeError("the model never answered")

    return process
