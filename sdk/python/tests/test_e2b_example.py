"""The seed's E2B driver (`examples/python/resources/workspace_resource.py`), unchanged,
runs with `resource()`: here against a stand-in `e2b` module and the in-memory
kernel. The real E2B run needs `E2B_API_KEY` and is not part of this suite."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rebuno import CheckpointPolicy, resource, tool

from .resource_fakes import ResourceKernel, run_handler

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "resources" / "workspace_resource.py"


class _Files:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    async def write(self, path: str, content: str) -> None:
        self.data[path] = content

    async def read(self, path: str) -> str:
        return self.data[path]


class _Sandbox:
    """A stand-in for `e2b.AsyncSandbox` that records what the driver asks."""

    calls: list[tuple[Any, ...]] = []
    live: dict[str, _Sandbox] = {}
    _ids = itertools.count(1)

    def __init__(self, sandbox_id: str, files: _Files) -> None:
        self.sandbox_id = sandbox_id
        self.files = files

    @classmethod
    async def create(cls, template: Any = None, *, timeout: int) -> _Sandbox:
        cls.calls.append(("create", template, timeout))
        sb = cls(f"sbx-{next(cls._ids)}", _Files())
        cls.live[sb.sandbox_id] = sb
        return sb

    @classmethod
    async def connect(cls, sandbox_id: str, *, timeout: int) -> _Sandbox:
        cls.calls.append(("connect", sandbox_id, timeout))
        return cls(sandbox_id, cls.live[sandbox_id].files)

    async def create_snapshot(self) -> Any:
        self.calls.append(("snapshot", self.sandbox_id))
        return types.SimpleNamespace(snapshot_id=f"snap-{len(self.calls)}")


@pytest.fixture
def e2b_example(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = types.ModuleType("e2b")
    fake.AsyncSandbox = _Sandbox  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "e2b", fake)
    _Sandbox.calls, _Sandbox.live = [], {}
    spec = importlib.util.spec_from_file_location("workspace_resource", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_seed_e2b_driver_runs_with_resource(e2b_example: Any) -> None:
    rk = ResourceKernel()

    async def body() -> Any:
        workspace = await resource("workspace", driver=e2b_example.E2BResource(timeout=600),
                                   checkpoints=CheckpointPolicy(every_steps=5))

        @tool("write_file", resources=["workspace"])
        async def write_file(path: str, content: str) -> str:
            await workspace.files.write(path, content)
            return f"wrote {path}"

        @tool("read_file")
        async def read_file(path: str) -> str:
            return str(await workspace.files.read(path))

        await write_file("a.txt", "1")
        return await read_file("a.txt")

    assert await run_handler(rk, body) == ("ok", "1")
    assert rk.bodies("/resources")[0] == {"key": "workspace", "driver_id": "example.e2b.v1",
                                          "configuration": {"timeout": 600}, "coverage_reuse": False,
                                          "every_steps": 5, "on_completion": True}
    assert rk.bodies("/resources/workspace/binding") == [{"binding": {"sandbox_id": "sbx-1"}}]
    # create(None) from the initial environment; a baseline and a completion
    # snapshot, each reconnecting the same sandbox.
    assert _Sandbox.calls == [("create", None, 600), ("snapshot", "sbx-1"), ("connect", "sbx-1", 600),
                              ("snapshot", "sbx-1"), ("connect", "sbx-1", 600)]
    assert [e[3] for e in rk.checkpointed()] == ["snap-2", "snap-4"]
