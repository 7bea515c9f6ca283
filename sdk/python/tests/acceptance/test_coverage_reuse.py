"""Scenario 7 of docs/protocol/conformance.md §3: coverage_reuse on and off,
Example C (every_steps=1): read_file, write_file [ws], a local step "lint",
an LLM call, complete.

* On: the read, the local step and the LLM call leave the ranges unbroken;
  only the write's start ends coverage, and its capture covers to the end, so
  there is no completion capture.
* Off: every start, the LLM call included, ends coverage; a completion
  capture (generation 4) is recorded before the execution completes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rebuno import CheckpointPolicy, http_client, resource, step, tool
from rebuno.drivers import LocalDirectory

from ..e2e.harness import KernelProcess, files_of
from .conftest import MODEL, serving
from .forking import read_coverage
from .oracle import Oracle, assert_kernel_matches, contents_at, writes
from .script_server import ScriptServer

AGENT = "reuser"
KEY = "workspace"


async def example_c(reuse: bool) -> dict[str, Any]:
    ws = await resource(KEY, driver=LocalDirectory(coverage_reuse=reuse), checkpoints=CheckpointPolicy(every_steps=1))

    @tool("read_file")
    async def read_file(path: str) -> str:
        """Read a file from the workspace."""
        try:
            return str(await ws.files.read(path))
        except FileNotFoundError:
            return "<missing>"

    @tool("write_file", resources=[KEY])
    async def write_file(path: str, content: str) -> str:
        """Write a file in the workspace."""
        await ws.files.write(path, content)
        return f"wrote {path}"

    before = await read_file("a.txt")
    wrote = await write_file("a.txt", "1")
    lint = await step("lint", lambda: "clean")
    async with http_client(base_url=os.environ["OPENAI_BASE_URL"]) as llm:
        resp = await llm.post("/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": "done?"}]})
    return {"read": before, "write": wrote, "lint": lint, "llm": resp.status_code}


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse-on", "reuse-off"])
async def test_example_c(kernel: KernelProcess, script: ScriptServer, root: Path, reuse: bool) -> None:
    async with serving(kernel, AGENT, example_c), kernel.client() as client:
        ex = await client.create(AGENT, {"reuse": reuse})
        done = await client.wait(ex.id, timeout=30)
        assert (done.status, done.output) == (
            "completed", {"read": "<missing>", "write": "wrote a.txt", "lint": "clean", "llm": 200}), done
        events = await client.all_events(ex.id)
        steps = await client.steps(ex.id)
        ranges, points = await read_coverage(client, ex.id, events[-1].event_seq)

    o = Oracle(events)
    assert [(x.step_type, x.target) for x in o.starts] == [
        ("tool_call", "read_file"), ("tool_call", "write_file"), ("local", "lint"), ("llm_call", MODEL)]
    read, write, lint, llm = o.starts
    succeeded = {e.payload["step_id"]: e.event_seq for e in events if e.type == "step.succeeded"}
    ckpts = [e for e in events if e.type == "resource.checkpointed"]
    baseline = ckpts[0]
    assert baseline.payload["covered_seq"] == baseline.event_seq == 7
    # The write is due (every_steps=1) and captured with its outcome.
    assert ckpts[1].event_seq == succeeded[write.step_id] + 1
    assert ckpts[1].payload["covered_seq"] == succeeded[write.step_id]
    assert events[-1].type == "execution.completed"

    # Generations each start raised, by the oracle's rule and in the payloads.
    gens = [x.seq for x in o.starts if o.ends_coverage(x, KEY)]
    if reuse:
        assert gens == [write.seq]
        assert [e.payload.get("generations") for e in events if e.type == "step.executing"] == [
            None, {KEY: 1}, None, None]
        assert len(ckpts) == 2  # still covered at the end: no completion capture
        assert o.ranges() == [[1, 4], [7, write.seq - 1], [succeeded[write.step_id], o.last]]
    else:
        assert gens == [read.seq, write.seq, lint.seq, llm.seq]
        assert [e.payload.get("generations") for e in events if e.type == "step.executing"] == [
            {KEY: 1}, {KEY: 2}, {KEY: 3}, {KEY: 4}]
        assert len(ckpts) == 3
        completion = ckpts[2]
        assert completion.payload["generation"] == 4 and completion.event_seq == o.last - 1
        assert completion.payload["covered_seq"] == completion.event_seq
        assert o.ranges() == [[1, 4], [7, read.seq - 1], [succeeded[write.step_id], lint.seq - 1],
                              [completion.event_seq, o.last]]
    for c in ckpts:
        assert c.payload["generation"] == o.generation_at(KEY, c.payload["covered_seq"])
    assert_kernel_matches(o, ranges, points)

    ws = writes(events, steps)
    driver = LocalDirectory(root)
    for c in ckpts:
        handle, _ = await driver.create(c.payload["checkpoint_ref"])
        assert files_of(handle.path) == contents_at(ws, c.payload["covered_seq"])
