"""Scenario 3 of docs/protocol/conformance.md §3: SIGKILL in the middle of a tool
call, then resume on a kernel with `--dispatch-lease-timeout 2s
--dispatch-timeout 1s` (real clock).

The seed's LangChain agent runs in a child process (`crash_agent.py`) on a
script whose 2nd write targets `slow.txt`; that write holds after writing.
When its `step.executing` is in the log and the file exists, the agent gets
SIGKILL and a new agent process is started. The kernel reclaims the lease and
redelivers; the test then checks, against its own oracle:

* the same directory is reopened: one `resource.bound`, `create` not called again;
* the earlier steps replay (their bodies and LLM calls do not run again);
* the orphan re-runs: a second `step.executing` with `retry: true` and a
  higher generation;
* a capture of the first start's generation, posted by the test afterwards
  for the live dispatch, is refused as `stale_generation`;
* the resource is uncovered from the first start to the next accepted capture;
* the execution completes with the right directory.

`tests/e2e/test_resources.py::test_kill_mid_tool_call_reopens_the_same_directory`
covers a similar crash without an LLM, with the default lease and a manual
clock, and posts no stale capture; nothing here is skipped on its account.
"""

from __future__ import annotations

from pathlib import Path

from rebuno import Event
from rebuno.drivers import LocalDirectory

from ..e2e.harness import ChildAgent, KernelProcess, eventually, files_of, markers, register
from .conftest import SECRET, agent_post
from .forking import fork_everywhere, read_coverage, read_run
from .oracle import Oracle, assert_kernel_matches, contents_at, writes
from .script_server import DEFAULT_SCRIPT, ScriptServer

HERE = Path(__file__).resolve().parent
AGENT = "crasher"
KEY = "workspace"
SLOW_SCRIPT = [(kind, "slow.txt" if path == "b.txt" else path, content) for kind, path, content in DEFAULT_SCRIPT]


def crash_agent(kernel: KernelProcess, env: dict[str, str]) -> ChildAgent:
    """`crash_agent.py` in a child process."""
    return ChildAgent(HERE / "crash_agent.py", kernel, AGENT, SECRET, env=env)


def write_starts(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "step.executing" and e.payload["target"] == "write_file"]


async def test_crash_mid_tool_call_then_resume(tmp_path: Path, script: ScriptServer, root: Path) -> None:
    script.script = SLOW_SCRIPT
    mfile, release = tmp_path / "markers", tmp_path / "release"
    env = {"MARKERS": str(mfile), "RELEASE_FILE": str(release)}
    kernel = KernelProcess(tmp_path, args=["--dispatch-lease-timeout", "2s", "--dispatch-timeout", "1s"],
                           manual_clock=False)
    kernel.start()
    first = crash_agent(kernel, env)
    second: ChildAgent | None = None
    try:
        async with kernel.client() as client:
            await register(kernel, AGENT, await first.webhook(), SECRET)
            ex = await client.create(AGENT, {"task": "Write the project files."})

            async def slow_started() -> list[Event] | None:
                events = await client.all_events(ex.id)
                bound = [e for e in events if e.type == "resource.bound"]
                if len(write_starts(events)) < 2 or not bound:
                    return None
                slow = Path(bound[0].payload["binding"]["path"], "slow.txt")
                return events if slow.exists() and slow.read_text() == "2" else None

            before = await eventually(slow_started, timeout=60, what="the slow write running")
            # The replacement process is started (not registered) first, so that
            # its start-up time never eats into the redelivery budget.
            second = crash_agent(kernel, env)
            second_url = await second.webhook()
            first.kill()  # SIGKILL mid tool call: the step stays executing, nothing is reported
            assert script.counts() == [0, 1]
            workspace = str([e for e in before if e.type == "resource.bound"][0].payload["binding"]["path"])
            first_start = write_starts(before)[1]
            first_gen = Oracle(before).generation_at(KEY, first_start.event_seq)
            assert first_start.payload.get("generations") == {KEY: first_gen}
            assert "retry" not in first_start.payload

            await register(kernel, AGENT, second_url, SECRET)

            async def rerun_holding() -> list[Event] | None:
                events = await client.all_events(ex.id)
                rerun = [e for e in write_starts(events) if e.payload.get("retry")]
                return events if rerun and markers(mfile).count("write:slow.txt") == 2 else None

            # The lease lapses (2 s), the kernel redelivers to the new process,
            # which replays the first steps and re-runs the orphan, which holds.
            during = await eventually(rerun_holding, timeout=60, what="the orphan re-running")
            acked = [e for e in during if e.type == "dispatch.acked"]
            live = acked[-1].payload
            assert len(acked) >= 2 and live["attempt"] > acked[0].payload["attempt"], acked

            # A capture of the first start's generation, posted for the live dispatch, is refused.
            status, text = await agent_post(
                kernel, AGENT, f"/v0/executions/{ex.id}/resources/checkpoints",
                {"captures": [{"key": KEY, "generation": first_gen, "checkpoint_ref": "sha256:" + "0" * 64}]},
                dispatch_id=live["dispatch_id"], attempt=live["attempt"])
            assert status == 204, text
            refused = (await client.all_events(ex.id))[-1]
            assert (refused.type, refused.payload) == (
                "resource.checkpoint_failed", {"key": KEY, "generation": first_gen, "error": "stale_generation"})

            release.write_text("go")
            done = await client.wait(ex.id, timeout=60)
            assert (done.status, done.output) == ("completed", {"answer": "done"}), (done, "".join(second.output))
            events = await client.all_events(ex.id)
            steps = await client.steps(ex.id)
            ranges, points = await read_coverage(client, ex.id, events[-1].event_seq)

        o = Oracle(events)
        types = [e.type for e in events]
        # The same directory: one bind, one create; the redelivery opened it.
        assert types.count("resource.bound") == 1
        marks = markers(mfile)
        assert [m for m in marks if m in ("create", "open")] == ["create", "open"]
        # Earlier steps replayed: the first write ran once, the provider was
        # asked each entry once; the orphan ran twice.
        assert marks.count("write:a.txt") == 2  # entries 1 and 5, once each
        assert [m for m in marks if m.startswith(("write:", "read:"))] == [
            "write:a.txt", "write:slow.txt", "write:slow.txt", "read:a.txt", "write:c.txt", "write:a.txt",
            "write:d.txt", "read:slow.txt", "write:e.txt"]
        assert script.counts() == list(range(9))
        # The orphan re-ran with retry and a higher generation.
        slow = [e for e in write_starts(events) if e.payload["step_id"] == first_start.payload["step_id"]]
        assert len(slow) == 2 and slow[1].payload["retry"] is True and "retry" not in slow[0].payload
        assert o.generation_at(KEY, slow[1].event_seq) > first_gen
        assert slow[1].payload["generations"] == {KEY: o.generation_at(KEY, slow[1].event_seq)}
        # The refusal is in the log between the re-run's start and its outcome.
        refusal = [e for e in events if e.type == "resource.checkpoint_failed"]
        assert [e.event_seq for e in refusal] == [refused.event_seq]
        rerun_done = next(e for e in events if e.type == "step.succeeded"
                          and e.payload["step_id"] == first_start.payload["step_id"])
        assert slow[1].event_seq < refused.event_seq < rerun_done.event_seq
        # Coverage: the first write's capture covers up to the first slow
        # start (coverage_reuse: LLM calls leave it); uncovered from there to
        # the next accepted capture, the re-run's, sent with its outcome.
        accepted = [e for e in events if e.type == "resource.checkpointed"]
        nxt = next(e for e in accepted if e.event_seq > slow[0].event_seq)
        assert nxt.event_seq == rerun_done.event_seq + 1 and nxt.payload["covered_seq"] == rerun_done.event_seq
        assert o.covered(slow[0].event_seq - 1)
        assert not any(o.covered(s) for s in range(slow[0].event_seq, rerun_done.event_seq))
        assert o.covered(rerun_done.event_seq)
        assert_kernel_matches(o, ranges, points)
        # The right directory, and each checkpoint holds the writes before its point.
        ws = writes(events, steps)
        assert files_of(workspace) == contents_at(ws, o.last) == {
            "a.txt": "4", "slow.txt": "2", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
        driver = LocalDirectory(root)
        for c in accepted:
            handle, _ = await driver.create(c.payload["checkpoint_ref"])
            assert files_of(handle.path) == contents_at(ws, c.payload["covered_seq"]), c.payload

        # With the agent stopped, a fork at every event of this log (an orphan
        # with two starts, a refused capture, a reclaimed lease) is inspected.
        second.stop()
        async with kernel.client() as client:
            await fork_everywhere(client, await read_run(client, ex.id), root)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        kernel.stop()
