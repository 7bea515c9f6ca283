"""`resource()`, `CheckpointPolicy`, drivers, serialisation and captures
(docs/protocol/sdk.md §4), against the in-memory kernel of
`resource_fakes.py`, which applies the kernel's counting and refusal rules."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

import httpx2
import pytest
from mcp.types import CallToolResult, TextContent, Tool

from rebuno import (CheckpointPolicy, CheckpointUnavailable, Client, CoveragePoint, CoverageRanges, Terminated,
                    ToolError, execution, http_client, resource, step, tool, wrap_tool)
from rebuno.mcp import wrap_mcp_tool

from .fakes import make_agent
from .resource_fakes import FakeDriver, Handle, OtherDriver, ResourceKernel, run_handler

KEY = "workspace"


@pytest.fixture
def rk() -> ResourceKernel:
    return ResourceKernel()


def resource_requests(rk: ResourceKernel) -> list[str]:
    return [r.path.split("/resources", 1)[1] or "register" for r in rk.requests if "/resources" in r.path]


# ------------------------------------------------------------------- policy


def test_checkpoint_policy_defaults_and_validation() -> None:
    p = CheckpointPolicy()
    assert (p.every_steps, p.on_completion) == (1, True)
    assert CheckpointPolicy(every_steps=5) == CheckpointPolicy(5, True)
    assert CheckpointPolicy(every_steps=1_000_000).every_steps == 1_000_000
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.every_steps = 3  # type: ignore[misc]
    for bad in (0, -1, 1_000_001, True, False, 2.0, "5", None):
        with pytest.raises(ValueError, match="every_steps"):
            CheckpointPolicy(every_steps=bad)  # type: ignore[arg-type]
    for bad_flag in (1, None, "yes"):
        with pytest.raises(TypeError, match="on_completion"):
            CheckpointPolicy(on_completion=bad_flag)  # type: ignore[arg-type]


async def test_resource_outside_an_execution() -> None:
    with pytest.raises(RuntimeError, match="inside a Rebuno handler"):
        await resource(KEY, driver=FakeDriver())


class _Bad(FakeDriver):
    pass


def _driver_with(**attrs: Any) -> FakeDriver:
    d = _Bad()
    for k, v in attrs.items():
        setattr(d, k, v)
    return d


@pytest.mark.parametrize("key,driver,exc", [
    ("..", FakeDriver(), ValueError),
    (".", FakeDriver(), ValueError),
    ("a/b", FakeDriver(), ValueError),
    ("x" * 129, FakeDriver(), ValueError),
    (KEY, _driver_with(driver_id=""), ValueError),
    (KEY, _driver_with(driver_id="d" * 257), ValueError),
    (KEY, _driver_with(driver_id=7), TypeError),
    (KEY, _driver_with(configuration={1, 2}), TypeError),
    (KEY, _driver_with(configuration={"x": float("nan")}), TypeError),
    (KEY, _driver_with(coverage_reuse="yes"), TypeError),
    (KEY, _driver_with(checkpoint=None), TypeError),
])
async def test_resource_validates_before_the_kernel(rk: ResourceKernel, key: str, driver: Any,
                                                    exc: type[Exception]) -> None:
    kind, err = await run_handler(rk, lambda: resource(key, driver=driver))
    assert kind == "raised" and isinstance(err, exc), err
    assert resource_requests(rk) == []


async def test_resource_rejects_a_policy_that_is_not_one(rk: ResourceKernel) -> None:
    kind, err = await run_handler(rk, lambda: resource(KEY, driver=FakeDriver(),
                                                       checkpoints={"every_steps": 2}))  # type: ignore[arg-type]
    assert isinstance(err, TypeError) and resource_requests(rk) == []


def test_resources_keyword_validation() -> None:
    for bad in (["a/b"], ["."], [".."], [""], ["x" * 129], "workspace", [3]):
        with pytest.raises(ValueError):
            tool("t", resources=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            wrap_tool(lambda: 1, "t", resources=bad)  # type: ignore[arg-type]
    info = tool("t", resources=["b", "a", "b"])(lambda: 1).__rebuno_tool__  # type: ignore[attr-defined]
    assert info["resources"] == ["b", "a"]  # duplicates dropped, the first kept


# ---------------------------------------------------------------- lifecycle


@pytest.mark.parametrize("sync", [False, True], ids=["async-driver", "sync-driver"])
async def test_first_use_registers_creates_binds_and_takes_a_baseline(rk: ResourceKernel, sync: bool) -> None:
    driver = FakeDriver(configuration={"timeout": 600}, sync=sync)

    async def body() -> Any:
        h1 = await resource(KEY, driver=driver)
        h2 = await resource(KEY, driver=FakeDriver(configuration={"timeout": 600}))
        return h1, h2

    kind, (h1, h2) = await run_handler(rk, body)
    assert kind == "ok" and isinstance(h1, Handle) and h1 is h2  # the same handle for the key
    reg = rk.bodies("/resources")[0]
    assert reg == {"key": KEY, "driver_id": "fake.v1", "configuration": {"timeout": 600}, "coverage_reuse": False,
                   "every_steps": 1, "on_completion": True}
    assert driver.calls[:2] == [("create",), ("checkpoint", "h1")]  # create() without an argument
    # Plain driver methods run in a worker thread, async ones on the loop.
    assert set(driver.on_loop_thread) == {not sync}
    assert rk.bodies(f"/resources/{KEY}/binding") == [{"binding": {"id": "h1"}}]
    assert rk.bodies("/resources/checkpoints")[0] == {
        "captures": [{"key": KEY, "generation": 0, "checkpoint_ref": "ref-1"}]}
    assert rk.log[:3] == [("registered", KEY), ("bound", KEY), ("checkpointed", KEY, 0, "ref-1")]
    # At completion the resource is still covered: re-registered, not captured again.
    assert resource_requests(rk) == ["register", f"/{KEY}/binding", "/checkpoints", "register"]
    assert rk.log[-1] == ("completed",)


async def test_headers_carry_the_dispatch(rk: ResourceKernel) -> None:
    await run_handler(rk, lambda: resource(KEY, driver=FakeDriver()))
    for r in rk.requests:
        if "/resources" in r.path:
            assert r.headers["rebuno-dispatch-id"] and r.headers["rebuno-dispatch-attempt"] == "1"


async def test_a_fork_at_a_covered_point_restores_and_takes_no_baseline(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, checkpoint_ref="snap-7", covered=True, generation=3)
    driver = FakeDriver()
    kind, h = await run_handler(rk, lambda: resource(KEY, driver=driver), eid)
    assert kind == "ok" and driver.calls == [("create", "snap-7")]  # the ref, positionally
    assert rk.log == [("bound", KEY), ("completed",)]


async def test_a_fork_at_an_uncovered_point_restores_then_takes_a_baseline(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, checkpoint_ref="snap-7", covered=False, generation=4)
    driver = FakeDriver()
    await run_handler(rk, lambda: resource(KEY, driver=driver), eid)
    assert driver.calls == [("create", "snap-7"), ("checkpoint", "h1")]
    assert rk.checkpointed() == [("checkpointed", KEY, 4, "ref-1")]  # at the view's generation


async def test_a_recorded_binding_is_opened(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, binding={"id": "h9"}, generation=2, covered=False)
    driver = FakeDriver()
    kind, h = await run_handler(rk, lambda: resource(KEY, driver=driver), eid)
    assert kind == "ok" and h.name == "opened-h9"
    # No create, no bind and no baseline after an open; the completion capture
    # then covers the uncovered resource.
    assert driver.calls == [("open", {"id": "h9"}), ("checkpoint", "opened-h9")]
    assert resource_requests(rk) == ["register", "register", "/checkpoints"]


async def test_concurrent_first_calls_open_once(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    async def body() -> Any:
        return await asyncio.gather(*(resource(KEY, driver=driver) for _ in range(3)))

    kind, handles = await run_handler(rk, body)
    assert kind == "ok" and handles[0] is handles[1] is handles[2]
    assert driver.named("create") == [("create",)] and len(rk.bodies("/resources")) == 2  # + the completion read


async def test_a_different_identity_in_the_same_dispatch_raises(rk: ResourceKernel) -> None:
    async def body() -> list[str]:
        await resource(KEY, driver=FakeDriver(configuration={"a": 1}))
        errors = []
        for other in (OtherDriver(configuration={"a": 1}), FakeDriver(configuration={"a": 2}),
                      FakeDriver(configuration={"a": 1}, coverage_reuse=True)):
            with pytest.raises(ValueError) as info:
                await resource(KEY, driver=other)
            errors.append(str(info.value))
        assert await resource(KEY, driver=FakeDriver(configuration={"a": 1})) is not None
        return errors

    kind, errors = await run_handler(rk, body)
    assert kind == "ok", errors
    assert "'fake.v1'" in errors[0] and "'other.v1'" in errors[0]
    assert '{"a":1}' in errors[1] and '{"a":2}' in errors[1]
    assert "coverage_reuse False" in errors[2] and "coverage_reuse True" in errors[2]
    assert len([b for b in rk.bodies("/resources")]) == 2  # first use and the completion read only


async def test_a_different_policy_is_ignored_with_one_warning(rk: ResourceKernel,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, every_steps=5, on_completion=True, binding={"id": "h1"})
    caplog.set_level(logging.WARNING, "rebuno")

    async def body() -> Any:
        a = await resource(KEY, driver=FakeDriver())  # code says every_steps=1: the stored 5 wins
        b = await resource(KEY, driver=FakeDriver(), checkpoints=CheckpointPolicy(every_steps=2))
        return a is b

    assert await run_handler(rk, body, eid) == ("ok", True)
    warnings = [r for r in caplog.records if "checkpoint policy" in r.getMessage()]
    assert len(warnings) == 1 and "every_steps=5" in warnings[0].getMessage()
    assert rk.resources[eid][KEY].every_steps == 5


async def test_a_recorded_conflict_raises_and_fails_the_execution(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, driver_id="fake.v1", configuration={"template": "/a"}, binding={"id": "h1"})
    agent = make_agent(rk)

    @agent.bind
    async def process() -> None:
        await resource(KEY, driver=FakeDriver(configuration={"template": "/b"}))

    from .fakes import deliver, uuid7
    await deliver(agent, eid, uuid7())
    await agent.join()
    await agent.close()
    status, reason = rk.finished(eid)  # type: ignore[misc]
    assert status == "failed" and reason.startswith('agent_error: ValueError: resource "workspace" is registered')
    assert '{"template":"/a"}' in reason and '{"template":"/b"}' in reason


async def test_checkpoint_unavailable_fails_the_execution_at_once(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, checkpoint_ref="snap-gone", covered=True, generation=2)
    driver = FakeDriver()
    driver.create_error = CheckpointUnavailable("snapshot snap-gone expired")
    later: list[Any] = []

    async def body() -> None:
        try:
            await resource(KEY, driver=driver)
        except CheckpointUnavailable:
            pass  # swallowed: the context is terminal anyway
        try:
            await step("after", lambda: 1)
        except Terminated as t:
            later.append(t)

    assert await run_handler(rk, body, eid) == ("ok", None)
    assert rk.finished(eid) == ("failed", 'checkpoint_unavailable: resource "workspace": snapshot snap-gone expired')
    assert isinstance(later[0], Terminated) and rk.submits() == []
    assert resource_requests(rk) == ["register"]  # nothing bound
    assert rk.log == [("failed_execution",)]  # and the Agent did nothing more


async def test_other_create_errors_propagate_and_may_be_retried(rk: ResourceKernel) -> None:
    driver = FakeDriver()
    driver.create_error = ConnectionError("provider flaked")

    async def body() -> Any:
        try:
            await resource(KEY, driver=driver)
        except ConnectionError:
            driver.create_error = None
        return (await resource(KEY, driver=driver)).name

    eid = rk.add_execution()
    assert await run_handler(rk, body, eid) == ("ok", "h1")
    assert driver.named("create") == [("create",), ("create",)]
    assert rk.bodies(f"/resources/{KEY}/binding") == [{"binding": {"id": "h1"}}]
    assert rk.finished(eid) == ("completed", "h1")

    rk2 = ResourceKernel()
    failing = FakeDriver()
    failing.create_error = ConnectionError("provider down")
    eid2 = rk2.add_execution()
    agent = make_agent(rk2)

    @agent.bind
    async def process() -> None:
        await resource(KEY, driver=failing)

    from .fakes import deliver, uuid7
    await deliver(agent, eid2, uuid7())
    await agent.join()
    await agent.close()
    assert rk2.finished(eid2) == ("failed", "agent_error: ConnectionError: provider down")
    assert resource_requests(rk2) == ["register"]


async def test_open_errors_propagate(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, binding={"id": "h1"})
    driver = FakeDriver()
    driver.open_error = FileNotFoundError("workspace gone")
    kind, err = await run_handler(rk, lambda: resource(KEY, driver=driver), eid)
    assert kind == "raised" and isinstance(err, FileNotFoundError)
    assert driver.named("create") == [] and resource_requests(rk) == ["register"]


@pytest.mark.parametrize("result", ["nope", (Handle("x"),), (Handle("x"), None), (Handle("x"), {1, 2})])
async def test_create_results_are_checked(rk: ResourceKernel, result: Any) -> None:
    driver = FakeDriver()
    driver.create_result = result
    kind, err = await run_handler(rk, lambda: resource(KEY, driver=driver))
    assert kind == "raised" and isinstance(err, TypeError)
    assert resource_requests(rk) == ["register"]


async def test_create_may_return_a_list(rk: ResourceKernel) -> None:
    driver = FakeDriver()
    driver.create_result = [Handle("listed"), {"id": "listed"}]
    kind, h = await run_handler(rk, lambda: resource(KEY, driver=driver))
    assert kind == "ok" and h.name == "listed"


async def test_register_on_a_terminal_execution_raises_terminated(rk: ResourceKernel) -> None:
    def before(k: ResourceKernel, r: Any) -> Any:
        if r.path.endswith("/resources"):
            k.executions[r.path.split("/")[3]]["status"] = "cancelled"
        return None

    rk.before = before
    kind, err = await run_handler(rk, lambda: resource(KEY, driver=FakeDriver()))
    assert kind == "raised" and isinstance(err, Terminated)


# --------------------------------------------------------- declaring effects


async def test_declared_keys_need_resource_in_this_dispatch(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, binding={"id": "h1"})  # registered by an earlier dispatch

    @tool("write", resources=[KEY])
    async def write() -> str:
        raise AssertionError("must not run")

    kind, err = await run_handler(rk, write, eid)
    assert kind == "raised" and isinstance(err, ValueError) and "resource()" in str(err)
    rk.executions[eid]["status"] = "running"
    kind, err = await run_handler(rk, lambda: step("s", lambda: 1, resources=[KEY]), eid)
    assert isinstance(err, ValueError)
    assert rk.submits() == []


async def test_every_submit_carries_resources(rk: ResourceKernel) -> None:
    provider = httpx2.MockTransport(lambda r: httpx2.Response(200, json={"ok": True}))

    @tool("write", resources=[KEY, "cache"])
    async def write() -> str:
        return "w"

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        await resource("cache", driver=OtherDriver())
        await write()
        await step("plain", lambda: 1)
        await wrap_tool(lambda: 2, "wrapped", resources=["cache"])()
        async with http_client(transport=provider) as c:
            await c.post("http://llm.test/v1/chat", json={"model": "m"})
        return None

    await run_handler(rk, body)
    sent = [(b["target"], b["resources"]) for b in (r.json() for r in rk.submits())]
    assert sent == [("write", [KEY, "cache"]), ("plain", []), ("wrapped", ["cache"]), ("m", [])]


# -------------------------------------------------------------- due captures


async def test_a_due_capture_runs_after_the_body_and_before_the_outcome_returns(rk: ResourceKernel) -> None:
    order: list[str] = []
    driver = FakeDriver()

    async def on_checkpoint() -> None:
        order.append("checkpoint")

    @tool("write", resources=[KEY])
    async def write(path: str) -> str:
        order.append("body")
        return f"wrote {path}"

    async def body() -> Any:
        await resource(KEY, driver=driver, checkpoints=CheckpointPolicy(every_steps=2))
        driver.on_checkpoint = on_checkpoint
        results = []
        for name in ("a", "b", "c"):
            results.append(await write(name))
            order.append("returned")
        return results

    assert await run_handler(rk, body) == ("ok", ["wrote a", "wrote b", "wrote c"])
    # every_steps=2: the 2nd write is due; its capture runs before the call returns.
    assert order == ["body", "returned", "body", "checkpoint", "returned", "body", "returned", "checkpoint"]
    outcomes = rk.outcomes()
    assert [o.get("captures") for o in outcomes] == [
        None, [{"key": KEY, "generation": 2, "checkpoint_ref": "ref-2"}], None]
    # The checkpoint is recorded with the outcome it travels with, then the
    # last write leaves it uncovered and the completion capture covers the end.
    steps_and_ckpts = [e for e in rk.log if e[0] in ("succeeded", "checkpointed", "completed")]
    assert steps_and_ckpts == [
        ("checkpointed", KEY, 0, "ref-1"), ("succeeded", "write"), ("succeeded", "write"),
        ("checkpointed", KEY, 2, "ref-2"), ("succeeded", "write"), ("checkpointed", KEY, 3, "ref-3"), ("completed",)]


async def test_a_failed_body_sends_its_capture_with_the_fail(rk: ResourceKernel) -> None:
    @tool("write", resources=[KEY])
    async def write() -> str:
        raise OSError("disk full")

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        await write()

    kind, err = await run_handler(rk, body)
    assert isinstance(err, ToolError) and err.message == "disk full"
    (fail,) = rk.outcomes()
    assert fail == {"error": {"message": "disk full", "type": "OSError"},
                    "captures": [{"key": KEY, "generation": 1, "checkpoint_ref": "ref-2"}]}


@pytest.mark.parametrize("bad,message", [
    (RuntimeError("snapshot quota exceeded"), "snapshot quota exceeded"),
    ("", "checkpoint() returned an empty ref"),
    (42, "checkpoint() must return a string ref, not int"),
    ("r" * 1025, "checkpoint() returned a ref longer than 1024 bytes"),
    (RuntimeError(), "RuntimeError"),
])
async def test_a_capture_failure_keeps_the_outcome(rk: ResourceKernel, caplog: pytest.LogCaptureFixture,
                                                   bad: Any, message: str) -> None:
    driver = FakeDriver()
    caplog.set_level(logging.WARNING, "rebuno")

    @tool("write", resources=[KEY])
    async def write() -> str:
        driver.checkpoint_result = bad
        return "wrote a.txt"

    async def body() -> Any:
        await resource(KEY, driver=driver, checkpoints=CheckpointPolicy(on_completion=False))
        return await write()

    assert await run_handler(rk, body) == ("ok", "wrote a.txt")
    (complete,) = rk.outcomes()
    assert complete == {"result": "wrote a.txt",
                        "capture_failures": [{"key": KEY, "generation": 1, "error": message}]}
    assert ("checkpoint_failed", KEY, 1, message) in rk.log
    assert rk.resources[next(iter(rk.resources))][KEY].covered is False
    assert any(KEY in r.getMessage() and message in r.getMessage() for r in caplog.records)


async def test_a_capture_failure_message_is_cut_to_4_kib(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    @tool("write", resources=[KEY])
    async def write() -> str:
        driver.checkpoint_result = RuntimeError("é" * 3000)  # 6000 bytes
        return "ok"

    async def body() -> Any:
        await resource(KEY, driver=driver)
        return await write()

    await run_handler(rk, body)
    error = rk.outcomes()[0]["capture_failures"][0]["error"]
    assert len(error.encode("utf-8")) == 4096 and error == "é" * 2048


async def test_a_replay_takes_no_capture(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    @tool("write", resources=[KEY])
    async def write() -> str:
        return "w"

    async def body() -> Any:
        await resource(KEY, driver=driver)
        return await write()

    eid = rk.add_execution()
    await run_handler(rk, body, eid)
    calls = len(driver.named("checkpoint"))
    rk.executions[eid]["status"] = "running"
    assert await run_handler(rk, body, eid) == ("ok", "w")  # replayed
    # The second dispatch opens the binding; the replay itself captures nothing
    # (the completion capture runs only if the resource is uncovered: it is not).
    assert len(driver.named("checkpoint")) == calls and driver.named("open") == [("open", {"id": "h1"})]


async def test_the_newest_generation_from_any_answer_is_used(rk: ResourceKernel) -> None:
    """An LLM call started inside a body raises the generation; the capture
    after the body carries it (and is therefore accepted)."""
    provider = httpx2.MockTransport(lambda r: httpx2.Response(200, json={"ok": True}))

    @tool("write", resources=[KEY])
    async def write() -> str:
        async with http_client(transport=provider) as c:
            await c.post("http://llm.test/v1/chat", json={"model": "m"})
        return "w"

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        return await write()

    await run_handler(rk, body)
    (complete,) = [o for o in rk.outcomes() if "captures" in o]
    assert complete["captures"][0]["generation"] == 2  # write started at 1, the LLM call raised it to 2
    assert ("checkpointed", KEY, 2, "ref-2") in rk.log


async def test_no_capture_once_the_dispatch_is_stopping(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    @tool("write", resources=[KEY])
    async def write() -> str:
        execution().stop("lease_superseded")
        return "w"

    async def body() -> Any:
        await resource(KEY, driver=driver)
        return await write()

    await run_handler(rk, body)
    assert driver.named("checkpoint") == [("checkpoint", "h1")]  # the baseline only
    assert all("captures" not in o for o in rk.outcomes())


async def test_a_cancelled_body_sends_its_capture_with_the_fail(rk: ResourceKernel) -> None:
    started = asyncio.Event()

    @tool("slow", resources=[KEY])
    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    async def body() -> str:
        await resource(KEY, driver=FakeDriver())
        task = asyncio.create_task(slow())
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    assert await run_handler(rk, body) == ("ok", "cancelled")
    (fail,) = rk.outcomes()
    assert fail == {"error": {"message": "cancelled after start", "type": "cancelled"},
                    "captures": [{"key": KEY, "generation": 1, "checkpoint_ref": "ref-2"}]}


# -------------------------------------------------------------- nesting


async def test_nested_due_captures_go_with_the_outermost_step(rk: ResourceKernel) -> None:
    order: list[str] = []
    driver = FakeDriver()

    @tool("inner", resources=[KEY])
    async def inner(n: int) -> int:
        order.append(f"inner{n}")
        return n

    @tool("outer")
    async def outer() -> list[int]:
        a = await inner(1)
        b = await step("lint", lambda: 2, resources=[KEY])
        order.append("outer-end")
        return [a, b]

    async def body() -> Any:
        await resource(KEY, driver=driver)
        driver.on_checkpoint = _append(order, "checkpoint")
        return await outer()

    assert await run_handler(rk, body) == ("ok", [1, 2])
    assert order == ["inner1", "outer-end", "checkpoint"]  # captured once, after the outer body
    outcomes = rk.outcomes()
    # inner, lint and outer, in completion order; only outer carries a capture,
    # at the newest generation (outer 1, inner 2, lint 3).
    assert [o.get("captures") for o in outcomes] == [
        None, None, [{"key": KEY, "generation": 3, "checkpoint_ref": "ref-2"}]]
    assert ("checkpointed", KEY, 3, "ref-2") in rk.log


def _append(order: list[str], what: str) -> Any:
    async def hook() -> None:
        order.append(what)

    return hook


async def test_a_resource_first_opened_inside_a_body_defers_its_baseline(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    @tool("setup")
    async def setup() -> str:
        h = await resource(KEY, driver=driver)
        return h.name

    assert await run_handler(rk, setup) == ("ok", "h1")
    assert rk.bodies("/resources/checkpoints") == []  # no publish: the baseline went with the step
    (complete,) = rk.outcomes()
    assert complete == {"result": "h1", "captures": [{"key": KEY, "generation": 0, "checkpoint_ref": "ref-1"}]}
    assert ("checkpointed", KEY, 0, "ref-1") in rk.log


# -------------------------------------------------------------- serialisation


def _overlaps(spans: list[tuple[float, float]]) -> bool:
    spans = sorted(spans)
    return any(spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1))


def _timed_tool(spans: list[tuple[float, float]], name: str, declared: list[str] | None = None) -> Any:
    @tool(name, resources=declared)
    async def timed(n: int) -> int:
        t0 = time.monotonic()
        await asyncio.sleep(0.05)
        spans.append((t0, time.monotonic()))
        return n

    return timed


async def test_tools_run_one_at_a_time_while_the_execution_has_resources(rk: ResourceKernel) -> None:
    spans: list[tuple[float, float]] = []
    timed = _timed_tool(spans, "timed")

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        return await asyncio.gather(*(timed(i) for i in range(4)))

    assert await run_handler(rk, body) == ("ok", [0, 1, 2, 3])
    assert len(spans) == 4 and not _overlaps(spans)


async def test_tools_overlap_without_resources(rk: ResourceKernel) -> None:
    spans: list[tuple[float, float]] = []
    timed = _timed_tool(spans, "timed")

    async def body() -> Any:
        return await asyncio.gather(*(timed(i) for i in range(4)))

    assert await run_handler(rk, body) == ("ok", [0, 1, 2, 3])
    assert _overlaps(spans)


async def test_llm_calls_never_take_the_lock(rk: ResourceKernel) -> None:
    spans: list[tuple[float, float]] = []

    async def slow_provider(request: httpx2.Request) -> httpx2.Response:
        t0 = time.monotonic()
        await asyncio.sleep(0.05)
        spans.append((t0, time.monotonic()))
        return httpx2.Response(200, json={"ok": True})

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        async with http_client(transport=httpx2.MockTransport(slow_provider)) as c:
            await asyncio.gather(*(c.post("http://llm.test/v1/chat", json={"model": "m", "n": i})
                                   for i in range(2)))

    await run_handler(rk, body)
    assert len(spans) == 2 and _overlaps(spans)


async def test_the_lock_is_on_from_dispatch_start_when_resources_exist(rk: ResourceKernel) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, KEY, binding={"id": "h1"})
    spans: list[tuple[float, float]] = []
    timed = _timed_tool(spans, "timed")

    async def body() -> Any:  # never calls resource()
        return await asyncio.gather(*(timed(i) for i in range(3)))

    assert await run_handler(rk, body, eid) == ("ok", [0, 1, 2])
    assert not _overlaps(spans)


async def test_a_tool_calling_tools_nests_without_deadlock(rk: ResourceKernel) -> None:
    spans: list[tuple[float, float]] = []
    timed = _timed_tool(spans, "timed")

    @tool("fan_out")
    async def fan_out() -> list[int]:
        return list(await asyncio.gather(*(timed(i) for i in range(3))))

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        return await asyncio.wait_for(fan_out(), 5)

    assert await run_handler(rk, body) == ("ok", [0, 1, 2])
    assert _overlaps(spans)  # nested calls are not serialised with each other


async def test_a_task_that_outlives_its_body_takes_the_lock(rk: ResourceKernel) -> None:
    spans: dict[str, tuple[float, float]] = {}
    release_leftover = asyncio.Event()
    leftover_done = asyncio.Event()

    @tool("late")
    async def late() -> str:
        t0 = time.monotonic()
        await asyncio.sleep(0.01)
        spans["late"] = (t0, time.monotonic())
        return "late"

    @tool("spawner")
    async def spawner() -> str:
        async def leftover() -> None:
            await release_leftover.wait()
            await late()
            leftover_done.set()

        asyncio.get_running_loop().create_task(leftover())
        return "spawned"

    @tool("holder")
    async def holder() -> str:
        t0 = time.monotonic()
        release_leftover.set()  # the leftover task now wants the lock
        await asyncio.sleep(0.1)
        spans["holder"] = (t0, time.monotonic())
        return "held"

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        await spawner()
        await holder()
        await asyncio.wait_for(leftover_done.wait(), 5)
        return None

    await run_handler(rk, body)
    assert spans["late"][0] >= spans["holder"][1]  # it waited for holder, which held the lock


# ---------------------------------------------------------- completion capture


async def test_the_completion_capture_runs_before_complete(rk: ResourceKernel) -> None:
    @tool("write", resources=[KEY])
    async def write() -> str:
        return "w"

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver(), checkpoints=CheckpointPolicy(every_steps=5))
        await write()
        return "done"

    eid = rk.add_execution()
    await run_handler(rk, body, eid)
    paths = [r.path.rsplit("/", 1)[-1] for r in rk.requests if r.method == "POST"]
    assert paths[-3:] == ["resources", "checkpoints", "complete"]  # read the view, publish, complete
    assert rk.bodies("/resources/checkpoints")[-1] == {
        "captures": [{"key": KEY, "generation": 1, "checkpoint_ref": "ref-2"}]}
    assert rk.log[-2:] == [("checkpointed", KEY, 1, "ref-2"), ("completed",)]
    assert rk.finished(eid) == ("completed", "done")


async def test_completion_captures_follow_registration_order_in_one_publish(rk: ResourceKernel) -> None:
    async def body() -> Any:
        await resource("b", driver=OtherDriver())
        await resource("a", driver=FakeDriver())
        await step("touch", lambda: 1)  # ends the coverage of both (coverage_reuse off)
        return None

    await run_handler(rk, body)
    last = rk.bodies("/resources/checkpoints")[-1]
    assert [c["key"] for c in last["captures"]] == ["b", "a"]
    assert len(rk.bodies("/resources/checkpoints")) == 3  # two baselines and one completion publish


async def test_no_completion_capture_when_on_completion_is_off_or_covered(rk: ResourceKernel) -> None:
    async def body() -> Any:
        await resource("off", driver=FakeDriver(), checkpoints=CheckpointPolicy(every_steps=9, on_completion=False))
        await resource("reuse", driver=OtherDriver(coverage_reuse=True))
        await step("touch", lambda: 1)  # "off" is uncovered now; "reuse" stays covered
        return None

    await run_handler(rk, body)
    assert len(rk.bodies("/resources/checkpoints")) == 2  # the baselines only


async def test_a_completion_capture_failure_still_completes(rk: ResourceKernel) -> None:
    driver = FakeDriver()

    async def body() -> Any:
        await resource(KEY, driver=driver)
        await step("touch", lambda: 1)
        driver.checkpoint_result = RuntimeError("no space")
        return "done"

    eid = rk.add_execution()
    await run_handler(rk, body, eid)
    assert rk.bodies("/resources/checkpoints")[-1] == {
        "capture_failures": [{"key": KEY, "generation": 1, "error": "no space"}]}
    assert rk.finished(eid) == ("completed", "done")


async def test_unopened_resources_are_named_in_one_warning(rk: ResourceKernel,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    eid = rk.add_execution()
    rk.add_resource(eid, "cache", binding={"id": "c"})
    rk.add_resource(eid, "db", binding={"id": "d"})
    caplog.set_level(logging.WARNING, "rebuno")
    await run_handler(rk, lambda: step("s", lambda: 1), eid)
    warnings = [r.getMessage() for r in caplog.records if "completion capture" in r.getMessage()]
    assert len(warnings) == 1 and '"cache"' in warnings[0] and '"db"' in warnings[0]
    assert rk.finished(eid) == ("completed", 1)


async def test_no_completion_capture_when_the_handler_fails(rk: ResourceKernel) -> None:
    driver = FakeDriver()
    eid = rk.add_execution()
    agent = make_agent(rk)

    @agent.bind
    async def process() -> None:
        await resource(KEY, driver=driver)
        await step("touch", lambda: 1)
        raise RuntimeError("boom")

    from .fakes import deliver, uuid7
    await deliver(agent, eid, uuid7())
    await agent.join()
    await agent.close()
    assert rk.finished(eid) == ("failed", "agent_error: RuntimeError: boom")
    assert driver.named("checkpoint") == [("checkpoint", "h1")]  # the baseline only


# ------------------------------------------------------------- MCP wrappers


class _Session:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        self.calls.append((name, arguments))
        return CallToolResult(content=[TextContent(type="text", text="done")])


async def test_mcp_tools_declare_resources(rk: ResourceKernel) -> None:
    session = _Session()
    t = Tool(name="shell", description="Run.", input_schema={"type": "object", "properties": {
        "cmd": {"type": "string"}}, "required": ["cmd"]})
    shell = wrap_mcp_tool(session, t, resources=[KEY])  # type: ignore[arg-type]

    async def body() -> Any:
        await resource(KEY, driver=FakeDriver())
        return await shell(cmd="make")

    assert await run_handler(rk, body) == ("ok", "done")
    assert rk.submits()[0].json()["resources"] == [KEY]
    assert rk.outcomes()[0]["captures"] == [{"key": KEY, "generation": 1, "checkpoint_ref": "ref-2"}]


# -------------------------------------------------------------------- Client


async def test_client_fork_coverage_and_forks() -> None:
    seen: list[httpx2.Request] = []
    failures = {"fork": 1}
    source = "018ff0a0-0000-7000-8000-000000000001"
    fork_id = "018ff0a0-0000-7000-8000-000000000002"

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/fork"):
            if failures["fork"]:
                failures["fork"] -= 1
                return httpx2.Response(503, json={"code": "unavailable", "message": "busy"})
            return httpx2.Response(201, json={
                "id": fork_id, "agent_id": "coder", "status": "running", "forked_from": source, "fork_seq": 15,
                "restoration": {KEY: {"checkpoint_ref": "C1", "checkpoint_seq": 15, "covered": True}},
                "resource_keys": [KEY]})
        if path.endswith("/coverage"):
            if request.url.params.get("at_seq"):
                return httpx2.Response(200, json={"execution_id": source, "at_seq": 23, "covered": False,
                                                  "resources": [{"key": KEY, "covered": False,
                                                                 "reason": "step_started", "checkpoint_ref": "C1",
                                                                 "checkpoint_seq": 15}]})
            return httpx2.Response(200, json={"execution_id": source, "last_event_seq": 30,
                                              "covered_ranges": [[1, 4], [7, 9]],
                                              "resources": [{"key": KEY, "registered_seq": 5,
                                                             "covered_ranges": [[7, 9]]}]})
        if path.endswith("/forks"):
            return httpx2.Response(200, json={"executions": [{"id": fork_id, "agent_id": "coder",
                                                              "status": "running", "forked_from": source}],
                                              "next_cursor": None})
        return httpx2.Response(404, json={"code": "not_found", "message": "no"})

    async with Client("http://kernel.test", transport=httpx2.MockTransport(handler)) as c:
        fork = await c.fork(source, at_seq=15)
        assert (fork.id, fork.forked_from, fork.fork_seq, fork.resource_keys) == (fork_id, source, 15, [KEY])
        assert fork.restoration == {KEY: {"checkpoint_ref": "C1", "checkpoint_seq": 15, "covered": True}}
        first, retry = seen[0], seen[1]
        assert json.loads(first.content) == {"at_seq": 15}
        assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]  # reused on the retry
        await c.fork(source, at_seq=16)
        assert seen[2].headers["idempotency-key"] != first.headers["idempotency-key"]  # fresh per call

        point = await c.coverage(source, at_seq=23)
        assert isinstance(point, CoveragePoint) and point.covered is False
        assert (point.resources[0].reason, point.resources[0].checkpoint_ref,
                point.resources[0].checkpoint_seq) == ("step_started", "C1", 15)
        assert seen[-1].url.params["at_seq"] == "23"
        ranges = await c.coverage(source)
        assert isinstance(ranges, CoverageRanges) and ranges.covered_ranges == [(1, 4), (7, 9)]
        assert ranges.covered(8) and not ranges.covered(5) and ranges.resources[0].registered_seq == 5

        page = await c.list_forks(source, limit=10, cursor=fork_id)
        assert [e.forked_from for e in page.executions] == [source]
        assert dict(seen[-1].url.params) == {"limit": "10", "cursor": fork_id}
