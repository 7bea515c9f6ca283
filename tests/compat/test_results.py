"""(f) How executions end with the published client: ``Result(output=..., state=...)``
completes with the output and stores the state for a continuation (docs/protocol/executions.md §5, §11);
handler and tool failures fail the execution with the client's failure reasons
(docs/protocol/sdk.md §3: ``agent_error: <Class>: <message>``, ``tool_error: <tool>: <message>``)."""

from __future__ import annotations

from rebuno import Client

from kernel_harness import parse_with_models

AGENT = "results-agent"


async def test_result_state_and_previous(kernel, spawn_agent, records):
    spawn_agent("results_agent.py", AGENT)
    async with Client(base_url=kernel.url) as client:
        parent = await client.create(AGENT, {"mode": "result", "payload": {"k": [1, 2]}})
        done = kernel.wait_status(parent.id)
        assert done["status"] == "completed", done
        assert done["output"] == {"answer": 42, "payload": {"k": [1, 2]}}
        assert "state" not in done  # stored with the output, not shown (docs/protocol/executions.md §5)
        completed = kernel.events(parent.id)[-1]
        assert completed["type"] == "execution.completed"
        assert completed["payload"]["output"] == done["output"]
        assert kernel.get_json(f"/v0/executions/{parent.id}/previous") == {"state": None}

        # A continuation reads the state its parent completed with, through the
        # client's previous() (an agent-signed GET …/previous).
        child = await client.create(AGENT, {"mode": "continue"}, parent_execution_id=parent.id)
        assert child.parent_execution_id == parent.id
        done = kernel.wait_status(child.id)
        assert done["status"] == "completed", done
        assert done["output"] == {"previous": {"memo": "remember me", "turn": 1}}
        assert kernel.get_json(f"/v0/executions/{child.id}/previous") == {"state": {"memo": "remember me", "turn": 1}}

        # Without a state, a continuation reads its parent's output. The parent
        # here caught its failed tool as the client's ToolError.
        caught = await client.create(AGENT, {"mode": "tool-caught"})
        done = kernel.wait_status(caught.id)
        assert done["status"] == "completed", done
        assert done["output"] == {"caught": "flaky: disk full at /var/data"}
        grandchild = await client.create(AGENT, {"mode": "continue"}, parent_execution_id=caught.id)
        done = kernel.wait_status(grandchild.id)
        assert done["output"] == {"previous": {"caught": "flaky: disk full at /var/data"}}

    assert records.count("tool:flaky") == 1
    for eid in (parent.id, child.id, caught.id, grandchild.id):
        parse_with_models(kernel, eid)


def test_failing_handlers(kernel, spawn_agent, records):
    spawn_agent("results_agent.py", AGENT)
    raised = kernel.create_execution(AGENT, {"mode": "raise"})["id"]
    tool = kernel.create_execution(AGENT, {"mode": "tool"})["id"]
    no_input = kernel.create_execution(AGENT)["id"]

    # An exception escaping the handler.
    ex = kernel.wait_status(raised)
    assert ex["status"] == "failed", ex
    assert ex["failure_reason"] == "agent_error: WidgetError: the widget broke"
    assert "output" not in ex
    events = kernel.events(raised)
    assert events[-1]["type"] == "execution.failed"
    assert events[-1]["payload"]["reason"] == ex["failure_reason"]
    assert not [e for e in events if e["type"].startswith("step.")]

    # A tool body that raised: the step is failed with the client's error value,
    # and the ToolError that escapes the handler fails the execution.
    ex = kernel.wait_status(tool)
    assert ex["status"] == "failed", ex
    assert ex["failure_reason"] == "tool_error: flaky: disk full at /var/data"
    (step,) = kernel.steps(tool)
    assert (step["target"], step["status"]) == ("flaky", "failed")
    assert step["error"] == {"message": "disk full at /var/data"}
    assert "result" not in step
    step_events = [e for e in kernel.events(tool) if e["type"].startswith("step.")]
    assert [e["type"] for e in step_events] == ["step.proposed", "step.allowed", "step.executing", "step.failed"]
    assert step_events[-1]["payload"]["error"] == {"message": "disk full at /var/data"}
    assert kernel.event_types(tool)[-1] == "execution.failed"

    # No input at all: stored as null, and the client's binding refuses it.
    ex = kernel.wait_status(no_input)
    assert ex["status"] == "failed", ex
    assert ex["input"] is None
    assert ex["failure_reason"] == "input_invalid: missing required input fields: mode"

    assert records.count("tool:flaky") == 1
    for eid in (raised, tool, no_input):
        parse_with_models(kernel, eid)
