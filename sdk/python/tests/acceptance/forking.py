"""Forking a finished run at every event, with its agent stopped (docs/protocol/conformance.md §3
scenario 1): each fork is inspected against the oracle, never run, then
cancelled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rebuno import Client, CoveragePoint, CoverageRanges, Event, Step
from rebuno.drivers import LocalDirectory

from ..e2e.harness import files_of
from .oracle import Oracle, Write, assert_kernel_matches, check_fork_log, contents_at, expected_fork, writes


@dataclass
class Run:
    id: str
    events: list[Event]
    steps: list[Step]  # in recording order
    oracle: Oracle
    writes: list[Write]


async def read_run(client: Client, eid: str) -> Run:
    events = await client.all_events(eid)
    steps = await client.steps(eid)
    return Run(eid, events, steps, Oracle(events), writes(events, steps))


async def coverage_ranges(client: Client, eid: str) -> CoverageRanges:
    """The kernel's covered ranges of an execution's whole log."""
    ranges = await client.coverage(eid)
    assert isinstance(ranges, CoverageRanges)
    return ranges


async def read_coverage(client: Client, eid: str, last_seq: int) -> tuple[CoverageRanges, dict[int, CoveragePoint]]:
    """The kernel's coverage of a run: its ranges, and the point at every event up to `last_seq`."""
    points: dict[int, CoveragePoint] = {}
    for s in range(1, last_seq + 1):
        point = await client.coverage(eid, at_seq=s)
        assert isinstance(point, CoveragePoint)
        points[s] = point
    return await coverage_ranges(client, eid), points


async def fork_everywhere(client: Client, run: Run, root: Path) -> None:
    """Fork at every seq with the agent stopped; inspect each fork, then cancel it."""
    o = run.oracle
    driver = LocalDirectory(root)
    source = await client.get(run.id)
    covered_forks = 0
    made = []
    for s in range(1, o.last + 1):
        plan = expected_fork(o, s)
        fork = await client.fork(run.id, at_seq=s)
        made.append(fork.id)
        assert (fork.forked_from, fork.fork_seq, fork.status) == (run.id, s, "running")
        assert (fork.agent_id, fork.input) == (source.agent_id, source.input)
        assert fork.resource_keys == plan.keys
        want_restoration = {k: plan.point.keys[k].restoration() for k in plan.keys}
        assert (fork.restoration or {}) == want_restoration, (s, fork.restoration, want_restoration)
        for key in plan.keys:
            newest = [c for c in o.checkpoints[key] if c.covered_seq <= s]
            assert fork.restoration is not None
            got = fork.restoration[key]
            assert got.get("checkpoint_seq") == (newest[-1].covered_seq if newest else None)
            assert got["covered"] is o.key_point(key, s).covered
        fevents = await client.all_events(fork.id)
        check_fork_log(o, plan, fevents, fork.id, run.id)

        # The restore: exactly the oracle's contents at the checkpoint, and at
        # a covered point exactly the contents at the seq.
        for key in plan.keys:
            kp = plan.point.keys[key]
            if kp.ref is None:
                handle, _ = await driver.create()
                assert files_of(handle.path) == {}
            else:
                handle, _ = await driver.create(kp.ref)
                assert kp.checkpoint_seq is not None
                assert files_of(handle.path) == contents_at(run.writes, kp.checkpoint_seq), s
            if kp.covered:
                assert files_of(handle.path) == contents_at(run.writes, s), s
        if plan.keys and plan.point.covered:
            covered_forks += 1

        await client.cancel(fork.id)
        after = await client.all_events(fork.id)
        started = [e.type for e in after].index("execution.started")
        assert not [e for e in after[started:] if e.type in ("resource.bound", "step.executing", "step.proposed")]
        read_back = await client.get(fork.id)
        assert read_back.status == "cancelled" and (read_back.restoration or {}) == want_restoration
        # The kernel answers for the fork's own log as the oracle does.
        assert_kernel_matches(Oracle(after), await coverage_ranges(client, fork.id), {})
    first_registered = min(o.registered.values())
    assert covered_forks == sum(1 for s in range(first_registered, o.last + 1) if o.covered(s)) > 0
    assert len(await client.all_events(run.id)) == o.last  # the source never changes
    listed: list[str] = []
    cursor = None
    while True:
        page = await client.list_forks(run.id, cursor=cursor, limit=50)
        assert all(f.forked_from == run.id for f in page.executions)
        listed += [f.id for f in page.executions]
        cursor = page.next_cursor
        if not cursor:
            break
    assert set(made) <= set(listed) and len(listed) == len(set(listed))
