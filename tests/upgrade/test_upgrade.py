"""The upgrade path from the published client to this project's SDK.

An execution is begun by the agent written with the published rebuno==0.29.2
(agents/published_agent.py, its own virtualenv). While its last tool runs, the
process is killed with SIGKILL. The same agent written with this project's SDK
(agents/current_agent.py: same agent id, tool ids, step names and arguments,
same handler) starts on the same port. The lease lapses (manual clock), the
kernel redelivers, and every step the published client recorded must replay
under the new SDK: no body runs again, the LLM server is not asked again, no new
step is proposed, and the execution completes. That is what proves step
identity (docs/protocol/identity.md) and the recorded shapes compatible across the SDKs.

``test_both_sdks_submit_the_same_identities`` compares the two SDKs' wire
directly: the same handler run to completion by each, step by step.

Where the SDKs disagree the failure message names every step the new SDK
proposed anew, beside what 0.29.2 had recorded for it. The cases that once
disagreed (``step()`` without args, ``**kwargs`` tools, the LLM call's args and
its recorded response) each have a test of their own.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernel_harness import Gates, Kernel, Records
from scripted_llm import ScriptedLLM
from upgrade_harness import CURRENT, PUBLISHED, PUBLISHED_VERSION, AgentProc, Incompatible, args_text, divergence

AGENT = "upgrade-agent"
CITY = "Oslo"
PLAIN = "Cold and clear in Oslo."
STREAMED = "Streaming: snow showers later."
LEASE = 120  # the kernel's default lease, seconds

# Body-run records of the effects every run makes before the gate, and of the
# optional ones, by feature.
ALWAYS = ["tool:lookup", "tool:lookup", "tool:quote", "tool:write_note", "tool:flaky"]
OPTIONAL = {"step": ["step:pick"], "step_noargs": ["step:stamp"], "tool_kwargs": ["tool:tag"]}
LLM_REPLIES = {"llm": [PLAIN], "llm_stream": [STREAMED]}


def expected_steps(features: list[str]) -> list[tuple[str, str, str]]:
    """(kind, target, status) of the steps recorded when the published agent
    waits at the gate, in recording order."""
    steps = [
        ("tool_call", "lookup", "succeeded"),
        ("tool_call", "lookup", "succeeded"),
        ("tool_call", "quote", "succeeded"),
        ("tool_call", "write_note", "succeeded"),
        ("tool_call", "flaky", "failed"),
    ]
    if "step" in features:
        steps.append(("local", "pick", "succeeded"))
    if "step_noargs" in features:
        steps.append(("local", "stamp", "succeeded"))
    if "tool_kwargs" in features:
        steps.append(("tool_call", "tag", "succeeded"))
    if "llm" in features:
        steps.append(("llm_call", "scripted-upgrade", "succeeded"))
    if "llm_stream" in features:
        steps.append(("llm_call", "scripted-upgrade", "succeeded"))
    steps.append(("tool_call", "slow", "executing"))
    return steps


def body_runs(records: Records) -> list[tuple[str, str, int | None]]:
    """(body, sdk, attempt) of every tool or local-step body that ran."""
    return [
        (r["event"], r["sdk"], r["attempt"])
        for r in records.all()
        if r["event"].startswith(("tool:", "step:"))
    ]


def upgrade_mid_run(
    kernel: Kernel, spawn: Any, records: Records, gates: Gates, llm: ScriptedLLM, features: list[str]
) -> dict[str, Any]:
    """Runs the scenario up to the completion of the execution and checks
    everything that must hold whichever SDK finishes it. Returns what the
    caller checks for its features."""
    for f in features:
        llm.script(*LLM_REPLIES.get(f, []))
    old = spawn(PUBLISHED, AGENT)
    eid = kernel.create_execution(AGENT, {"city": CITY, "features": features})["id"]

    at_gate = records.wait("gate:slow")[0]
    assert (at_gate["sdk"], at_gate["attempt"]) == (PUBLISHED_VERSION, 1)
    recorded = kernel.steps(eid)
    assert [(s["kind"], s["target"], s["status"]) for s in recorded] == expected_steps(features)
    asked = llm.count
    assert asked == sum(len(LLM_REPLIES.get(f, [])) for f in features)

    # SIGKILL while `slow` runs: nothing is reported for it, the lease just lapses.
    old.kill()
    gates.release("slow")
    new = spawn(CURRENT, AGENT, port=old.port, register=False)
    assert new.pid != old.pid
    assert "dispatch.lease_expired" not in kernel.event_types(eid)
    kernel.advance(LEASE + 1)
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    after = kernel.steps(eid)

    # The heart of it: nothing the published client recorded is proposed again.
    new_steps = [s for s in after if s["step_id"] not in {r["step_id"] for r in recorded}]
    if new_steps or ex["status"] != "completed":
        raise Incompatible(
            f"the upgraded agent did not replay the history of rebuno {PUBLISHED_VERSION}:\n"
            + divergence(recorded, after, ex)
            + f"\n  LLM requests: {asked} before the kill, {llm.count} in all"
        )
    assert [s["step_id"] for s in after] == [s["step_id"] for s in recorded]
    assert llm.count == asked, "the LLM server was asked again for a recorded call"

    # Every body ran once, under 0.29.2 in attempt 1, except the interrupted
    # `slow`, which is safe to retry and ran again under the new SDK.
    runs = body_runs(records)
    want = sorted(ALWAYS + [b for f in features for b in OPTIONAL.get(f, [])])
    assert sorted(b for b, sdk, attempt in runs if b != "tool:slow") == want
    assert all((sdk, attempt) == (PUBLISHED_VERSION, 1) for b, sdk, attempt in runs if b != "tool:slow")
    slow = [(sdk, attempt) for b, sdk, attempt in runs if b == "tool:slow"]
    assert slow[0] == (PUBLISHED_VERSION, 1) and len(slow) == 2
    new_sdk, attempt = slow[1]
    assert new_sdk != PUBLISHED_VERSION and attempt == 2
    starts = [(r["sdk"], r["attempt"], r["pid"]) for r in records.of("handler:start")]
    assert starts == [(PUBLISHED_VERSION, 1, old.pid), (new_sdk, 2, new.pid)]

    events = kernel.events(eid)
    types = [e["type"] for e in events]
    assert types.count("step.proposed") == len(recorded)
    assert [e["payload"]["attempt"] for e in events if e["type"] == "dispatch.lease_expired"] == [1]
    assert sorted(e["payload"]["attempt"] for e in events if e["type"] == "dispatch.acked") == [1, 2]
    retried = [e["payload"]["target"] for e in events if e["type"] == "step.executing" and e["payload"].get("retry")]
    assert retried == ["slow"]
    assert types[-1] == "execution.completed"

    out = ex["output"]
    assert out["sdk"] == new_sdk
    assert out["first"] == out["again"] == {"city": CITY, "units": "metric", "temp": 21}
    assert out["quote"] == "12.5 € <&> é"
    assert out["note"] == "noted k1: first run"
    # The failure 0.29.2 recorded ({"message": ...}) is raised again as ToolError.
    assert "no forecast for Oslo" in out["flaky"]
    assert out["doubled"] == 42
    by_target = {(s["kind"], s["target"]): s for s in after}
    flaky = by_target[("tool_call", "flaky")]
    assert flaky["error"]["message"] == "no forecast for Oslo"
    return {"execution": ex, "output": out, "steps": after, "by_target": by_target, "eid": eid}


def test_tools_and_local_step_replay_after_upgrade(kernel, spawn, records, gates, llm):
    """Tools (defaults applied, the same call twice, non-ASCII, a float and an
    unsorted object in the args, at-most-once, a recorded failure) and a
    ``step()`` with args: all replay under the new SDK."""
    got = upgrade_mid_run(kernel, spawn, records, gates, llm, ["step"])
    pick = got["by_target"][("local", "pick")]
    assert pick["args"] == {"seed": 7}
    assert got["output"]["pick"] == pick["result"]  # the recorded random value, not a new one


def test_step_without_args_replays_after_upgrade(kernel, spawn, records, gates, llm):
    got = upgrade_mid_run(kernel, spawn, records, gates, llm, ["step_noargs"])
    stamp = got["by_target"][("local", "stamp")]
    assert got["output"]["stamp"] == stamp["result"]


def test_tool_with_var_keyword_replays_after_upgrade(kernel, spawn, records, gates, llm):
    got = upgrade_mid_run(kernel, spawn, records, gates, llm, ["tool_kwargs"])
    assert got["output"]["tag"] == "Oslo:season=winter,source=upgrade"


def test_plain_llm_call_replays_after_upgrade(kernel, spawn, records, gates, llm):
    """An OpenAI chat completion through 0.29.2's ``http_client()`` replays
    through this SDK's without a second request to the provider. (The step's
    identity agrees; the recorded response's shape does not.)"""
    got = upgrade_mid_run(kernel, spawn, records, gates, llm, ["llm"])
    assert got["output"]["plain"] == PLAIN


def test_streamed_llm_call_replays_after_upgrade(kernel, spawn, records, gates, llm):
    got = upgrade_mid_run(kernel, spawn, records, gates, llm, ["llm_stream"])
    assert got["output"]["streamed"] == STREAMED


def test_both_sdks_submit_the_same_identities(kernel, spawn, records, gates, llm):
    """Both agents run the whole handler to completion, one after the other.
    Step by step, the kernel must have received the same kind, target, args
    (compared as JSON values) and idempotency from each, and LLM responses
    must be recorded in the same shape (the keys of the recorded result)."""
    everything = ["step", "step_noargs", "tool_kwargs", "llm", "llm_stream"]
    gates.release("slow")
    runs: dict[str, list[dict[str, Any]]] = {}
    for sdk in (PUBLISHED, CURRENT):
        llm.script(PLAIN, STREAMED)
        agent: AgentProc = spawn(sdk, AGENT)
        eid = kernel.create_execution(AGENT, {"city": CITY, "features": everything})["id"]
        ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
        assert ex["status"] == "completed", (sdk, ex)
        assert ex["output"]["plain"] == PLAIN and ex["output"]["streamed"] == STREAMED
        runs[sdk] = kernel.steps(eid)
        agent.stop()
    assert llm.count == 4

    def shape(s: dict[str, Any]) -> tuple[str, ...]:
        out = (s["kind"], s["target"], "args " + args_text(s["args"]), s["idempotency"])
        if s["kind"] == "llm_call":
            out += ("result keys " + ",".join(sorted(s["result"])),)
        return out

    old, new = runs[PUBLISHED], runs[CURRENT]
    want = [(k, t) for k, t, _ in expected_steps(everything)]
    assert [(s["kind"], s["target"]) for s in old] == [(s["kind"], s["target"]) for s in new] == want
    diffs = []
    for a, b in zip(old, new, strict=True):
        for x, y in zip(shape(a), shape(b), strict=True):
            if x != y:
                diffs.append(f"  {a['kind']} {a['target']!r}:\n    {PUBLISHED_VERSION}: {x}\n    this SDK: {y}")
    if diffs:
        raise Incompatible("the SDKs put different steps on the wire:\n" + "\n".join(diffs))
