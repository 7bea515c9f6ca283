"""Scenario 4 of docs/protocol/conformance.md §3: a capture failure.

A wrapping driver fails the `checkpoint()` that is due after the 2nd write
(every_steps=1, coverage_reuse on, so that LLM calls and the read leave
coverage alone). The agent is scenario 1b's loop on the default script.
Expected, by the oracle and Example D: the tool result reaching the model is
unchanged; one `resource.checkpoint_failed`, in the transaction of that
write's outcome; uncovered from that write's start until the next write,
which is due and captured; a fork inside the gap restores the previous
checkpoint with `restoration.covered: false`, replays the 2nd write whose
change it lacks, and runs the rest live.
"""

from __future__ import annotations

from pathlib import Path

from rebuno.drivers import LocalDirectory

from ..e2e.harness import KernelProcess, files_of
from .agents import FailingCapture, loop_agent
from .conftest import serving
from .forking import coverage_ranges, fork_everywhere, read_coverage, read_run
from .oracle import Oracle, assert_kernel_matches, check_fork_log, contents_at, expected_fork, writes
from .script_server import ScriptServer

AGENT = "coder"
KEY = "workspace"


async def test_capture_failure_leaves_a_gap(kernel: KernelProcess, script: ScriptServer, root: Path) -> None:
    drivers: list[FailingCapture] = []

    def driver() -> FailingCapture:
        # The source's dispatch fails its 3rd capture (baseline, write 1, write 2).
        d = FailingCapture(LocalDirectory(root, coverage_reuse=True), fail={3} if not drivers else set())
        drivers.append(d)
        return d

    results: list[tuple[str, str]] = []
    async with serving(kernel, AGENT, loop_agent(every_steps=1, driver=driver, tool_results=results)), \
            kernel.client() as client:
        ex = await client.create(AGENT, {"task": "Write the project files."})
        done = await client.wait(ex.id, timeout=60)
        assert (done.status, done.output) == ("completed", {"answer": "done"}), done
        events = await client.all_events(ex.id)
        steps = await client.steps(ex.id)
        ranges, points = await read_coverage(client, ex.id, events[-1].event_seq)
        source_requests = list(script.requests)

        o = Oracle(events)
        ws = writes(events, steps)
        wstarts = [s for s in o.starts if s.target == "write_file"]
        assert len(ws) == len(wstarts) == 6 and drivers[0].calls == 7  # baseline + one per write

        # The outcome stands: the model saw "wrote b.txt" for the 2nd write.
        assert [t for _, t in results][:2] == ["wrote a.txt", "wrote b.txt"]
        third = next(r for r in source_requests if r.n == 2)
        assert [m["content"] for m in third.body["messages"] if m.get("role") == "tool"] == ["wrote a.txt",
                                                                                            "wrote b.txt"]
        # One failure event, right after the 2nd write's outcome (same transaction).
        failed = [e for e in events if e.type == "resource.checkpoint_failed"]
        assert len(failed) == 1 and failed[0].event_seq == ws[1].seq + 1
        assert failed[0].payload == {"key": KEY, "generation": o.generation_at(KEY, ws[1].seq),
                                     "error": "snapshot quota exceeded (capture 3)"}
        # Every other write's due capture went with its outcome.
        ckpts = [e for e in events if e.type == "resource.checkpointed"]
        assert [c.payload["covered_seq"] for c in ckpts[1:]] == [w.seq for i, w in enumerate(ws) if i != 1]
        assert all(c.event_seq == c.payload["covered_seq"] + 1 for c in ckpts[1:])
        # Example D's shape: uncovered from the 2nd write's start to the 3rd
        # write's outcome; reads and LLM calls never break coverage here.
        want = [[1, 4], [ckpts[0].event_seq, wstarts[0].seq - 1], [ws[0].seq, wstarts[1].seq - 1]]
        for i in range(2, 6):
            want.append([ws[i].seq, (wstarts[i + 1].seq - 1) if i < 5 else o.last])
        assert o.ranges() == want
        assert not any(o.covered(s) for s in range(wstarts[1].seq, ws[2].seq))
        assert o.covered(o.last) and events[-2].type != "resource.checkpointed"  # no completion capture needed
        assert_kernel_matches(o, ranges, points)

        # A fork inside the gap restores the previous checkpoint, uncovered.
        gap = failed[0].event_seq
        plan = expected_fork(o, gap)
        assert plan.point.keys[KEY].ref == ckpts[1].payload["checkpoint_ref"]
        results.clear()
        script.requests.clear()
        fork = await client.fork(ex.id, at_seq=gap)
        assert fork.restoration == {KEY: {"checkpoint_ref": ckpts[1].payload["checkpoint_ref"],
                                          "checkpoint_seq": ws[0].seq, "covered": False}}
        handle, _ = await LocalDirectory(root).create(ckpts[1].payload["checkpoint_ref"])
        assert files_of(handle.path) == contents_at(ws, ws[0].seq) == {"a.txt": "1"}
        fdone = await client.wait(fork.id, timeout=60)
        assert (fdone.status, fdone.output) == ("completed", {"answer": "done"}), fdone
        fevents = await client.all_events(fork.id)
        check_fork_log(o, plan, fevents, fork.id, ex.id)
        # Writes 1 and 2 replay ("wrote b.txt" although b.txt is not there);
        # the read of b.txt, live, finds no file.
        texts = [t for _, t in results]
        assert texts[:2] == ["wrote a.txt", "wrote b.txt"] and texts[2] == "1"
        assert texts[6].startswith("error: ") and "b.txt" in texts[6]
        assert script.counts() == list(range(2, 9))
        started = [e.type for e in fevents].index("execution.started")
        bound = next(e for e in fevents[started:] if e.type == "resource.bound")
        assert files_of(bound.payload["binding"]["path"]) == {"a.txt": "4", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
        fo = Oracle(fevents)
        franges = await coverage_ranges(client, fork.id)
        assert_kernel_matches(fo, franges, {})
        assert drivers[1].calls >= 1 and len(drivers) == 2

    # With the agent stopped, a fork at every event of the source is inspected.
    async with kernel.client() as client:
        await fork_everywhere(client, await read_run(client, ex.id), root)


async def test_a_failed_capture_keeps_the_counter(kernel: KernelProcess, script: ScriptServer, root: Path) -> None:
    """every_steps=2 (docs/protocol/resources.md §3 "Reset"): the capture due after write 2 fails, so
    the counter is not reset and write 3 is due at once; after that accepted
    capture the cadence resumes (write 5), and the completion capture covers
    the end that write 6 left uncovered."""
    drivers: list[FailingCapture] = []

    def driver() -> FailingCapture:
        d = FailingCapture(LocalDirectory(root, coverage_reuse=True), fail={2})  # baseline is call 1
        drivers.append(d)
        return d

    async with serving(kernel, AGENT, loop_agent(every_steps=2, driver=driver)), kernel.client() as client:
        ex = await client.create(AGENT, {"task": "Write the project files."})
        done = await client.wait(ex.id, timeout=60)
        assert (done.status, done.output) == ("completed", {"answer": "done"}), done
        events = await client.all_events(ex.id)
        steps = await client.steps(ex.id)
        ranges, points = await read_coverage(client, ex.id, events[-1].event_seq)

    o = Oracle(events)
    ws = writes(events, steps)
    wstarts = [s for s in o.starts if s.target == "write_file"]
    failed = [e for e in events if e.type == "resource.checkpoint_failed"]
    assert [e.event_seq for e in failed] == [ws[1].seq + 1]
    ckpts = [e for e in events if e.type == "resource.checkpointed"]
    # Baseline; write 3 (due again: the failure left the counter at 2); write 5; completion.
    assert [c.payload["covered_seq"] for c in ckpts] == [ckpts[0].event_seq, ws[2].seq, ws[4].seq, o.last - 1]
    assert ckpts[3].event_seq == o.last - 1 and not o.covered(o.last - 2)
    assert drivers[0].calls == 5 and len(drivers) == 1
    assert o.ranges() == [[1, 4], [ckpts[0].event_seq, wstarts[0].seq - 1], [ws[2].seq, wstarts[3].seq - 1],
                          [ws[4].seq, wstarts[5].seq - 1], [o.last - 1, o.last]]
    assert_kernel_matches(o, ranges, points)
    for c in ckpts:
        handle, _ = await LocalDirectory(root).create(c.payload["checkpoint_ref"])
        assert files_of(handle.path) == contents_at(ws, c.payload["covered_seq"])
