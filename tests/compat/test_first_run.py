"""(a) A first run of the published client: decorated tools (one default, one
at-most-once) and a local step; the execution completes with the handler's output,
and the steps and the event log are those of docs/protocol/steps.md §4, docs/protocol/events.md §3."""

from __future__ import annotations

from kernel_harness import parse_with_models, step_id, wait_until

AGENT = "first-run"


def test_first_run(kernel, spawn_agent, records):
    spawn_agent("first_run.py", AGENT)
    eid = kernel.create_execution(AGENT, {"topic": "durable agents"})["id"]

    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    want_output = {
        "hits": ["durable agents #1", "durable agents #2"],
        "ticket": "T-0042",
        "sent": {"sent": True, "to": "ops@example.com", "subject": "T-0042: durable agents #1"},
    }
    assert ex["status"] == "completed", ex
    assert ex["output"] == want_output
    assert "failure_reason" not in ex

    # Every body ran exactly once, in one handler run.
    assert records.count("tool:search") == 1
    assert records.count("step:ticket") == 1
    assert records.count("tool:send_email") == 1
    assert records.count("handler:start") == 1
    assert records.of("handler:exit")[0]["outcome"] == "returned"
    assert {r["attempt"] for r in records.all()} == {1}

    # Steps, in recording order, as the client submitted them.
    steps = kernel.steps(eid)
    want = [
        (
            "tool_call",
            "search",
            {"query": "durable agents", "limit": 2},
            "safe_to_retry",
            ["durable agents #1", "durable agents #2"],
        ),
        ("local", "ticket", {"prefix": "T"}, "safe_to_retry", "T-0042"),
        (
            "tool_call",
            "send_email",
            {"to": "ops@example.com", "subject": "T-0042: durable agents #1"},
            "at_most_once",
            want_output["sent"],
        ),
    ]
    assert [(s["kind"], s["target"], s["args"], s["idempotency"], s["result"]) for s in steps] == want
    for s, (kind, target, args, _, _) in zip(steps, want, strict=True):
        assert s["status"] == "succeeded"
        assert s["occurrence"] == 0
        assert s["execution_id"] == eid
        assert s["resources"] == []
        assert "error" not in s
        assert s.get("started_at") and s.get("completed_at")
        # Step identity is bit-exact with docs/protocol/identity.md: the kernel names the step the
        # client's args hash to.
        assert s["step_id"] == step_id(eid, kind, target, args), s

    # The args are stored verbatim: the client's json.dumps spacing comes back.
    raw = kernel.request("GET", f"/v0/executions/{eid}/steps/{steps[0]['step_id']}").text
    assert '"args":{"query": "durable agents", "limit": 2}' in raw, raw

    # The event log: create, one webhook ack, four events per step, completion.
    events = kernel.events(eid)
    assert [e["event_seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    assert types[:3] == ["execution.created", "execution.started", "dispatch.queued"]
    acked = [e for e in events if e["type"] == "dispatch.acked"]
    assert len(acked) == 1 and acked[0]["payload"]["attempt"] == 1
    assert types[-1] == "execution.completed"
    assert events[-1]["payload"]["output"] == want_output
    assert events[-1]["payload"]["status"] == "completed"
    step_events = [e for e in events if e["type"].startswith("step.")]
    assert [e["type"] for e in step_events] == ["step.proposed", "step.allowed", "step.executing", "step.succeeded"] * 3
    for i, s in enumerate(steps):
        for e in step_events[4 * i : 4 * i + 4]:
            assert e["payload"]["step_id"] == s["step_id"]
            assert e["payload"]["step_type"] == s["kind"]
            assert e["payload"]["target"] == s["target"]
    assert len(events) == 3 + 1 + 12 + 1
    assert all(e["type"] != "dispatch.failed" for e in events)

    parse_with_models(kernel, eid)

    # The client published its metadata at start-up (PUT …/metadata, docs/protocol/governance.md §4.4).
    def metadata():
        agent = kernel.get_json(f"/v0/agents/{AGENT}")
        return agent if "description" in agent else None

    agent = wait_until(metadata, what="agent metadata")
    assert agent["description"] == "first run agent: search, ticket, mail"
    assert "topic" in agent["input_schema"]["properties"]
    assert "secret" not in agent
