"""Scenario 6 of docs/protocol/conformance.md §3: every_steps=5 and an uncovered fork.

Seven writes f1…f7 with an LLM call between each (scenario 1b's loop), forked
right after write 3. The fork restores the baseline (`covered: false`),
replays writes 1–3 with their recorded results although f1–f3 are not in its
directory, and runs writes 4–7 live. Its counter starts at 0, so four live
writes make no periodic capture (a copied counter of 3 would have made its
2nd live write due); it ends with a completion capture. Its resource keeps
`{every_steps: 5, on_completion: true}` although the agent, restarted with
every_steps=2 before the fork runs, passes another policy.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ..e2e.harness import KernelProcess, files_of
from .agents import loop_agent
from .conftest import serving
from .forking import coverage_ranges
from .oracle import Oracle, assert_kernel_matches, check_fork_log, contents_at, expected_fork, writes
from .script_server import Entry, ScriptServer

AGENT = "coder"
KEY = "workspace"
SEVEN: list[Entry] = [("write", f"f{i}.txt", str(i)) for i in range(1, 8)] + [("answer", "done", None)]


async def test_uncovered_fork_counts_from_zero(kernel: KernelProcess, script: ScriptServer, root: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    script.script = SEVEN
    results: list[tuple[str, str]] = []
    async with kernel.client() as client:
        async with serving(kernel, AGENT, loop_agent(every_steps=5, tool_results=results)):
            ex = await client.create(AGENT, {"task": "Write seven files."})
            done = await client.wait(ex.id, timeout=60)
        assert (done.status, done.output) == ("completed", {"answer": "done"}), done
        events = await client.all_events(ex.id)
        steps = await client.steps(ex.id)
        o = Oracle(events)
        ws = writes(events, steps)
        assert [w.path for w in ws] == [f"f{i}.txt" for i in range(1, 8)]
        # The source: baseline, a periodic capture with the 5th write's outcome, a completion capture.
        ckpts = [e for e in events if e.type == "resource.checkpointed"]
        assert [c.payload["covered_seq"] for c in ckpts] == [ckpts[0].event_seq, ws[4].seq, o.last - 1]
        baseline = ckpts[0].payload

        s = ws[2].seq  # right after write 3
        plan = expected_fork(o, s)
        assert plan.point.summary() == (False, {KEY: (False, baseline["checkpoint_ref"])})

        results.clear()
        script.requests.clear()
        caplog.set_level(logging.WARNING, logger="rebuno")
        # The agent is restarted with every_steps=2 before the fork runs.
        async with serving(kernel, AGENT, loop_agent(every_steps=2, tool_results=results)):
            fork = await client.fork(ex.id, at_seq=s)
            assert fork.restoration == {KEY: {"checkpoint_ref": baseline["checkpoint_ref"],
                                              "checkpoint_seq": baseline["covered_seq"], "covered": False}}
            fdone = await client.wait(fork.id, timeout=60)
        assert (fdone.status, fdone.output) == ("completed", {"answer": "done"}), fdone
        fevents = await client.all_events(fork.id)
        fsteps = await client.steps(fork.id)
        check_fork_log(o, plan, fevents, fork.id, ex.id)
        fo = Oracle(fevents)

        # Writes 1-3 replay with their recorded results; the model is asked from entry 4 on.
        assert [t for _, t in results] == [f"wrote f{i}.txt" for i in range(1, 8)]
        assert script.counts() == [3, 4, 5, 6, 7]
        created_end = next(e.event_seq for e in fevents if e.type == "dispatch.queued")
        copied = {e.payload["step_id"] for e in fevents[:created_end] if e.type.startswith("step.")}
        copied_writes = [st for st in fsteps if st.step_id in copied and st.target == "write_file"]
        assert [(st.args, st.result) for st in copied_writes] == [
            ({"path": f"f{i}.txt", "content": str(i)}, f"wrote f{i}.txt") for i in range(1, 4)]
        # f1-f3 are absent; f4-f7 were written live.
        started = [e.type for e in fevents].index("execution.started")
        bound = next(e for e in fevents[started:] if e.type == "resource.bound")
        assert files_of(bound.payload["binding"]["path"]) == {f"f{i}.txt": str(i) for i in range(4, 8)}
        assert contents_at(ws, baseline["covered_seq"]) == {}
        live_writes = [x for x in fo.starts if x.seq > started and x.target == "write_file"]
        assert len(live_writes) == 4

        # Its own checkpoints: the baseline (generation at s, plus 1), then only the completion capture.
        own = [e for e in fevents[started:] if e.type == "resource.checkpointed"]
        assert len(own) == 2, [(e.event_seq, e.payload) for e in own]
        assert own[0].event_seq == bound.event_seq + 1 and own[0].payload["generation"] == o.generation_at(KEY, s) + 1
        assert own[1].event_seq == fo.last - 1 and fevents[-1].type == "execution.completed"
        assert own[1].payload["covered_seq"] == own[1].event_seq
        assert own[1].payload["generation"] == fo.generation_at(KEY, own[1].event_seq)
        assert not [e for e in fevents if e.type == "resource.checkpoint_failed"]

        # The recorded policy won over the restarted agent's every_steps=2.
        registered = [e.payload for e in fevents if e.type == "resource.registered"]
        assert len(registered) == 1 and (registered[0]["every_steps"], registered[0]["on_completion"]) == (5, True)
        assert any("keeps its recorded checkpoint policy (every_steps=5, on_completion=True)" in r.getMessage()
                   and "every_steps=2" in r.getMessage() for r in caplog.records)

        franges = await coverage_ranges(client, fork.id)
        points = {p: await client.coverage(fork.id, at_seq=p) for p in range(1, fo.last + 1)}
        assert_kernel_matches(fo, franges, points)
        assert len(await client.all_events(ex.id)) == o.last

