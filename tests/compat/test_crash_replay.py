"""(c) kill -9 of the agent process in the middle of a run. The restarted process
gets the redelivery after the lease is reclaimed (manual clock, docs/protocol/dispatch.md §10); every step
recorded before the kill replays, so no body runs again and the LLM provider is
not called again (docs/protocol/steps.md §5); the execution completes."""

from __future__ import annotations

import pytest

from kernel_harness import parse_with_models

AGENT = "crash-agent"
MODEL = "scripted-model-2"
PLAIN = "The write is done."
STREAMED = "Streamed after the write."
INDETERMINATE = {
    "message": "outcome unknown: this may already have taken effect. Check the state before continuing.",
    "reason": "indeterminate",
}


@pytest.mark.parametrize("mode", ["slow", "charge"])
def test_kill_agent_mid_run_then_replay(kernel, spawn_agent, records, gates, llm, mode):
    blocked = mode  # the tool whose body is running when the process dies
    llm.script(PLAIN, STREAMED)  # exactly two answers: a third call would fail the run
    agent = spawn_agent("crash_agent.py", AGENT, env={"COMPAT_LLM_URL": llm.url})
    eid = kernel.create_execution(AGENT, {"key": "k1", "mode": mode})["id"]

    first = records.wait(f"gate:{blocked}")[0]
    assert first["attempt"] == 1
    before = kernel.steps(eid)
    assert [(s["target"], s["status"]) for s in before] == [
        ("lookup", "succeeded"),
        ("write", "succeeded"),
        (MODEL, "succeeded"),
        (MODEL, "succeeded"),
        (blocked, "executing"),
    ]
    assert llm.count == 2

    # SIGKILL: no outcome is reported for the running body, the lease just lapses.
    agent.kill()
    gates.release(blocked)
    agent.start()
    assert agent.pid != first["pid"]

    # Nothing happens until the lease (120 s, the kernel default) has run out.
    assert not any(e["type"] == "dispatch.lease_expired" for e in kernel.events(eid))
    kernel.advance(121)
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    assert ex["status"] == "completed", ex

    # Every body recorded before the kill ran once; the provider was not asked again.
    assert records.count("tool:lookup") == 1
    assert records.count("tool:write") == 1
    assert llm.count == 2
    starts = records.of("handler:start")
    assert [r["attempt"] for r in starts] == [1, 2]
    assert starts[1]["pid"] == agent.pid

    out = ex["output"]
    assert out["wrote"] == "wrote k1=17"
    assert out["plain"] == PLAIN
    assert out["streamed"] == STREAMED  # rebuilt from the recorded stream

    steps = kernel.steps(eid)
    assert [s["step_id"] for s in steps] == [s["step_id"] for s in before]  # no new step
    last = steps[-1]
    events = kernel.events(eid)
    types = [e["type"] for e in events]
    assert types.count("step.proposed") == 5
    lapsed = [e for e in events if e["type"] == "dispatch.lease_expired"]
    assert len(lapsed) == 1
    assert lapsed[0]["payload"]["attempt"] == 1 and lapsed[0]["payload"]["status"] == "pending"
    assert sorted(e["payload"]["attempt"] for e in events if e["type"] == "dispatch.acked") == [1, 2]
    for_last = [e for e in events if e["type"].startswith("step.") and e["payload"]["step_id"] == last["step_id"]]

    if mode == "slow":
        # A safe-to-retry orphan runs again, once, in the new attempt (docs/protocol/steps.md §5).
        runs = records.of("tool:slow")
        assert [r["attempt"] for r in runs] == [1, 2]
        assert out["doubled"] == 34
        assert last["status"] == "succeeded" and last["result"] == 34
        assert [e["type"] for e in for_last] == [
            "step.proposed",
            "step.allowed",
            "step.executing",
            "step.executing",
            "step.succeeded",
        ]
        assert for_last[3]["payload"].get("retry") is True
        assert "retry" not in for_last[2]["payload"]
    else:
        # An at-most-once orphan never runs twice: it is failed as indeterminate
        # and replayed to the client as an error, which the handler caught.
        assert records.count("tool:charge") == 1
        assert last["status"] == "failed"
        assert last["error"] == INDETERMINATE
        assert out["charge_error"] == f"charge: {INDETERMINATE['message']}"
        assert [e["type"] for e in for_last] == ["step.proposed", "step.allowed", "step.executing", "step.failed"]
        assert for_last[3]["payload"]["error"] == INDETERMINATE

    assert types[-1] == "execution.completed"
    parse_with_models(kernel, eid)
