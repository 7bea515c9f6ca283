"""Issue 11 item 6: resources, checkpoints and forks with the published client, unchanged
(docs/protocol/conformance.md §3 scenario 14; docs/protocol/conformance.md §2.1 items 4 and 6).

The agent (agents/workspace_agent.py) is a framework-free tool loop over the chat
completions wire through ``rebuno.http_client()``, with ``write_file`` (declares
the workspace) and ``read_file`` over ``resource("workspace")`` opened on the test
tree's own directory driver (agents/dirdriver.py). The scripted server
(tool_llm.py) answers by the number of tool results in the conversation, so a
fork's live calls get the answers its source got at the same turn.

0.29.2's own semantics apply: without a ``CheckpointPolicy`` it registers
``every_steps`` 0 and captures nothing; with one it takes a baseline after a
``create`` (or an ``open``) that finds the resource uncovered, captures the
keys a ``proceed`` says are due and sends them with the step's outcome, and
captures at completion when the resource is uncovered; ``CheckpointUnavailable``
from ``create`` fails the execution as ``agent_error: CheckpointUnavailable: …``.

Every assertion on coverage is the oracle's (coverage_oracle.py), computed from
the events read back, and the kernel's ``GET …/coverage`` answers are checked
against it at every seq of every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from rebuno import Client, ConflictError
from rebuno._kernel import DispatchLease, KernelClient
from rebuno.types import Execution, Resource

from agents.dirdriver import DRIVER_ID, DirDriver, read_tree
from coverage_oracle import ForkMap, Oracle
from kernel_harness import AgentProcess, Kernel, Records, parse_with_models
from tool_llm import ToolLLM, tool_turns

AGENT = "workspace-agent"
CONFIGURATION = {"format": "compat-dir-1"}


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture
def tool_llm() -> Iterator[ToolLLM]:
    server = ToolLLM().start()
    yield server
    server.stop()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "resources"


def spawn_workspace_agent(spawn_agent: Any, llm: ToolLLM, root: Path, **env: Any) -> AgentProcess:
    full = {"COMPAT_LLM_URL": llm.url, "COMPAT_RESOURCE_ROOT": str(root)}
    full.update({k: str(v) for k, v in env.items()})
    return spawn_agent("workspace_agent.py", AGENT, env=full)


def run(kernel: Kernel, task: str = "edit the workspace") -> tuple[str, dict[str, Any]]:
    eid = kernel.create_execution(AGENT, {"task": task})["id"]
    ex = kernel.wait_status(eid)
    return eid, ex


def check_coverage(kernel: Kernel, eid: str) -> Oracle:
    """The oracle of an execution from its events, checked against every point
    answer, the ranges answer and the at_seq bounds of ``GET …/coverage``."""
    events = kernel.events(eid)
    oracle = Oracle(events)
    for s in range(1, oracle.last_seq + 1):
        got = kernel.get_json(f"/v0/executions/{eid}/coverage?at_seq={s}")
        want = oracle.point(eid, s)
        assert got == want, f"{eid} coverage at {s}:\n got  {got}\n want {want}"
    got = kernel.get_json(f"/v0/executions/{eid}/coverage")
    assert got == oracle.ranges(eid), f"{eid} ranges:\n got  {got}\n want {oracle.ranges(eid)}"
    for bad in (0, oracle.last_seq + 1):
        r = kernel.request("GET", f"/v0/executions/{eid}/coverage?at_seq={bad}")
        assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text
    oracle.check_generations()
    return oracle


def step_rows(kernel: Kernel, eid: str) -> dict[str, dict[str, Any]]:
    return {s["step_id"]: s for s in kernel.steps(eid)}


def write_log(kernel: Kernel, oracle: Oracle, eid: str, after: int = 0) -> list[tuple[int, str, str]]:
    """(seq of step.succeeded, path, content) of each write_file that succeeded
    after seq ``after``."""
    rows = step_rows(kernel, eid)
    out = []
    for e in oracle.of_type("step.succeeded"):
        s = rows[e["payload"]["step_id"]]
        if e["event_seq"] > after and s["target"] == "write_file":
            out.append((e["event_seq"], s["args"]["path"], s["args"]["content"]))
    return out


def contents_at(writes: list[tuple[int, str, str]], s: int, start: dict[str, str] | None = None) -> dict[str, str]:
    """The workspace the oracle expects at seq s: the writes whose step.succeeded
    is at or before s, over ``start``."""
    files = dict(start or {})
    for seq, path, content in writes:
        if seq <= s:
            files[path] = content
    return files


def workspace_of(oracle: Oracle) -> dict[str, str]:
    """The files of the directory an execution bound (its resource.bound)."""
    (bound,) = oracle.of_type("resource.bound")
    return read_tree(bound["payload"]["binding"]["path"])


class Materialiser:
    """Restores checkpoint refs with a test-side instance of the driver (the same
    root as the agent's) and reads the trees back; one restore per ref."""

    def __init__(self, root: Path):
        self.driver = DirDriver(root)
        self._cache: dict[str, dict[str, str]] = {}

    def __call__(self, ref: str | None) -> dict[str, str]:
        if ref is None:
            return {}
        if ref not in self._cache:
            handle, binding = self.driver.create(ref)
            assert binding == {"path": str(handle.path)}
            self._cache[ref] = read_tree(handle.path)
        return self._cache[ref]


def own_checkpoints(oracle: Oracle) -> list[dict[str, Any]]:
    begin = oracle.started_seq()
    return [e for e in oracle.of_type("resource.checkpointed") if e["event_seq"] > begin]


def step_history(kernel: Kernel, oracle: Oracle, eid: str) -> list[dict[str, Any]]:
    """The execution's steps in the order of their first step.executing, each with
    the seqs of its starts and of its terminal event."""
    rows = step_rows(kernel, eid)
    out: dict[str, dict[str, Any]] = {}
    for e in oracle.events:
        sid = e["payload"].get("step_id") if isinstance(e["payload"], dict) else None
        if sid is None or not e["type"].startswith("step."):
            continue
        entry = out.setdefault(sid, {**rows[sid], "starts": [], "terminal": None, "start_payloads": []})
        if e["type"] == "step.executing":
            entry["starts"].append(e["event_seq"])
            entry["start_payloads"].append(e["payload"])
        elif e["type"] in ("step.succeeded", "step.failed", "step.denied"):
            entry["terminal"] = e["event_seq"]
    return list(out.values())


def check_fork(
    source: Oracle,
    source_id: str,
    fork: dict[str, Any],
    fork_oracle: Oracle,
    s: int,
) -> ForkMap:
    """The fork's Execution, restoration and log against the source's oracle
    (docs/protocol/forks.md §2, §3), and its coverage at every position of its creation transaction
    against the source's (docs/protocol/forks.md §3: a copied position answers as the last source seq
    mapping to it does; later ones as the source at s does)."""
    fid = fork["id"]
    assert fork["forked_from"] == source_id and fork["fork_seq"] == s
    regs = [r for r in source.registrations if r.registered_seq <= s]
    assert fork["resource_keys"] == [r.key for r in regs]

    restoration: dict[str, Any] = {}
    for r in regs:
        c = source.newest(r.key, s)
        entry: dict[str, Any] = {"covered": source.key_covered(r.key, s)}
        if c is not None:
            entry.update(checkpoint_ref=c.ref, checkpoint_seq=c.covered_seq)
        restoration[r.key] = entry
    assert fork["restoration"] == restoration, f"fork at {s}"

    fm = ForkMap(source.events, s)
    ev = fork_oracle.events
    assert ev[0]["type"] == "execution.created"
    assert ev[1]["type"] == "execution.forked"
    assert ev[1]["payload"] == {"source_execution_id": source_id, "fork_seq": s, "restoration": restoration}
    # The kept source events, renumbered from 3, with copied step ids.
    ids: dict[str, str] = {}
    for kept, copy in zip(fm.kept, ev[2 : fm.last_copied], strict=True):
        assert copy["type"] == kept["type"] and copy["occurred_at"] == kept["occurred_at"], (kept, copy)
        a, b = dict(kept["payload"]), dict(copy["payload"])
        if "step_id" in a:
            old, new = a.pop("step_id"), b.pop("step_id")
            assert ids.setdefault(old, new) == new and new != old
        assert a == b, (kept, copy)
    rest = ev[fm.last_copied :]
    # One resource.initialized per copied resource: the generation at s, plus 1
    # when uncovered, and the restore ref.
    for r, init in zip(regs, rest[: len(regs)], strict=True):
        assert init["type"] == "resource.initialized"
        covered = source.key_covered(r.key, s)
        want = {"key": r.key, "generation": source.generation(r.key, s) + (0 if covered else 1)}
        if (c := source.newest(r.key, s)) is not None:
            want["checkpoint_ref"] = c.ref
        assert init["payload"] == want, f"fork at {s}"
    rest = rest[len(regs) :]
    # The copied checkpoints, with mapped seqs.
    want_copies: list[dict[str, Any]] = []
    for r in regs:
        for c in sorted(
            (c for c in source.checkpoints if c.key == r.key and c.covered_seq <= s), key=lambda c: c.covered_seq
        ):
            copy = {
                "key": c.key,
                "generation": c.generation,
                "checkpoint_ref": c.ref,
                "covered_seq": fm.map(c.covered_seq),
            }
            if c.invalidated is not None and c.invalidated <= s:
                copy["invalidated_seq"] = fm.map(c.invalidated)
            if (
                want_copies
                and want_copies[-1]["key"] == c.key
                and want_copies[-1]["covered_seq"] == copy["covered_seq"]
            ):
                want_copies[-1] = copy
            else:
                want_copies.append(copy)
    got_copies = [e["payload"] for e in rest[: len(want_copies)]]
    assert all(e["type"] == "resource.checkpointed" for e in rest[: len(want_copies)])
    assert got_copies == want_copies, f"fork at {s}"
    rest = rest[len(want_copies) :]
    assert [e["type"] for e in rest[:2]] == ["execution.started", "dispatch.queued"]
    queued = rest[1]["event_seq"]

    for p in range(1, queued + 1):
        mine = fork_oracle.point(fid, p)
        x = fm.last_source_seq(p) if p <= fm.last_copied else s
        if x is None:
            assert mine["resources"] == [] and mine["covered"], f"fork at {s}, position {p}"
            continue
        theirs = source.point(source_id, x)
        assert mine["covered"] == theirs["covered"], f"fork at {s}, position {p} (source {x})"
        assert [(r["key"], r["covered"], r.get("checkpoint_ref")) for r in mine["resources"]] == [
            (r["key"], r["covered"], r.get("checkpoint_ref")) for r in theirs["resources"]
        ], f"fork at {s}, position {p} (source {x})"
        assert [r.get("checkpoint_seq") for r in mine["resources"]] == [
            fm.map(r["checkpoint_seq"]) if "checkpoint_seq" in r else None for r in theirs["resources"]
        ]
    return fm


def live_steps(kernel: Kernel, oracle: Oracle, eid: str) -> list[dict[str, Any]]:
    """A fork's steps whose step.executing comes after its execution.started."""
    begin = oracle.started_seq()
    return [s for s in step_history(kernel, oracle, eid) if s["starts"] and s["starts"][0] > begin]


def driver_calls(records: Records, event: str, eid: str) -> list[dict[str, Any]]:
    return [r for r in records.of(event) if r.get("eid") == eid]


# ---------------------------------------------------------------------------
# Without a CheckpointPolicy
# ---------------------------------------------------------------------------


async def test_resource_without_policy_captures_nothing(kernel, spawn_agent, records, tool_llm, root):
    """0.29.2 without a CheckpointPolicy: it registers every_steps 0 and
    on_completion false, creates and binds on first use, and never captures; the
    resource is uncovered from its registration on, and a fork restores the
    initial environment (create() with no ref) and replays its copies."""
    spawn_workspace_agent(spawn_agent, tool_llm, root)
    eid, ex = run(kernel)
    assert ex["status"] == "completed", ex
    assert ex["output"] == {"answer": "done"}
    assert ex["resource_keys"] == ["workspace"]

    oracle = check_coverage(kernel, eid)
    (reg,) = oracle.of_type("resource.registered")
    assert reg["payload"] == {
        "key": "workspace",
        "driver_id": DRIVER_ID,
        "configuration": CONFIGURATION,
        "coverage_reuse": False,
        "every_steps": 0,
        "on_completion": False,
    }
    types = [e["type"] for e in oracle.events]
    assert types[reg["event_seq"]] == "resource.bound"  # bound right after, on first use
    assert "resource.checkpointed" not in types and "resource.checkpoint_failed" not in types
    assert driver_calls(records, "driver:checkpoint", eid) == []
    assert [c["ref"] for c in driver_calls(records, "driver:create", eid)] == [None]
    # Covered only before the resource existed.
    assert oracle.ranges(eid)["covered_ranges"] == [[1, reg["event_seq"] - 1]]
    assert all(
        kernel.get_json(f"/v0/executions/{eid}/coverage?at_seq={s}")["resources"][0]["reason"] == "no_checkpoint"
        for s in (reg["event_seq"], oracle.last_seq)
    )
    assert workspace_of(oracle) == {"a.txt": "4", "b.txt": "2", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
    # Every tool and LLM submit declared what it touches; write_file the workspace.
    for st in step_history(kernel, oracle, eid):
        assert st["resources"] == (["workspace"] if st["target"] == "write_file" else [])

    # A fork after the second write: nothing to restore, so create() gets no ref;
    # the first two writes replay without running, and their files are absent.
    writes = write_log(kernel, oracle, eid)
    s = writes[1][0]
    n0 = tool_llm.count
    async with Client(base_url=kernel.url) as client:
        fork = await client.fork(eid, at_seq=s)
    assert isinstance(fork, Execution) and fork.forked_from == eid and fork.fork_seq == s
    assert fork.restoration == {"workspace": {"covered": False}}
    done = kernel.wait_status(fork.id)
    assert done["status"] == "completed" and done["output"] == {"answer": "done"}, done
    fo = check_coverage(kernel, fork.id)
    check_fork(oracle, eid, done, fo, s)
    assert [c["ref"] for c in driver_calls(records, "driver:create", fork.id)] == [None]
    assert [r["path"] for r in driver_calls(records, "tool:write_file", fork.id)] == [
        "c.txt",
        "a.txt",
        "d.txt",
        "e.txt",
    ]
    assert workspace_of(fo) == {"c.txt": "3", "a.txt": "4", "d.txt": "5", "e.txt": "6"}
    assert own_checkpoints(fo) == [] and "resource.checkpoint_failed" not in [e["type"] for e in fo.events]
    assert tool_llm.count - n0 == len([s for s in live_steps(kernel, fo, fork.id) if s["kind"] == "llm_call"])
    parse_with_models(kernel, eid)
    parse_with_models(kernel, fork.id)


# ---------------------------------------------------------------------------
# Scenario 1b: the policy flow, forks at every seq and at every step boundary
# ---------------------------------------------------------------------------


async def test_policy_flow_and_forks(kernel, spawn_agent, records, tool_llm, root):
    """CheckpointPolicy(every_steps=5): register, create and bind on first use;
    a baseline publish; the 5th write's due capture sent with its outcome at
    the generation its proceed gave; a completion capture. Then a fork at every
    event seq (agent stopped: inspected, then cancelled) and a fork at every step
    boundary run to completion."""
    agent = spawn_workspace_agent(spawn_agent, tool_llm, root, COMPAT_EVERY_STEPS=5)
    eid, ex = run(kernel)
    assert ex["status"] == "completed" and ex["output"] == {"answer": "done"}, ex
    oracle = check_coverage(kernel, eid)
    events = oracle.events
    types = [e["type"] for e in events]
    (reg,) = oracle.of_type("resource.registered")
    assert reg["payload"]["every_steps"] == 5 and reg["payload"]["on_completion"] is True
    r = reg["event_seq"]
    assert types[r : r + 2] == ["resource.bound", "resource.checkpointed"]

    steps = step_history(kernel, oracle, eid)
    writes = [s for s in steps if s["target"] == "write_file"]
    assert [w["args"]["path"] for w in writes] == ["a.txt", "b.txt", "c.txt", "a.txt", "d.txt", "e.txt"]
    assert all(len(w["starts"]) == 1 and w["status"] == "succeeded" for w in writes)
    ckpts = oracle.of_type("resource.checkpointed")
    assert len(ckpts) == 3
    baseline, periodic, completion = (c["payload"] for c in ckpts)
    # The baseline: published right after the bind, at generation 0, covering
    # from its own event.
    assert baseline["generation"] == 0 and baseline["covered_seq"] == r + 2
    # The 5th write's due capture travels with its outcome: the checkpoint event
    # directly follows its step.succeeded, covers from it, at the generation
    # that write's start raised the workspace to.
    fifth = writes[4]
    assert periodic["covered_seq"] == fifth["terminal"] and ckpts[1]["event_seq"] == fifth["terminal"] + 1
    assert periodic["generation"] == fifth["start_payloads"][0]["generations"]["workspace"]
    # No other write was due: no checkpoint follows any other outcome.
    for w in writes[:4] + writes[5:]:
        assert types[w["terminal"]] != "resource.checkpointed"
    # The completion capture: the final LLM call left it uncovered; published
    # just before execution.completed, at the generation of that call's start.
    assert ckpts[2]["event_seq"] == oracle.last_seq - 1 and completion["covered_seq"] == oracle.last_seq - 1
    last_llm = [s for s in steps if s["kind"] == "llm_call"][-1]
    assert completion["generation"] == last_llm["start_payloads"][0]["generations"]["workspace"]
    assert types[-1] == "execution.completed"

    # The driver was called exactly for these, and the refs it returned are the
    # ones recorded; each captured exactly the oracle's contents there.
    wlog = write_log(kernel, oracle, eid)
    calls = driver_calls(records, "driver:checkpoint", eid)
    assert [c["ref"] for c in calls] == [c["checkpoint_ref"] for c in (baseline, periodic, completion)]
    for call, c in zip(calls, (baseline, periodic, completion), strict=True):
        assert call["files"] == contents_at(wlog, c["covered_seq"])
    assert [c["ref"] for c in driver_calls(records, "driver:create", eid)] == [None]
    final = workspace_of(oracle)
    assert (
        final
        == contents_at(wlog, oracle.last_seq)
        == {"a.txt": "4", "b.txt": "2", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
    )

    # Every checkpoint restores exactly what the oracle says it holds, and a
    # covered seq holds exactly what its checkpoint restores.
    restore = Materialiser(root)
    for c in oracle.checkpoints:
        assert restore(c.ref) == contents_at(wlog, c.covered_seq)
    for s in range(1, oracle.last_seq + 1):
        if oracle.covered(s) and (c := oracle.newest("workspace", s)) is not None:
            assert restore(c.ref) == contents_at(wlog, s), f"covered seq {s}"

    # A fork at every event seq, with the agent stopped: inspected, then cancelled.
    agent.stop()
    async with Client(base_url=kernel.url) as client:
        for s in range(1, oracle.last_seq + 1):
            fork = await client.fork(eid, at_seq=s)
            assert fork.status == "running" and fork.forked_from == eid and fork.fork_seq == s
            assert fork.agent_id == AGENT and fork.input == {"task": "edit the workspace"}
            await client.cancel(fork.id)
            fork_json = kernel.execution(fork.id)
            assert fork_json["status"] == "cancelled"
            fo = check_coverage(kernel, fork.id)
            check_fork(oracle, eid, fork_json, fo, s)
            assert Execution.model_validate(fork_json).restoration == fork_json["restoration"]
        assert kernel.events(eid) == events  # the source is never touched

        # A fork at every step boundary (the event before each tool step's
        # step.proposed, and the last event), run to completion.
        agent.start()
        boundaries = [
            e["event_seq"] - 1
            for e in events
            if e["type"] == "step.proposed" and e["payload"]["step_type"] in ("tool_call", "local")
        ] + [oracle.last_seq]
        assert len(boundaries) == 9
        for s in boundaries:
            n0 = tool_llm.count
            fork = await client.fork(eid, at_seq=s)
            done = kernel.wait_status(fork.id)
            assert done["status"] == "completed" and done["output"] == {"answer": "done"}, done
            fo = check_coverage(kernel, fork.id)
            check_fork(oracle, eid, done, fo, s)
            rest = fork.restoration["workspace"]
            ref = rest.get("checkpoint_ref")

            # The fork's first dispatch created its workspace from the
            # restoration's ref; a covered fork takes no baseline, an
            # uncovered one does (0.29.2: the view said uncovered).
            assert [c["ref"] for c in driver_calls(records, "driver:create", fork.id)] == [ref]
            assert driver_calls(records, "driver:open", fork.id) == []
            own = own_checkpoints(fo)
            bound = fo.of_type("resource.bound")[0]["event_seq"]
            if rest["covered"]:
                # Nothing ran live after the restore: still covered at the end.
                assert own == [] and s == oracle.last_seq
            else:
                assert own and own[0]["event_seq"] == bound + 1

            # Its live steps are exactly the source's steps after the point; the
            # copies replayed without running a body or reaching the server.
            live = live_steps(kernel, fo, fork.id)
            after = [st for st in steps if st["terminal"] > s]
            assert [(st["kind"], st["target"]) for st in live] == [(st["kind"], st["target"]) for st in after]
            assert [st["args"] for st in live if st["kind"] == "tool_call"] == [
                st["args"] for st in after if st["kind"] == "tool_call"
            ]
            bodies = [r for r in records.all() if r["event"].startswith("tool:") and r.get("eid") == fork.id]
            assert [(b["event"].removeprefix("tool:"), b["path"]) for b in bodies] == [
                (st["target"], st["args"]["path"]) for st in live if st["kind"] == "tool_call"
            ]
            assert tool_llm.since(n0) == [st["args"] for st in live if st["kind"] == "llm_call"]
            # Its workspace: the source's final one when covered, else the
            # restored contents plus its own live writes.
            if rest["covered"]:
                assert workspace_of(fo) == final
            else:
                assert workspace_of(fo) == contents_at(
                    write_log(kernel, fo, fork.id, after=fo.started_seq()), fo.last_seq, restore(ref)
                )
        assert kernel.events(eid) == events
    parse_with_models(kernel, eid)


# ---------------------------------------------------------------------------
# Scenario 3: kill -9 in the middle of a tool call, then redelivery
# ---------------------------------------------------------------------------

CRASH_SCRIPT = [
    ("write", "a.txt", "1"),
    ("write", "slow.txt", "2"),
    ("read", "a.txt"),
    ("write", "c.txt", "3"),
    ("write", "a.txt", "4"),
    ("write", "d.txt", "5"),
    ("read", "slow.txt"),
    ("write", "e.txt", "6"),
    ("answer", "done"),
]


async def test_kill_mid_tool_call_then_redelivery(kernel, spawn_agent, records, gates, tool_llm, root):
    """SIGKILL while write_file(slow.txt) runs (it has written and waits at a
    gate). The redelivery opens the same directory (one resource.bound, no second
    create), replays the earlier steps without running them, and re-runs the
    orphan under a higher generation; a capture of the first start's generation,
    posted afterwards, is refused as stale_generation; the workspace is right."""
    tool_llm.script[:] = CRASH_SCRIPT
    agent = spawn_workspace_agent(spawn_agent, tool_llm, root, COMPAT_EVERY_STEPS=1)
    eid = kernel.create_execution(AGENT, {"task": "edit the workspace"})["id"]

    first = records.wait("gate:slow-1")[0]
    before = Oracle(kernel.events(eid))
    rows = step_rows(kernel, eid)
    last_start = before.starts[-1]
    assert rows[last_start.step_id]["args"] == {"path": "slow.txt", "content": "2"}
    assert rows[last_start.step_id]["status"] == "executing"
    g1 = last_start.generations["workspace"]
    path = Path(before.of_type("resource.bound")[0]["payload"]["binding"]["path"])
    assert (path / "slow.txt").read_text() == "2"

    agent.kill()
    agent.start()
    assert agent.pid != first["pid"]
    kernel.advance(121)  # the kernel's default lease is 120 s
    records.wait("gate:slow-2")

    # The test posts captures with the current attempt's lease, through the
    # published client's own signed publish: one of the first start's
    # generation (stale), one of the current one while the re-run body is
    # executing (writers_active). Both requests succeed; the refusals are events.
    acked = [e for e in kernel.events(eid) if e["type"] == "dispatch.acked"][-1]["payload"]
    assert acked["attempt"] == 2
    mid = Oracle(kernel.events(eid))
    rerun = mid.starts[-1]
    assert rerun.step_id == last_start.step_id and rerun.retry
    g2 = rerun.generations["workspace"]
    assert g2 > g1
    some_ref = mid.checkpoints[0].ref
    async with httpx2.AsyncClient(base_url=kernel.url, timeout=10) as http:
        kc = KernelClient(agent_id=AGENT, secret=agent.secret, http=http)
        lease = DispatchLease(acked["dispatch_id"], 2, 120.0)
        # The view, read by registering again with the same values (nothing is
        # written), through 0.29.2's own model: still bound to the same
        # directory, at the re-run's generation, uncovered while it runs.
        n_events = len(kernel.events(eid))
        same = {"key": "workspace", "driver_id": DRIVER_ID, "configuration": CONFIGURATION, "coverage_reuse": False}
        view = await kc.register_resource(eid, lease=lease, every_steps=1, on_completion=True, **same)
        assert isinstance(view, Resource)
        assert (view.binding, view.generation, view.covered, view.checkpoint_ref) == (
            {"path": str(path)},
            g2,
            False,
            "",
        )
        assert (view.every_steps, view.on_completion) == (1, True)
        with pytest.raises(ConflictError):
            await kc.register_resource(
                eid, lease=lease, every_steps=1, on_completion=True, **{**same, "configuration": {"format": "other"}}
            )
        assert len(kernel.events(eid)) == n_events
        for g in (g1, g2):
            await kc.publish_checkpoints(
                eid, lease=lease, captures=[{"key": "workspace", "generation": g, "checkpoint_ref": some_ref}]
            )
    refused = [e["payload"] for e in kernel.events(eid) if e["type"] == "resource.checkpoint_failed"]
    assert refused == [
        {"key": "workspace", "generation": g1, "error": "stale_generation"},
        {"key": "workspace", "generation": g2, "error": "writers_active"},
    ]

    gates.release("slow-2")
    ex = kernel.wait_status(eid)
    assert ex["status"] == "completed" and ex["output"] == {"answer": "done"}, ex
    oracle = check_coverage(kernel, eid)
    types = [e["type"] for e in oracle.events]
    assert types.count("dispatch.lease_expired") == 1

    # The same directory throughout: bound once, created once, opened by the
    # redelivery.
    assert len(oracle.of_type("resource.bound")) == 1
    assert [(c["attempt"], c["ref"]) for c in driver_calls(records, "driver:create", eid)] == [(1, None)]
    assert [(c["attempt"], c["path"]) for c in driver_calls(records, "driver:open", eid)] == [(2, str(path))]

    # Bodies: each ran once, except the orphan, which ran in both attempts; the
    # provider saw each turn exactly once.
    bodies = [(r["attempt"], r["path"]) for r in records.all() if r["event"].startswith("tool:")]
    assert bodies == [
        (1, "a.txt"),
        (1, "slow.txt"),
        (2, "slow.txt"),
        (2, "a.txt"),
        (2, "c.txt"),
        (2, "a.txt"),
        (2, "d.txt"),
        (2, "slow.txt"),
        (2, "e.txt"),
    ]
    assert [tool_turns(r) for r in tool_llm.requests] == list(range(9))

    # The orphan's two starts: the re-run carries retry: true and a higher
    # generation.
    slow = next(st for st in step_history(kernel, oracle, eid) if st["step_id"] == last_start.step_id)
    assert [p.get("retry") for p in slow["start_payloads"]] == [None, True]
    assert [p["generations"]["workspace"] for p in slow["start_payloads"]] == [g1, g2]
    assert slow["status"] == "succeeded" and slow["result"] == "wrote slow.txt"

    # Uncovered from the orphan's first start to the next accepted capture:
    # 0.29.2's capture after the open that found the resource uncovered, which
    # the orphan of the reclaimed attempt does not block (it is not a writer).
    start1 = slow["starts"][0]
    nxt = next(c for c in oracle.checkpoints if c.seq > start1)
    assert nxt.generation == g1 and start1 < nxt.covered_seq < slow["starts"][1]
    assert nxt.covered_seq > [e for e in oracle.events if e["type"] == "dispatch.acked"][-1]["event_seq"]
    assert not any(oracle.covered(s) for s in range(start1, nxt.covered_seq))
    assert oracle.covered(nxt.covered_seq)
    assert Materialiser(root)(nxt.ref) == {"a.txt": "1", "slow.txt": "2"}

    assert workspace_of(oracle) == {"a.txt": "4", "slow.txt": "2", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
    parse_with_models(kernel, eid)


# ---------------------------------------------------------------------------
# Scenario 4: a capture failure leaves the outcome intact
# ---------------------------------------------------------------------------


async def test_capture_failure_keeps_the_outcome(kernel, spawn_agent, records, tool_llm, root):
    """every_steps=1 with coverage_reuse (LLM calls and reads leave coverage
    alone); the driver fails the capture due after the 2nd write. The tool result
    reaches the LLM unchanged; one resource.checkpoint_failed in that outcome's
    transaction; uncovered until the next write's capture; a fork inside the gap
    restores the previous checkpoint."""
    # checkpoint() calls of the agent process: 1 the baseline, 2 after write 1,
    # 3 after write 2.
    spawn_workspace_agent(
        spawn_agent, tool_llm, root, COMPAT_EVERY_STEPS=1, COMPAT_COVERAGE_REUSE=1, COMPAT_FAIL_CHECKPOINTS=3
    )
    eid, ex = run(kernel)
    assert ex["status"] == "completed" and ex["output"] == {"answer": "done"}, ex
    oracle = check_coverage(kernel, eid)
    assert oracle.registrations[0].coverage_reuse is True
    types = [e["type"] for e in oracle.events]
    steps = step_history(kernel, oracle, eid)
    writes = [st for st in steps if st["target"] == "write_file"]
    w2 = writes[1]

    # The outcome stands and reached the LLM unchanged.
    assert w2["status"] == "succeeded" and w2["result"] == "wrote b.txt"
    (after_w2,) = [r for r in tool_llm.requests if tool_turns(r) == 2]
    assert after_w2["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "wrote b.txt"}

    # One failure event, directly after that outcome (its transaction), at the
    # generation its start gave.
    (failed,) = oracle.of_type("resource.checkpoint_failed")
    assert failed["event_seq"] == w2["terminal"] + 1
    assert failed["payload"] == {
        "key": "workspace",
        "generation": w2["start_payloads"][0]["generations"]["workspace"],
        "error": "snapshot quota exceeded (call 3)",
    }
    calls = driver_calls(records, "driver:checkpoint", eid)
    assert [(c["n"], c["outcome"]) for c in calls] == [(n, "failed" if n == 3 else "captured") for n in range(1, 8)]

    # Every other write was due and captured with its outcome; with the counter
    # left at 1 by the failure, the 3rd write was due again.
    for w in writes:
        if w is not w2:
            assert types[w["terminal"]] == "resource.checkpointed"
            assert oracle.events[w["terminal"]]["payload"]["covered_seq"] == w["terminal"]
    # Example D's shape: covered from the baseline to the 1st write's start,
    # from each captured write's outcome to the next write's start, and
    # uncovered from the 2nd write's start to the 3rd write's outcome. Still
    # covered at the end (reuse: the final LLM call leaves it), so there is no
    # completion capture.
    baseline = oracle.checkpoints[0]
    assert baseline.seq == baseline.covered_seq == oracle.of_type("resource.bound")[0]["event_seq"] + 1
    want = [[baseline.covered_seq, writes[0]["starts"][0] - 1]]
    for i, w in enumerate(writes):
        if w is w2:
            continue
        end = writes[i + 1]["starts"][0] - 1 if i + 1 < len(writes) else oracle.last_seq
        want.append([w["terminal"], end])
    assert oracle.ranges(eid)["resources"][0]["covered_ranges"] == want
    assert len(oracle.checkpoints) == 1 + 5 and oracle.checkpoints[-1].covered_seq == writes[-1]["terminal"]

    # A fork inside the gap (at the read after write 2) restores the checkpoint
    # of write 1, uncovered: b.txt is missing there, so its live read of b.txt
    # fails, and the result the LLM gets says so.
    read_a = next(st for st in steps if st["target"] == "read_file")
    s = read_a["terminal"]
    assert w2["starts"][0] < s < writes[2]["starts"][0]
    c1 = oracle.newest("workspace", s)
    assert c1.covered_seq == writes[0]["terminal"]
    async with Client(base_url=kernel.url) as client:
        fork = await client.fork(eid, at_seq=s)
    assert fork.restoration == {
        "workspace": {"covered": False, "checkpoint_ref": c1.ref, "checkpoint_seq": c1.covered_seq}
    }
    n0 = tool_llm.count
    done = kernel.wait_status(fork.id)
    assert done["status"] == "completed" and done["output"] == {"answer": "done"}, done
    fo = check_coverage(kernel, fork.id)
    check_fork(oracle, eid, done, fo, s)
    assert [c["ref"] for c in driver_calls(records, "driver:create", fork.id)] == [c1.ref]
    assert Materialiser(root)(c1.ref) == {"a.txt": "1"}
    assert workspace_of(fo) == {"a.txt": "4", "c.txt": "3", "d.txt": "5", "e.txt": "6"}
    (after_read_b,) = [r for r in tool_llm.since(n0) if tool_turns(r) == 7]
    assert after_read_b["messages"][-1]["content"].startswith("error: read_file: ")
    parse_with_models(kernel, eid)


# ---------------------------------------------------------------------------
# Scenario 5: CheckpointUnavailable fails the fork
# ---------------------------------------------------------------------------


async def test_checkpoint_unavailable_fails_the_fork(kernel, spawn_agent, records, tool_llm, root):
    """A fork at a covered point whose checkpoint's manifest was deleted: the
    driver's create raises CheckpointUnavailable and 0.29.2 fails the fork as
    agent_error: CheckpointUnavailable: …, with no request to the server, no
    live step, the source unchanged. Again with a driver whose create maps a
    provider 404 to CheckpointUnavailable."""
    agent = spawn_workspace_agent(spawn_agent, tool_llm, root, COMPAT_EVERY_STEPS=1)
    eid, ex = run(kernel)
    assert ex["status"] == "completed", ex
    oracle = check_coverage(kernel, eid)
    writes = [st for st in step_history(kernel, oracle, eid) if st["target"] == "write_file"]
    source_events, source_exec = kernel.events(eid), kernel.execution(eid)

    async def fork_fails(s: int, reason: str) -> None:
        c = oracle.newest("workspace", s)
        assert oracle.covered(s) and c is not None and c.covered_seq == s
        n0 = tool_llm.count
        async with Client(base_url=kernel.url) as client:
            fork = await client.fork(eid, at_seq=s)
        assert fork.restoration == {"workspace": {"covered": True, "checkpoint_ref": c.ref, "checkpoint_seq": s}}
        done = kernel.wait_status(fork.id)
        assert done["status"] == "failed", done
        assert done["failure_reason"] == reason.format(ref=c.ref)
        fo = check_coverage(kernel, fork.id)
        check_fork(oracle, eid, done, fo, s)
        assert fo.events[-1]["type"] == "execution.failed"
        assert [c["outcome"] for c in driver_calls(records, "driver:create", fork.id)] == ["unavailable"]
        assert fo.of_type("resource.bound") == [] and own_checkpoints(fo) == []
        assert live_steps(kernel, fo, fork.id) == []
        assert tool_llm.count == n0
        assert kernel.events(eid) == source_events and kernel.execution(eid) == source_exec
        parse_with_models(kernel, fork.id)

    # The checkpoint taken with the 3rd write's outcome loses its manifest.
    s = writes[2]["terminal"]
    DirDriver(root).manifest_path(oracle.newest("workspace", s).ref).unlink()
    await fork_fails(
        s, "agent_error: CheckpointUnavailable: directory snapshot {ref} is missing or damaged: no manifest"
    )

    # A driver that raises it without looking, as a provider's 404 would.
    agent.extra_env["COMPAT_CREATE_UNAVAILABLE"] = "1"
    agent.restart()
    await fork_fails(writes[0]["terminal"], "agent_error: CheckpointUnavailable: checkpoint {ref} not found (404)")


# ---------------------------------------------------------------------------
# Scenario 6: every_steps=5 and an uncovered fork
# ---------------------------------------------------------------------------

SEVEN_WRITES = [("write", f"f{i}.txt", str(i)) for i in range(1, 8)] + [("answer", "done")]


async def test_uncovered_fork_restores_the_baseline(kernel, spawn_agent, records, tool_llm, root):
    """Seven writes with an LLM call between each, every_steps=5; a fork right
    after write 3 is uncovered and restores the baseline: it replays writes 1–3
    with their results, yet f1–f3 are absent; its counter starts at 0, so its 4
    live writes take no periodic capture; it ends with a completion capture; and
    its resource keeps every_steps 5 although the restarted agent passes 2."""
    tool_llm.script[:] = SEVEN_WRITES
    agent = spawn_workspace_agent(spawn_agent, tool_llm, root, COMPAT_EVERY_STEPS=5)
    eid, ex = run(kernel)
    assert ex["status"] == "completed", ex
    oracle = check_coverage(kernel, eid)
    types = [e["type"] for e in oracle.events]
    steps = step_history(kernel, oracle, eid)
    writes = [st for st in steps if st["target"] == "write_file"]
    assert len(writes) == 7
    baseline, periodic, completion = oracle.checkpoints
    assert periodic.covered_seq == writes[4]["terminal"] and completion.seq == oracle.last_seq - 1

    agent.extra_env["COMPAT_EVERY_STEPS"] = "2"
    agent.restart()
    s = writes[2]["terminal"]
    async with Client(base_url=kernel.url) as client:
        fork = await client.fork(eid, at_seq=s)
    assert fork.restoration == {
        "workspace": {"covered": False, "checkpoint_ref": baseline.ref, "checkpoint_seq": baseline.covered_seq}
    }
    done = kernel.wait_status(fork.id)
    assert done["status"] == "completed" and done["output"] == {"answer": "done"}, done
    fo = check_coverage(kernel, fork.id)
    check_fork(oracle, eid, done, fo, s)

    # Writes 1–3 replayed with the source's results, without running.
    fork_writes = [st for st in step_history(kernel, fo, fork.id) if st["target"] == "write_file"]
    assert [(w["args"], w["status"], w["result"]) for w in fork_writes[:3]] == [
        (w["args"], w["status"], w["result"]) for w in writes[:3]
    ]
    assert [r["path"] for r in driver_calls(records, "tool:write_file", fork.id)] == [
        "f4.txt",
        "f5.txt",
        "f6.txt",
        "f7.txt",
    ]
    assert workspace_of(fo) == {"f4.txt": "4", "f5.txt": "5", "f6.txt": "6", "f7.txt": "7"}
    assert [c["ref"] for c in driver_calls(records, "driver:create", fork.id)] == [baseline.ref]

    # The stored policy won: registered with every_steps 5 and on_completion
    # true, while the restarted agent asked for every_steps 2.
    (reg,) = fo.of_type("resource.registered")
    assert reg["payload"]["every_steps"] == 5 and reg["payload"]["on_completion"] is True
    assert [r["every_steps"] for r in driver_calls(records, "resource:policy", fork.id)] == [2]
    # Its own checkpoints: 0.29.2's baseline right after the bind (at the
    # fork's generation: the source's at s plus 1) and the completion capture;
    # none with a step outcome (4 live writes < 5; with the policy of 2, or a
    # copied counter of 3, one would have been due).
    fork_types = [e["type"] for e in fo.events]
    own = own_checkpoints(fo)
    bound = fo.of_type("resource.bound")[0]["event_seq"]
    (init,) = fo.of_type("resource.initialized")
    assert init["payload"]["generation"] == oracle.generation("workspace", s) + 1
    assert [e["event_seq"] for e in own] == [bound + 1, fo.last_seq - 1]
    assert own[0]["payload"]["generation"] == init["payload"]["generation"]
    assert fork_types[-1] == "execution.completed"
    live_writes = [st for st in live_steps(kernel, fo, fork.id) if st["target"] == "write_file"]
    assert [w["args"]["path"] for w in live_writes] == ["f4.txt", "f5.txt", "f6.txt", "f7.txt"]
    for w in live_writes:
        assert fork_types[w["terminal"]] != "resource.checkpointed"
    # In the source, by contrast, the 5th write's outcome carried one.
    assert types[writes[4]["terminal"]] == "resource.checkpointed"
    parse_with_models(kernel, fork.id)
