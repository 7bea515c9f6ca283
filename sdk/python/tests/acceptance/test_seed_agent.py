"""Scenarios 1 and 1b of docs/protocol/conformance.md §3: the seed's LangChain docs
agent (`examples/python/resources/agent_local.py`, every_steps=5 as written),
and the same two tools under a framework-free loop over the chat completions
wire, run for real against the kernel with `LocalDirectory`.

1. The run: a baseline, a periodic capture sent with the outcome of the 5th
   write (script entry 6) and a completion capture.
2. A fork at EVERY event seq, with the agent stopped so that the fork is
   inspected and never run, then cancelled: its restoration, its copied log
   and checkpoints, its coverage at every copied position, and the restored
   directory, all against this suite's oracle.
3. A fork at each step boundary, run to completion: the provider is asked
   exactly the calls that were not copied, the live steps are the steps after
   the point, and the final directory is the restored one plus the live writes.

Every coverage expectation comes from `oracle.py`, computed from the events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx2

from rebuno import Client, Event, Step
from rebuno.drivers import LocalDirectory

from ..e2e.harness import KernelProcess, files_of
from .agents import load_seed, loop_agent
from .conftest import MODEL, serving
from .forking import Run, coverage_ranges, fork_everywhere, read_coverage, read_run
from .oracle import Oracle, assert_kernel_matches, contents_at, expected_fork
from .script_server import DEFAULT_SCRIPT, ScriptServer

AGENT = "coder"
KEY = "workspace"
TASK = {"task": "Write the project files."}


def bound_path(events: list[Event], after: int = 0) -> str:
    found = [e for e in events if e.type == "resource.bound" and e.event_seq > after]
    assert len(found) == 1, [(e.event_seq, e.type) for e in events]
    return str(found[0].payload["binding"]["path"])


def proposed_order(run: Run) -> list[Step]:
    """The run's steps in the order they were proposed."""
    first: dict[str, int] = {}
    for e in run.events:
        if e.type == "step.proposed":
            first.setdefault(e.payload["step_id"], e.event_seq)
    return sorted(run.steps, key=lambda s: first[s.step_id])


async def check_source(client: Client, run: Run, script: ScriptServer, root: Path) -> None:
    events, o = run.events, run.oracle
    types = [e.type for e in events]
    assert script.counts() == list(range(9)), "each script entry is asked for exactly once"
    assert [s.kind for s in proposed_order(run)] == ["llm_call", "tool_call"] * 8 + ["llm_call"]
    assert {(s.kind, s.target, tuple(s.resources)) for s in run.steps} == {
        ("llm_call", MODEL, ()), ("tool_call", "write_file", (KEY,)), ("tool_call", "read_file", ())}
    reg = events[types.index("resource.registered")]
    assert reg.payload == {"key": KEY, "driver_id": "rebuno.local_directory.v1", "configuration": {"template": None},
                           "coverage_reuse": False, "every_steps": 5, "on_completion": True}
    assert not [e for e in events if e.type == "resource.checkpoint_failed"]

    ckpts = [e for e in events if e.type == "resource.checkpointed"]
    assert len(ckpts) == 3, [(e.event_seq, e.payload) for e in ckpts]
    baseline, periodic, completion = ckpts
    # The baseline: published right after the bind, covering from its own event.
    assert types[types.index("resource.bound") + 1] == "resource.checkpointed" == types[baseline.event_seq - 1]
    assert baseline.event_seq == types.index("resource.bound") + 2
    assert baseline.payload["covered_seq"] == baseline.event_seq and baseline.payload["generation"] == 0
    # The periodic capture: with the outcome of the 5th write (script entry 6), in its transaction.
    fifth = run.writes[4]
    assert (fifth.path, fifth.content) == (DEFAULT_SCRIPT[5][1], DEFAULT_SCRIPT[5][2])
    assert periodic.event_seq == fifth.seq + 1 and periodic.payload["covered_seq"] == fifth.seq
    # The completion capture: the last LLM call left the resource uncovered.
    last_llm = [x for x in o.starts if x.step_type == "llm_call"][-1]
    assert not o.covered(completion.event_seq - 1) and completion.event_seq - 1 > last_llm.seq
    assert completion.payload["covered_seq"] == completion.event_seq == o.last - 1
    assert types[-1] == "execution.completed"
    for c in ckpts:  # each capture was taken in the generation of the point it covers
        assert c.payload["generation"] == o.generation_at(KEY, c.payload["covered_seq"]), c.payload

    # Checkpoint contents: exactly the writes that precede the covered point.
    driver = LocalDirectory(root)
    for c, want in zip(ckpts, [{}, {"a.txt": "4", "b.txt": "2", "c.txt": "3", "d.txt": "5"},
                               {"a.txt": "4", "b.txt": "2", "c.txt": "3", "d.txt": "5", "e.txt": "6"}]):
        assert contents_at(run.writes, c.payload["covered_seq"]) == want
        handle, _ = await driver.create(c.payload["checkpoint_ref"])
        assert files_of(handle.path) == want
    assert files_of(bound_path(events)) == contents_at(run.writes, o.last)

    # The kernel's coverage, every point and the ranges, against the oracle.
    ranges, points = await read_coverage(client, run.id, o.last)
    assert_kernel_matches(o, ranges, points)
    after_fifth = next(x.seq for x in o.starts if x.seq > fifth.seq)
    assert o.ranges() == [[1, 4], [baseline.event_seq, o.starts[0].seq - 1], [fifth.seq, after_fifth - 1],
                          [completion.event_seq, o.last]]


@dataclass
class Expected:
    live: list[Step]  # source steps that run live in the fork, in order (through a failing one)
    requests: list[int]  # `n` of each provider request
    tool_texts: list[str]  # what the model sees for each tool call, in script order
    workspace: dict[str, str]
    failed_read: str | None  # the path of a live read that finds no file


def simulate(run: Run, copied: set[str], restored: dict[str, str], tolerant: bool) -> Expected:
    """The fork's expected course: copied steps replay their source results;
    the rest run live against the restored directory."""
    order = proposed_order(run)
    n_copied = sum(1 for s in order if s.step_id in copied)
    assert all(s.step_id in copied for s in order[:n_copied]) and \
        not any(s.step_id in copied for s in order[n_copied:]), "copies are a prefix"
    ws = dict(restored)
    live: list[Step] = []
    requests: list[int] = []
    texts: list[str] = []
    failed = None
    for s in order:
        if s.step_id in copied:
            if s.kind == "tool_call":
                texts.append(s.result)
            continue
        live.append(s)
        if s.kind == "llm_call":
            requests.append(len(texts))
            continue
        path = s.args["path"]
        if s.target == "write_file":
            ws[path] = s.args["content"]
            texts.append(f"wrote {path}")
        elif path in ws:
            texts.append(ws[path])
        else:
            failed = path
            if not tolerant:
                break
            texts.append("<error>")
    return Expected(live, requests, texts, ws, failed)


def texts_match(seen: list[str], expect: list[str]) -> bool:
    """Tool results as the model saw them; `<error>` stands for the loop's
    report of a read that found no file."""
    return len(seen) == len(expect) and all(
        x == y or (y == "<error>" and x.startswith("error: ") and "No such file" in x) for x, y in zip(seen, expect))


async def fork_boundaries(client: Client, run: Run, script: ScriptServer, tolerant: bool,
                          tool_results: list[tuple[str, str]] | None) -> dict[int, str]:
    """Fork at each step boundary and run each fork to its end. Returns seq → outcome."""
    o = run.oracle
    boundaries = [e.event_seq - 1 for e in run.events
                  if e.type == "step.proposed" and e.payload["step_type"] in ("tool_call", "local")] + [o.last]
    assert len(boundaries) == 9
    source_final = contents_at(run.writes, o.last)
    outcomes = {}
    for b in boundaries:
        plan = expected_fork(o, b)
        kp = plan.point.keys[KEY]
        restored = contents_at(run.writes, kp.checkpoint_seq) if kp.checkpoint_seq is not None else {}
        want = simulate(run, plan.copied_steps, restored, tolerant)
        script.requests.clear()
        if tool_results is not None:
            tool_results.clear()

        fork = await client.fork(run.id, at_seq=b)
        done = await client.wait(fork.id, timeout=60)
        fevents = await client.all_events(fork.id)
        ftypes = [e.type for e in fevents]
        if want.failed_read is None or tolerant:
            assert (done.status, done.output) == ("completed", {"answer": "done"}), (b, done)
            outcomes[b] = "done"
        else:
            # LangChain's tool node re-raises a tool's error: the seed agent
            # fails when a live read finds a file that only a copied write made.
            assert done.status == "failed", (b, done)
            assert done.failure_reason is not None and done.failure_reason.startswith("tool_error: read_file: ")
            assert "No such file or directory" in done.failure_reason and want.failed_read in done.failure_reason
            outcomes[b] = "failed"

        # The provider got exactly the calls that were not copied, once each.
        assert script.counts() == want.requests, (b, script.counts(), want.requests)
        # Copied results replay (even when the restored directory lacks their
        # changes); live ones come from the restored directory.
        for req in script.requests:
            seen = [m["content"] for m in req.body["messages"] if m.get("role") == "tool"]
            assert texts_match(seen, want.tool_texts[:req.n]), (b, seen, want.tool_texts)
        if tool_results is not None:
            assert texts_match([t for _, t in tool_results], want.tool_texts), (b, tool_results, want.tool_texts)

        # The live steps are exactly the steps after the point.
        started = ftypes.index("execution.started")
        live = [e.payload["step_id"] for e in fevents[started:] if e.type == "step.executing"]
        fsteps = {s.step_id: s for s in await client.steps(fork.id)}
        assert [(fsteps[i].kind, fsteps[i].target) for i in live] == [(s.kind, s.target) for s in want.live], b
        for i, s in zip(live, want.live):
            if s.kind == "tool_call":
                assert fsteps[i].args == s.args
        assert not [e for e in fevents[started:] if e.type == "step.executing" and e.payload.get("retry")]

        # Restored contents plus the live writes; the source's for a covered fork.
        path = bound_path(fevents, after=fevents[started].event_seq)
        assert files_of(path) == want.workspace, b
        if kp.covered:
            assert want.workspace == source_final and done.status == "completed"
        bound = ftypes.index("resource.bound", started)
        if kp.covered:
            assert ftypes[bound + 1] != "resource.checkpointed", b  # a covered restore takes no baseline
        else:
            baseline = fevents[bound + 1]
            assert baseline.type == "resource.checkpointed", b
            assert baseline.payload["covered_seq"] == baseline.event_seq
            assert baseline.payload["generation"] == o.generation_at(KEY, b) + 1

        fo = Oracle(fevents)
        ranges = await coverage_ranges(client, fork.id)
        assert_kernel_matches(fo, ranges, {})
        if done.status == "completed":
            assert fo.covered(fo.last), b
    return outcomes


async def scenario(kernel: KernelProcess, script: ScriptServer, root: Path,
                   process: Callable[..., Awaitable[Any]], tolerant: bool,
                   tool_results: list[tuple[str, str]] | None = None) -> dict[int, str]:
    async with kernel.client() as client:
        async with serving(kernel, AGENT, process):
            ex = await client.create(AGENT, TASK)
            done = await client.wait(ex.id, timeout=60)
        assert (done.status, done.output) == ("completed", {"answer": "done"}), done
        run = await read_run(client, ex.id)
        await check_source(client, run, script, root)
        # The agent is stopped: the forks are inspected, never run.
        await fork_everywhere(client, run, root)
        async with serving(kernel, AGENT, process):
            return await fork_boundaries(client, run, script, tolerant, tool_results)


async def test_seed_langchain_agent_forks(kernel: KernelProcess, script: ScriptServer, root: Path) -> None:
    """Scenario 1: the seed agent, verbatim but for the driver."""
    outcomes = await scenario(kernel, script, root, load_seed().process, tolerant=False)
    # Forks before tool calls 2-6 restore the baseline: `a.txt` (or, from
    # call 4 on, `b.txt`), written by a copied call, is missing when a live
    # read_file asks for it, and LangChain's tool node re-raises the error.
    assert list(outcomes.values()) == ["done", "failed", "failed", "failed", "failed", "failed", "done", "done",
                                       "done"]


async def test_framework_free_loop_forks(kernel: KernelProcess, script: ScriptServer, root: Path) -> None:
    """Scenario 1b: the same flow over the chat completions wire through `http_client()`."""
    results: list[tuple[str, str]] = []
    outcomes = await scenario(kernel, script, root, loop_agent(every_steps=5, tool_results=results),
                              tolerant=True, tool_results=results)
    assert set(outcomes.values()) == {"done"}


async def test_the_fixture_streams_and_speaks_responses(script: ScriptServer) -> None:
    """The fixture answers the streaming wire and the responses wire with the
    entry the plain wire would give for the same conversation."""
    async with httpx2.AsyncClient(base_url=script.url) as c:
        body: dict[str, Any] = {"model": MODEL, "stream": True, "messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": []},
            {"role": "tool", "tool_call_id": "call_1", "content": "wrote a.txt"}]}
        r = await c.post("/v1/chat/completions", json=body)
        frames = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
        args = "".join(call.get("function", {}).get("arguments", "") for f in frames for ch in f["choices"]
                       for call in ch["delta"].get("tool_calls", []))
        assert json.loads(args) == {"path": "b.txt", "content": "2"}
        r = await c.post("/v1/chat/completions", json={**body, "stream": False})
        assert json.loads(r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == \
            {"path": "b.txt", "content": "2"}
        r = await c.post("/v1/responses", json={"model": MODEL, "input": [
            {"role": "user", "content": "go"}, {"type": "function_call_output", "call_id": "c", "output": "x"}]})
        out = r.json()["output"][0]
        assert (out["type"], out["name"], json.loads(out["arguments"])) == \
            ("function_call", "write_file", {"path": "b.txt", "content": "2"})
    assert script.counts() == [1, 1] and script.counts("/v1/responses") == [1]
