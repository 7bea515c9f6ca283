"""(d) A reclaimed lease whose old attempt is refused (docs/protocol/dispatch.md §10, §11): the old
attempt's requests get ``409 lease_superseded``, which the published client takes as
its stop signal; the new attempt completes the execution; no tool body runs twice."""

from __future__ import annotations

import pytest

from kernel_harness import parse_with_models, wait_until

AGENT = "gated-agent"
SUPERSEDED = "rebuno_dispatch_superseded_total"


def _check_completed_once(kernel, records, eid, new_pid):
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    assert ex["status"] == "completed", ex
    assert ex["output"] == {"one": 2, "two": 20}
    assert records.count("tool:one") == 1
    runs = records.of("tool:two")
    assert len(runs) == 1 and runs[0]["attempt"] == 2 and runs[0]["pid"] == new_pid
    steps = kernel.steps(eid)
    assert [(s["target"], s["status"], s["result"]) for s in steps] == [
        ("one", "succeeded", 2),
        ("two", "succeeded", 20),
    ]
    events = kernel.events(eid)
    types = [e["type"] for e in events]
    assert types.count("step.proposed") == 2
    assert types.count("dispatch.lease_expired") == 1
    assert sorted(e["payload"]["attempt"] for e in events if e["type"] == "dispatch.acked") == [1, 2]
    assert types[-1] == "execution.completed"
    parse_with_models(kernel, eid)


def test_old_attempt_submit_is_refused(kernel, spawn_agent, records, gates):
    """The old attempt lives on in its own process and submits after the reclaim."""
    old = spawn_agent("gated_agent.py", AGENT, wait=False)
    new = spawn_agent("gated_agent.py", AGENT, register=False, wait=False)
    old.wait_ready()
    new.wait_ready()
    eid = kernel.create_execution(AGENT, {"x": 1})["id"]
    assert records.wait("gate:attempt1")[0]["pid"] == old.pid

    # The agent moves to the new process (the old one keeps running), and the
    # lease of attempt 1 runs out: the kernel redelivers as attempt 2.
    kernel.register_agent(AGENT, new.webhook_url, new.secret)
    before = kernel.metric(SUPERSEDED)
    kernel.advance(121)
    assert records.wait("gate:attempt2")[0]["pid"] == new.pid

    # The old handler goes on: its submit of `two` is fenced, and the client
    # stops the handler on the lease_superseded code without running the body.
    gates.release("attempt1")
    stopped = records.wait("handler:exit", pid=old.pid)[0]
    assert stopped["attempt"] == 1
    assert stopped["outcome"] == "raised" and stopped["error"] == "LeaseSuperseded"
    assert kernel.metric(SUPERSEDED) >= before + 1
    assert records.count("tool:two") == 0
    assert [s["target"] for s in kernel.steps(eid)] == ["one"]
    assert kernel.execution(eid)["status"] == "running"

    gates.release("attempt2")
    _check_completed_once(kernel, records, eid, new.pid)


@pytest.mark.kernel_args("--dispatch-timeout", "1s")
def test_old_attempt_heartbeat_is_refused(kernel, spawn_agent, records, gates):
    """With a 3 s lease the client heartbeats every second; the old attempt's first
    heartbeat after the reclaim is refused and the client cancels that handler."""
    old = spawn_agent("gated_agent.py", AGENT, lease_timeout_seconds=3, wait=False)
    new = spawn_agent("gated_agent.py", AGENT, register=False, wait=False)
    old.wait_ready()
    new.wait_ready()
    eid = kernel.create_execution(AGENT, {"x": 1})["id"]
    assert records.wait("gate:attempt1")[0]["pid"] == old.pid
    assert kernel.get_json(f"/v0/agents/{AGENT}")["lease_timeout_seconds"] == 3

    kernel.register_agent(AGENT, new.webhook_url, new.secret, lease_timeout_seconds=3)
    before = kernel.metric(SUPERSEDED)

    # The old process keeps heartbeating; one may renew the lease between the
    # advance and the reclaim (due within 1 s, docs/protocol/dispatch.md §10), so advance again until the
    # lease has lapsed.
    def lapsed():
        kernel.advance(4)
        try:
            return kernel.wait_event(eid, lambda e: e["type"] == "dispatch.lease_expired", timeout=3)
        except AssertionError:
            return None

    wait_until(lapsed, timeout=20, what="lease of attempt 1 reclaimed")
    assert records.wait("gate:attempt2")[0]["pid"] == new.pid

    # Without being released, the old handler is stopped by its refused heartbeat.
    stopped = records.wait("handler:exit", pid=old.pid)[0]
    assert stopped["attempt"] == 1 and stopped["outcome"] == "cancelled"
    assert kernel.metric(SUPERSEDED) >= before + 1
    refused = kernel.metric(
        "rebuno_http_requests_total",
        where=lambda lb: lb.get("route", "").endswith("/heartbeat") and lb.get("status") == "409",
    )
    assert refused >= 1
    # The client's heartbeats are body-less POSTs (docs/protocol/dispatch.md §9); those of the current
    # attempt, waiting at its gate, are accepted.
    wait_until(
        lambda: kernel.metric(
            "rebuno_http_requests_total",
            where=lambda lb: lb.get("route", "").endswith("/heartbeat") and lb.get("status") == "204",
        ),
        timeout=10,
        what="an accepted heartbeat",
    )
    gates.release("attempt1")  # nothing is waiting there any more

    gates.release("attempt2")
    _check_completed_once(kernel, records, eid, new.pid)
    assert records.wait("handler:exit", pid=new.pid)[0]["outcome"] == "returned"


def test_redelivery_to_same_process_replaces_handler(kernel, spawn_agent, records, gates):
    """When the redelivery reaches the process still running the old attempt, the
    client cancels the old handler itself; the kernel refuses nothing."""
    agent = spawn_agent("gated_agent.py", AGENT)
    eid = kernel.create_execution(AGENT, {"x": 1})["id"]
    records.wait("gate:attempt1")
    before = kernel.metric(SUPERSEDED)

    kernel.advance(121)
    assert records.wait("gate:attempt2")[0]["pid"] == agent.pid
    stopped = records.wait("handler:exit", attempt=1)[0]
    assert stopped["outcome"] == "cancelled"

    gates.release("attempt1")
    gates.release("attempt2")
    _check_completed_once(kernel, records, eid, agent.pid)
    assert kernel.metric(SUPERSEDED) == before
