"""Resources, checkpoints and forks end to end: the SDK with a `LocalDirectory`
resource against the real kernel (docs/protocol/sdk.md §4, docs/protocol/resources.md §5, docs/protocol/forks.md, docs/protocol/conformance.md §3).

Coverage is checked against this module's own oracle (docs/protocol/resources.md §5.1), computed from
the events read back; the kernel is never checked against itself."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rebuno import Agent, CheckpointPolicy, Client, CoveragePoint, CoverageRanges, Event, resource, tool
from rebuno.drivers import LocalDirectory

from .harness import HERE, ChildAgent, KernelProcess, eventually, files_of, markers, register, serve_agent

SECRET = "resources-secret-0123456789"
KEY = "workspace"


# ------------------------------------------------------------------ oracle


def ending_starts(events: list[Event], key: str) -> list[int]:
    """Seqs of the live starts that ended `key`'s coverage: those that raised its generation."""
    return [e.event_seq for e in events if e.type == "step.executing" and key in (e.payload.get("generations") or {})]


def checkpoints(events: list[Event], key: str) -> list[tuple[int, str, int | None]]:
    """(covered_seq, ref, invalidated_seq) of every checkpoint of `key` in a log."""
    starts = ending_starts(events, key)
    out = []
    for e in events:
        if e.type == "resource.checkpointed" and e.payload["key"] == key:
            covered = e.payload["covered_seq"]
            inv = e.payload.get("invalidated_seq")
            if inv is None:
                inv = next((s for s in starts if s > covered), None)
            out.append((covered, e.payload["checkpoint_ref"], inv))
    return sorted(out)


def oracle_point(events: list[Event], s: int) -> tuple[bool, dict[str, tuple[bool, str | None]]]:
    """Coverage at seq s: (covered, key → (covered, restore ref or None))."""
    keys = {e.payload["key"]: e.event_seq for e in events if e.type == "resource.registered"}
    per: dict[str, tuple[bool, str | None]] = {}
    for key, registered in keys.items():
        if registered > s:
            continue
        found = [c for c in checkpoints(events, key) if c[0] <= s]
        if not found:
            per[key] = (False, None)
            continue
        covered_seq, ref, inv = found[-1]
        per[key] = (inv is None or inv > s, ref)
    return all(c for c, _ in per.values()), per


def oracle_ranges(events: list[Event]) -> list[tuple[int, int]]:
    last = events[-1].event_seq
    ranges: list[tuple[int, int]] = []
    for s in range(1, last + 1):
        if not oracle_point(events, s)[0]:
            continue
        if ranges and ranges[-1][1] == s - 1:
            ranges[-1] = (ranges[-1][0], s)
        else:
            ranges.append((s, s))
    return ranges


def seq_of(events: list[Event], type_: str, target: str | None = None, nth: int = 0) -> int:
    found = [e.event_seq for e in events if e.type == type_ and (target is None or e.payload.get("target") == target)]
    return found[nth]


async def assert_coverage_matches_oracle(client: Client, eid: str, events: list[Event]) -> None:
    ranges = await client.coverage(eid)
    assert isinstance(ranges, CoverageRanges)
    assert ranges.covered_ranges == oracle_ranges(events), (ranges.covered_ranges, [
        (e.event_seq, e.type, e.payload) for e in events])
    for s in range(1, events[-1].event_seq + 1):
        point = await client.coverage(eid, at_seq=s)
        assert isinstance(point, CoveragePoint)
        covered, per = oracle_point(events, s)
        assert point.covered == covered, s
        assert {r.key: (r.covered, r.checkpoint_ref) for r in point.resources} == per, s


# ---------------------------------------------------------------- the agent


class Coder:
    """The test agent: three writes and a read through a LocalDirectory
    resource. `log` lists the tool bodies that really ran."""

    def __init__(self, kernel: KernelProcess, root: Path, every_steps: int = 2) -> None:
        self.root = root
        self.every_steps = every_steps
        self.log: list[str] = []
        self.agent = Agent("coder", secret=SECRET, base_url=kernel.url)
        self.agent.bind(self.process)

    async def process(self, task: str) -> dict[str, Any]:
        ws = await resource(KEY, driver=LocalDirectory(self.root),
                            checkpoints=CheckpointPolicy(every_steps=self.every_steps))

        @tool("write_file", resources=[KEY])
        async def write_file(path: str, content: str) -> str:
            """Write a file in the workspace."""
            self.log.append(f"write:{path}")
            await ws.files.write(path, content)
            return f"wrote {path}"

        @tool("read_file")
        async def read_file(path: str) -> str:
            """Read a file from the workspace."""
            self.log.append(f"read:{path}")
            try:
                return str(await ws.files.read(path))
            except FileNotFoundError:
                return "<missing>"

        results = [await write_file("a.txt", "1"), await write_file("b.txt", "2"), await read_file("a.txt"),
                   await write_file("c.txt", "3")]
        return {"answer": "done", "results": results}


async def run_coder(kernel: KernelProcess, coder: Coder, client: Client) -> tuple[str, list[Event]]:
    ex = await client.create("coder", {"task": "write three files"})
    done = await client.wait(ex.id, timeout=30)
    assert done.status == "completed", done
    assert done.output == {"answer": "done", "results": ["wrote a.txt", "wrote b.txt", "1", "wrote c.txt"]}
    return ex.id, await client.all_events(ex.id)


def workspace_of(events: list[Event]) -> str:
    (bound,) = [e for e in events if e.type == "resource.bound"]
    return str(bound.payload["binding"]["path"])


# -------------------------------------------------------------------- tests


async def test_baseline_periodic_and_completion_captures(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    coder = Coder(kernel_proc, tmp_path / "res", every_steps=2)
    async with serve_agent(coder.agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "coder", served.url + "/webhook", SECRET)
        eid, events = await run_coder(kernel_proc, coder, client)

    types = [e.type for e in events]
    reg = events[types.index("resource.registered")]
    assert reg.payload == {"key": KEY, "driver_id": "rebuno.local_directory.v1",
                           "configuration": {"template": None}, "coverage_reuse": False, "every_steps": 2,
                           "on_completion": True}
    # Generations raised by each live start, in order: w1, w2, read, w3.
    starts = [(e.payload["target"], e.payload.get("generations"), e.payload.get("resources"))
              for e in events if e.type == "step.executing"]
    assert starts == [("write_file", {KEY: 1}, [KEY]), ("write_file", {KEY: 2}, [KEY]),
                      ("read_file", {KEY: 3}, None), ("write_file", {KEY: 4}, [KEY])]
    ckpts = [e for e in events if e.type == "resource.checkpointed"]
    assert [c.payload["generation"] for c in ckpts] == [0, 2, 4]  # baseline, periodic, completion
    assert not [e for e in events if e.type == "resource.checkpoint_failed"]
    baseline, periodic, completion = ckpts
    # The baseline right after the bind; the periodic capture with the 2nd
    # write's outcome, in its transaction; the completion capture before complete.
    assert types[types.index("resource.bound") + 1] == "resource.checkpointed"
    w2_done = seq_of(events, "step.succeeded", "write_file", 1)
    assert periodic.event_seq == w2_done + 1 and periodic.payload["covered_seq"] == w2_done
    assert events[-1].type == "execution.completed" and completion.event_seq == events[-2].event_seq
    assert baseline.payload["covered_seq"] == baseline.event_seq

    refs = {c.payload["checkpoint_ref"] for c in ckpts}
    assert len(refs) == 3 and all(r.startswith("sha256:") for r in refs)
    driver = LocalDirectory(tmp_path / "res")
    expected = [{}, {"a.txt": "1", "b.txt": "2"}, {"a.txt": "1", "b.txt": "2", "c.txt": "3"}]
    for c, want in zip(ckpts, expected):
        h, _ = await driver.create(c.payload["checkpoint_ref"])
        assert files_of(h.path) == want
    assert files_of(workspace_of(events)) == expected[-1]
    async with kernel_proc.client() as client:
        await assert_coverage_matches_oracle(client, eid, events)
        steps = await client.steps(eid)
    assert [s.resources for s in steps] == [[KEY], [KEY], [], [KEY]]


async def test_forks_at_covered_and_uncovered_points(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    coder = Coder(kernel_proc, tmp_path / "res", every_steps=2)
    async with serve_agent(coder.agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "coder", served.url + "/webhook", SECRET)
        eid, events = await run_coder(kernel_proc, coder, client)
        ckpts = [e.payload for e in events if e.type == "resource.checkpointed"]
        w1_done = seq_of(events, "step.succeeded", "write_file", 0)
        w2_done = seq_of(events, "step.succeeded", "write_file", 1)
        source_count = len(events)

        # Covered: right after the 2nd write, whose due capture was accepted.
        assert oracle_point(events, w2_done) == (True, {KEY: (True, ckpts[1]["checkpoint_ref"])})
        coder.log.clear()
        covered = await client.fork(eid, at_seq=w2_done)
        assert (covered.forked_from, covered.fork_seq, covered.status) == (eid, w2_done, "running")
        assert covered.restoration == {KEY: {"checkpoint_ref": ckpts[1]["checkpoint_ref"],
                                             "checkpoint_seq": ckpts[1]["covered_seq"], "covered": True}}
        assert covered.resource_keys == [KEY] and covered.agent_id == "coder"
        done = await client.wait(covered.id, timeout=30)
        assert done.status == "completed", done
        assert done.output == {"answer": "done", "results": ["wrote a.txt", "wrote b.txt", "1", "wrote c.txt"]}
        assert coder.log == ["read:a.txt", "write:c.txt"]  # the two copied writes replayed
        fevents = await client.all_events(covered.id)
        ftypes = [e.type for e in fevents]
        assert ftypes[:2] == ["execution.created", "execution.forked"]
        started = ftypes.index("execution.started")
        bound = ftypes.index("resource.bound")
        # Restored a covered state: no baseline before the first live step.
        assert bound > started and ftypes[bound + 1] == "step.proposed"
        assert files_of(workspace_of(fevents)) == {"a.txt": "1", "b.txt": "2", "c.txt": "3"}
        assert workspace_of(fevents) != workspace_of(events)
        live = [e.payload["target"] for e in fevents[started:] if e.type == "step.executing"]
        assert live == ["read_file", "write_file"]

        # Uncovered: after the 1st write. The fork restores the baseline (no
        # a.txt), replays the write anyway, takes its own baseline and runs the
        # rest live. The agent now passes every_steps=1: the recorded 2 wins.
        assert oracle_point(events, w1_done) == (False, {KEY: (False, ckpts[0]["checkpoint_ref"])})
        coder.log.clear()
        coder.every_steps = 1
        uncovered = await client.fork(eid, at_seq=w1_done)
        assert uncovered.restoration == {KEY: {"checkpoint_ref": ckpts[0]["checkpoint_ref"],
                                               "checkpoint_seq": ckpts[0]["covered_seq"], "covered": False}}
        done = await client.wait(uncovered.id, timeout=30)
        assert done.status == "completed", done
        assert done.output == {"answer": "done",
                               "results": ["wrote a.txt", "wrote b.txt", "<missing>", "wrote c.txt"]}
        assert coder.log == ["write:b.txt", "read:a.txt", "write:c.txt"]
        uevents = await client.all_events(uncovered.id)
        assert files_of(workspace_of(uevents)) == {"b.txt": "2", "c.txt": "3"}  # restored + live writes
        init = [e.payload for e in uevents if e.type == "resource.initialized"]
        assert init == [{"key": KEY, "generation": 2, "checkpoint_ref": ckpts[0]["checkpoint_ref"]}]
        reg = [e.payload for e in uevents if e.type == "resource.registered"]
        assert reg[0]["every_steps"] == 2
        started = [e.type for e in uevents].index("execution.started")
        own = [e for e in uevents[started:] if e.type == "resource.checkpointed"]
        # Its baseline (generation 2 = source's 1 + 1), then the 2nd live write
        # (b.txt is the 1st: the fork's counter starts at 0) is due.
        assert [c.payload["generation"] for c in own] == [2, 5]
        due_start = [e for e in uevents[started:] if e.type == "step.executing"][2]
        assert due_start.payload["generations"] == {KEY: 5}
        assert own[1].payload["covered_seq"] == due_start.event_seq + 1
        await assert_coverage_matches_oracle(client, uncovered.id, uevents)

        forks = await client.list_forks(eid)
        assert [f.id for f in forks.executions] == [uncovered.id, covered.id]
        assert all(f.forked_from == eid for f in forks.executions)
        assert len(await client.all_events(eid)) == source_count  # the source is never modified


async def test_checkpoint_unavailable_fails_the_fork(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    coder = Coder(kernel_proc, tmp_path / "res", every_steps=2)
    async with serve_agent(coder.agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "coder", served.url + "/webhook", SECRET)
        eid, events = await run_coder(kernel_proc, coder, client)
        periodic = [e.payload for e in events if e.type == "resource.checkpointed"][1]
        os.unlink(LocalDirectory(tmp_path / "res").snapshot_path(periodic["checkpoint_ref"]))
        coder.log.clear()
        fork = await client.fork(eid, at_seq=periodic["covered_seq"])
        done = await client.wait(fork.id, timeout=30)
        assert done.status == "failed"
        assert done.failure_reason is not None and done.failure_reason.startswith(
            f'checkpoint_unavailable: resource "workspace": local snapshot {periodic["checkpoint_ref"]} '
            "is missing or damaged: the manifest does not exist")
        fevents = await client.all_events(fork.id)
        started = [e.type for e in fevents].index("execution.started")
        assert not [e for e in fevents[started:] if e.type in ("step.executing", "resource.bound")]
        assert coder.log == []
        assert len(await client.all_events(eid)) == len(events)
        assert (await client.get(eid)).status == "completed"


def resource_agent(kernel: KernelProcess, agent_id: str, mfile: Path, root: Path,
                   env: dict[str, str] | None = None) -> ChildAgent:
    """`resource_agent_app.py` in a child process."""
    return ChildAgent(HERE / "resource_agent_app.py", kernel, agent_id, SECRET,
                      env={"MARKERS": str(mfile), "REBUNO_LOCAL_RESOURCES": str(root), **(env or {})})


async def test_kill_mid_tool_call_reopens_the_same_directory(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    mfile, root = tmp_path / "markers", tmp_path / "res"
    first = resource_agent(kernel_proc, "crasher", mfile, root)
    second: ChildAgent | None = None
    try:
        await register(kernel_proc, "crasher", await first.webhook(), SECRET)
        async with kernel_proc.client() as client:
            ex = await client.create("crasher", {"task": "crash"})
            await eventually(lambda: "slow:slow.txt" in markers(mfile), timeout=30, what="slow write")
            bound = await eventually(lambda: _bound_path(client, ex.id), what="binding")
            assert Path(bound, "slow.txt").read_text() == "2"
            first.kill()  # SIGKILL mid tool call: nothing reported, the step stays executing
            second = resource_agent(kernel_proc, "crasher", mfile, root, {"RELEASE": "1"})
            await register(kernel_proc, "crasher", await second.webhook(), SECRET)
            await kernel_proc.advance(121)  # the killed attempt's lease lapses; the kernel redelivers
            done = await client.wait(ex.id, timeout=60)
            assert done.status == "completed", (done, "".join(second.output))
            assert done.output == {"task": "crash", "results": ["wrote a.txt", "wrote slow.txt slowly", "wrote c.txt"]}
            events = await client.all_events(ex.id)

            marks = markers(mfile)
            # One create, then the redelivery opened the recorded binding; the
            # first write replayed, the orphaned slow write ran again.
            assert [m for m in marks if m in ("create", "open")] == ["create", "open"]
            assert marks.count("write:a.txt") == 1 and marks.count("slow:slow.txt") == 2
            assert [e.type for e in events].count("resource.bound") == 1
            assert files_of(bound) == {"a.txt": "1", "slow.txt": "2", "c.txt": "3"}
            slow = [e for e in events if e.type == "step.executing" and e.payload["target"] == "slow_write"]
            assert len(slow) == 2 and "retry" not in slow[0].payload and slow[1].payload["retry"] is True
            assert slow[1].payload["generations"][KEY] > slow[0].payload["generations"][KEY]
            # Uncovered from the first slow start until the re-run's capture.
            gap_end = next(e.event_seq for e in events if e.type == "resource.checkpointed"
                           and e.event_seq > slow[1].event_seq)
            for s in range(slow[0].event_seq, gap_end - 1):
                assert not oracle_point(events, s)[0], s
            point = await client.coverage(ex.id, at_seq=slow[0].event_seq)
            assert isinstance(point, CoveragePoint) and point.covered is False
            assert point.resources[0].reason == "step_started"
            await assert_coverage_matches_oracle(client, ex.id, events)
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def _bound_path(client: Client, eid: str) -> str | None:
    events = await client.all_events(eid)
    found = [e for e in events if e.type == "resource.bound"]
    return str(found[0].payload["binding"]["path"]) if found else None


def _overlapping(spans: list[tuple[float, float]], tolerance: float = 0.05) -> bool:
    spans = sorted(spans)
    return any(spans[i + 1][0] < spans[i][1] - tolerance for i in range(len(spans) - 1))


async def test_tools_are_serialised_only_while_a_resource_exists(kernel_proc: KernelProcess,
                                                                 tmp_path: Path) -> None:
    spans: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    agent = Agent("serial", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process(with_resource: bool) -> list[int]:
        if with_resource:
            await resource(KEY, driver=LocalDirectory(tmp_path / "res"))

        @tool("nap")
        async def nap(i: int) -> int:
            """Sleep a little."""
            t0 = time.monotonic()
            await asyncio.sleep(0.2)
            spans[with_resource].append((t0, time.monotonic()))
            return i

        return list(await asyncio.gather(*(nap(i) for i in range(4))))

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "serial", served.url + "/webhook", SECRET)
        for flag in (True, False):
            ex = await client.create("serial", {"with_resource": flag})
            done = await client.wait(ex.id, timeout=30)
            assert (done.status, done.output) == ("completed", [0, 1, 2, 3])
    assert len(spans[True]) == 4 and not _overlapping(spans[True])
    assert len(spans[False]) == 4 and _overlapping(spans[False])


async def test_a_nested_due_capture_goes_with_the_outer_outcome(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    agent = Agent("nester", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process() -> list[str]:
        ws = await resource(KEY, driver=LocalDirectory(tmp_path / "res"))

        @tool("put", resources=[KEY])
        async def put(path: str) -> str:
            """Write one file."""
            await ws.files.write(path, path)
            return path

        @tool("put_two")
        async def put_two() -> list[str]:
            """Write two files through another tool."""
            return [await put("x.txt"), await put("y.txt")]

        return await asyncio.wait_for(put_two(), 20)

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "nester", served.url + "/webhook", SECRET)
        ex = await client.create("nester", {})
        done = await client.wait(ex.id, timeout=30)
        assert (done.status, done.output) == ("completed", ["x.txt", "y.txt"])
        events = await client.all_events(ex.id)
    after = {events[i].payload.get("target"): events[i + 1].type for i, e in enumerate(events[:-1])
             if e.type == "step.succeeded"}
    assert after == {"put": "step.succeeded", "put_two": "resource.checkpointed"}
    outer_ckpt = [e for e in events if e.type == "resource.checkpointed"][1]
    last_start = [e for e in events if e.type == "step.executing"][-1]
    assert outer_ckpt.payload["generation"] == last_start.payload["generations"][KEY] == 3
    assert not [e for e in events if e.type == "resource.checkpoint_failed"]
    h, _ = await LocalDirectory(tmp_path / "res").create(outer_ckpt.payload["checkpoint_ref"])
    assert files_of(h.path) == {"x.txt": "x.txt", "y.txt": "y.txt"}


async def test_a_changed_configuration_fails_a_later_dispatch(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    template = tmp_path / "template"
    template.mkdir()
    holding = asyncio.Event()
    first = Agent("changer", secret=SECRET, base_url=kernel_proc.url)

    @first.bind
    async def process_one() -> str:
        await resource(KEY, driver=LocalDirectory(tmp_path / "res"))

        @tool("hold", resources=[KEY])
        async def hold() -> str:
            """Hold until the agent closes."""
            holding.set()
            await asyncio.Event().wait()
            return "never"

        return await hold()

    second = Agent("changer", secret=SECRET, base_url=kernel_proc.url)

    @second.bind
    async def process_two() -> str:
        await resource(KEY, driver=LocalDirectory(tmp_path / "res", template=template))
        return "opened"

    async with kernel_proc.client() as client:
        async with serve_agent(first) as served:
            await register(kernel_proc, "changer", served.url + "/webhook", SECRET)
            ex = await client.create("changer", {})
            await asyncio.wait_for(holding.wait(), 20)
        # The first agent is gone (its handler cancelled, nothing reported).
        async with serve_agent(second) as served:
            await register(kernel_proc, "changer", served.url + "/webhook", SECRET)
            await kernel_proc.advance(121)
            done = await client.wait(ex.id, timeout=30)
    assert done.status == "failed"
    assert done.failure_reason is not None
    assert done.failure_reason.startswith('agent_error: ValueError: resource "workspace" is registered with')
    assert '{"template":null}' in done.failure_reason and str(template) in done.failure_reason


async def test_coverage_reuse_keeps_coverage_across_undeclared_steps(kernel_proc: KernelProcess,
                                                                    tmp_path: Path) -> None:
    agent = Agent("reuser", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process() -> str:
        ws = await resource(KEY, driver=LocalDirectory(tmp_path / "res", coverage_reuse=True))

        @tool("write_file", resources=[KEY])
        async def write_file(path: str) -> str:
            """Write."""
            await ws.files.write(path, path)
            return path

        @tool("read_file")
        async def read_file(path: str) -> str:
            """Read."""
            return str(await ws.files.read(path))

        await write_file("a.txt")
        await read_file("a.txt")
        await write_file("b.txt")
        return await read_file("b.txt")

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "reuser", served.url + "/webhook", SECRET)
        ex = await client.create("reuser", {})
        done = await client.wait(ex.id, timeout=30)
        assert (done.status, done.output) == ("completed", "b.txt")
        events = await client.all_events(ex.id)
        # Reads raise no generation; each write is due (every_steps=1) and captured.
        starts = [(e.payload["target"], e.payload.get("generations")) for e in events if e.type == "step.executing"]
        assert starts == [("write_file", {KEY: 1}), ("read_file", None), ("write_file", {KEY: 2}),
                          ("read_file", None)]
        gens = [e.payload["generation"] for e in events if e.type == "resource.checkpointed"]
        assert gens == [0, 1, 2]  # baseline and two periodic captures; still covered at the end
        ranges = await client.coverage(ex.id)
        assert isinstance(ranges, CoverageRanges)
        assert ranges.covered_ranges == oracle_ranges(events)
        assert ranges.covered(events[-1].event_seq)
        assert ranges.covered(seq_of(events, "step.executing", "read_file", 0))


async def test_an_open_failure_fails_and_a_fork_recovers(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    holding = asyncio.Event()

    def make(hold: bool) -> Agent:
        agent = Agent("opener", secret=SECRET, base_url=kernel_proc.url)

        @agent.bind
        async def process() -> dict[str, str]:
            ws = await resource(KEY, driver=LocalDirectory(tmp_path / "res"))

            @tool("write_file", resources=[KEY])
            async def write_file(path: str) -> str:
                """Write."""
                await ws.files.write(path, path)
                return path

            @tool("wait_here", resources=[KEY])
            async def wait_here() -> str:
                """Hold while the test needs it."""
                if hold:
                    holding.set()
                    await asyncio.Event().wait()
                return "passed"

            await write_file("a.txt")
            await wait_here()
            await write_file("b.txt")
            return files_of(ws.path)

        return agent

    async with kernel_proc.client() as client:
        async with serve_agent(make(True)) as served:
            await register(kernel_proc, "opener", served.url + "/webhook", SECRET)
            ex = await client.create("opener", {})
            await asyncio.wait_for(holding.wait(), 20)
        events = await client.all_events(ex.id)
        workspace = workspace_of(events)
        for name in os.listdir(workspace):
            os.unlink(os.path.join(workspace, name))
        os.rmdir(workspace)  # the live resource is lost
        async with serve_agent(make(False)) as served:
            await register(kernel_proc, "opener", served.url + "/webhook", SECRET)
            await kernel_proc.advance(121)
            done = await client.wait(ex.id, timeout=30)
            assert done.status == "failed" and done.failure_reason is not None
            assert done.failure_reason.startswith("agent_error: FileNotFoundError:"), done.failure_reason
            assert workspace in done.failure_reason
            events = await client.all_events(ex.id)
            assert [e.type for e in events].count("resource.bound") == 1  # no rebind
            # The explicit recovery: fork at the last covered point.
            last_covered = seq_of(events, "step.succeeded", "write_file", 0)
            assert oracle_point(events, last_covered)[0]
            fork = await client.fork(ex.id, at_seq=last_covered)
            assert fork.restoration is not None and fork.restoration[KEY]["covered"] is True
            fdone = await client.wait(fork.id, timeout=30)
            assert (fdone.status, fdone.output) == ("completed", {"a.txt": "a.txt", "b.txt": "b.txt"})
