"""Scenario 8 of docs/protocol/conformance.md §3: serialisation.

* With a resource registered, four 200 ms tools under `asyncio.gather` run
  one at a time (their body intervals do not overlap, 50 ms tolerance; in the
  log each starts after the previous one's outcome), while two concurrent LLM
  calls still overlap at the provider.
* Without resources, the same four tools overlap.
* A tool whose body calls two affecting tools (concurrently) nests without
  deadlock; the inner due captures are deferred and sent with the outer
  step's outcome, at the newest generation.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rebuno import CheckpointPolicy, http_client, resource, tool
from rebuno.drivers import LocalDirectory

from ..e2e.harness import KernelProcess, files_of
from .conftest import MODEL, serving
from .oracle import Oracle, contents_at, writes
from .script_server import ScriptServer

KEY = "workspace"
TOLERANCE = 0.05


def overlapping(spans: list[tuple[float, float]]) -> bool:
    """Whether any two intervals overlap by more than the tolerance."""
    spans = sorted(spans)
    return any(b[0] < a[1] - TOLERANCE for a, b in zip(spans, spans[1:]))


async def test_tools_serialise_with_a_resource_and_llm_calls_do_not(kernel: KernelProcess, script: ScriptServer,
                                                                    root: Path) -> None:
    spans: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    script.delay = 0.2

    async def process(with_resource: bool) -> dict[str, Any]:
        if with_resource:
            await resource(KEY, driver=LocalDirectory(), checkpoints=CheckpointPolicy(every_steps=1))

        @tool("nap")
        async def nap(i: int) -> int:
            """Sleep 200 ms."""
            t0 = time.monotonic()
            await asyncio.sleep(0.2)
            spans[with_resource].append((t0, time.monotonic()))
            return i

        naps = await asyncio.gather(*(nap(i) for i in range(4)))
        async with http_client(base_url=os.environ["OPENAI_BASE_URL"]) as llm:
            answers = await asyncio.gather(*(llm.post("/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}]}) for i in range(2)))
        return {"naps": list(naps), "llm": [a.status_code for a in answers]}

    async with serving(kernel, "serial", process), kernel.client() as client:
        for flag in (True, False):
            script.requests.clear()
            ex = await client.create("serial", {"with_resource": flag})
            done = await client.wait(ex.id, timeout=30)
            assert (done.status, done.output) == ("completed", {"naps": [0, 1, 2, 3], "llm": [200, 200]}), done
            events = await client.all_events(ex.id)
            naps = [e for e in events if e.type.startswith("step.") and e.payload["target"] == "nap"
                    and e.type in ("step.executing", "step.succeeded")]
            order = [e.type for e in naps]
            if flag:
                assert order == ["step.executing", "step.succeeded"] * 4  # one at a time, in the log too
            else:
                assert order.index("step.succeeded") > 1  # a second nap started before the first finished
            # LLM calls never take the step lock: the provider saw both at once.
            reqs = script.requests
            assert len(reqs) == 2
            assert reqs[1].started < reqs[0].ended - TOLERANCE and reqs[0].started < reqs[1].ended - TOLERANCE
    assert len(spans[True]) == 4 and not overlapping(spans[True]), spans[True]
    assert len(spans[False]) == 4 and overlapping(spans[False]), spans[False]


async def test_nested_tools_defer_their_capture_to_the_outer_step(kernel: KernelProcess, script: ScriptServer,
                                                                 root: Path) -> None:
    async def process() -> list[str]:
        ws = await resource(KEY, driver=LocalDirectory(), checkpoints=CheckpointPolicy(every_steps=1))

        @tool("write_file", resources=[KEY])
        async def write_file(path: str, content: str) -> str:
            """Write a file in the workspace."""
            await ws.files.write(path, content)
            return f"wrote {path}"

        @tool("write_both")
        async def write_both() -> list[str]:
            """Write two files through the other tool, concurrently."""
            return list(await asyncio.gather(write_file("x.txt", "x"), write_file("y.txt", "y")))

        return await asyncio.wait_for(write_both(), 20)

    async with serving(kernel, "nester", process), kernel.client() as client:
        ex = await client.create("nester", {})
        done = await client.wait(ex.id, timeout=30)
        assert (done.status, done.output) == ("completed", ["wrote x.txt", "wrote y.txt"]), done
        events = await client.all_events(ex.id)
        steps = await client.steps(ex.id)

    o = Oracle(events)
    by_id = {s.step_id: s for s in steps}
    outcome = {e.payload["step_id"]: e for e in events if e.type == "step.succeeded"}
    outer = next(s for s in steps if s.target == "write_both")
    inner = [s for s in steps if s.target == "write_file"]
    assert len(inner) == 2 and {tuple(s.resources) for s in inner} == {(KEY,)} and outer.resources == []
    # The inner steps ran inside the outer body: between its start and its outcome.
    outer_start = next(x.seq for x in o.starts if x.step_id == outer.step_id)
    assert all(outer_start < outcome[s.step_id].event_seq < outcome[outer.step_id].event_seq for s in inner)
    # No capture after an inner outcome; one after the outer outcome, in its transaction.
    for s in inner:
        nxt = events[outcome[s.step_id].event_seq]  # the event after it
        assert nxt.type != "resource.checkpointed", by_id[s.step_id].args
    ckpts = [e for e in events if e.type == "resource.checkpointed"]
    assert len(ckpts) == 2  # the baseline and the deferred capture
    deferred = ckpts[1]
    assert deferred.event_seq == outcome[outer.step_id].event_seq + 1
    assert deferred.payload["covered_seq"] == outcome[outer.step_id].event_seq
    # At the newest generation (the last inner start's), and accepted: no writer was left.
    assert deferred.payload["generation"] == o.generation_at(KEY, deferred.event_seq) == 3
    assert not [e for e in events if e.type == "resource.checkpoint_failed"]
    assert o.covered(deferred.event_seq) and o.covered(o.last)
    handle, _ = await LocalDirectory(root).create(deferred.payload["checkpoint_ref"])
    assert files_of(handle.path) == contents_at(writes(events, steps), deferred.payload["covered_seq"]) == {
        "x.txt": "x", "y.txt": "y"}
