"""`@tool`, `wrap_tool` and `step()` against every decision, with the in-memory kernel."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from typing import Any, Awaitable, Callable

import pytest

from rebuno import Blocked, PolicyError, RateLimited, Terminated, ToolError, execution, step, tool, wrap_tool

from .fakes import FakeKernel, Recorded, deliver, make_agent, uuid7


async def in_handler(kernel: FakeKernel, body: Callable[[], Awaitable[Any]], eid: str | None = None,
                     attempt: int = 1) -> tuple[str, Any]:
    """Run `body` inside a handler; return ("ok", value) or ("raised", exception).
    With `eid`, the execution is run again (a new dispatch of the same execution)."""
    agent = make_agent(kernel)
    out: list[tuple[str, Any]] = []

    @agent.bind
    async def process() -> None:
        try:
            out.append(("ok", await body()))
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out.append(("raised", e))

    if eid is None:
        eid = kernel.add_execution()
    kernel.executions[eid]["status"] = "running"
    await deliver(agent, eid, uuid7(), attempt)
    await agent.join()
    await agent.close()
    assert out, "handler did not run"
    return out[0]


def submit_bodies(kernel: FakeKernel) -> list[dict[str, Any]]:
    return [r.json() for r in kernel.submits()]


# ------------------------------------------------------------ decoration


def test_tool_keeps_signature_and_doc() -> None:
    @tool("web_search")
    async def search(query: str, limit: int = 3) -> str:
        """Search the web."""
        return query

    assert search.__name__ == "web_search"
    assert search.__doc__ == "Search the web."
    assert list(inspect.signature(search).parameters) == ["query", "limit"]
    assert inspect.signature(search).parameters["limit"].default == 3
    assert inspect.iscoroutinefunction(search)
    assert search.__annotations__["query"] == "str"  # postponed annotations are kept as written

    @tool
    async def bare(x: int) -> int:
        """Bare."""
        return x

    assert bare.__name__ == "bare" and bare.__doc__ == "Bare."


def test_tool_validates_options() -> None:
    with pytest.raises(ValueError):
        tool("x", idempotency="sometimes")  # type: ignore[arg-type]
    for bad in (["a/b"], ["."], [".."], [""], ["x" * 129], "workspace"):
        with pytest.raises(ValueError):
            tool("x", resources=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tool("")


async def test_outside_execution_raises() -> None:
    @tool("t")
    async def t() -> int:
        return 1

    with pytest.raises(RuntimeError, match="inside a Rebuno handler"):
        await t()
    with pytest.raises(RuntimeError):
        await step("s", lambda: 1)
    with pytest.raises(RuntimeError):
        execution()


# -------------------------------------------------------------- decisions


async def test_proceed_records_and_replays(kernel: FakeKernel) -> None:
    calls: list[str] = []

    @tool("read")
    async def read(path: str, encoding: str = "utf-8") -> dict[str, Any]:
        calls.append(path)
        return {"path": path, "pair": (1, 2)}

    eid = kernel.add_execution()
    first = await in_handler(kernel, lambda: read("/tmp"), eid)
    assert first == ("ok", {"path": "/tmp", "pair": [1, 2]})  # the live value is the recorded JSON
    body = submit_bodies(kernel)[0]
    assert body == {"kind": "tool_call", "target": "read", "args": {"encoding": "utf-8", "path": "/tmp"},
                    "idempotency": "safe_to_retry", "resources": []}
    # Same step again in a new dispatch: replayed, the body does not run.
    second = await in_handler(kernel, lambda: read("/tmp"), eid)
    assert second == first and calls == ["/tmp"]


async def test_replayed_error_raises_tool_error(kernel: FakeKernel) -> None:
    kernel.on_submit = lambda k, r: {"decision": "replay", "step_id": "auto",
                                     "error": {"message": "disk full", "type": "OSError"}}

    @tool("write")
    async def write() -> None:
        raise AssertionError("must not run")

    kind, err = await in_handler(kernel, write)
    assert kind == "raised" and isinstance(err, ToolError)
    assert err.tool_id == "write" and err.message == "disk full" and err.error == {"message": "disk full",
                                                                                    "type": "OSError"}
    kernel.on_submit = lambda k, r: {"decision": "replay", "step_id": "auto", "error": {"reason": "x", "n": 1}}
    kind, err = await in_handler(kernel, write)
    assert isinstance(err, ToolError) and err.message == "x"
    kernel.on_submit = lambda k, r: {"decision": "replay", "step_id": "auto", "error": [1, "two"]}
    kind, err = await in_handler(kernel, write)
    assert isinstance(err, ToolError) and err.message == '[1,"two"]'
    # A replayed null result is a result, not an error.
    kernel.on_submit = lambda k, r: {"decision": "replay", "step_id": "auto", "result": None}
    assert await in_handler(kernel, write) == ("ok", None)


async def test_denied_tool_returns_a_string_and_step_raises(kernel: FakeKernel) -> None:
    kernel.on_submit = lambda k, r: {"decision": "denied", "step_id": "auto", "reason": "no shell",
                                     "rule_id": "deny-shell"}

    @tool("shell")
    async def shell(cmd: str) -> str:
        raise AssertionError("must not run")

    kind, value = await in_handler(kernel, lambda: shell("ls"))
    assert kind == "ok" and "denied" in value and "no shell" in value and "deny-shell" in value

    kind, err = await in_handler(kernel, lambda: step("clock", lambda: 1))
    assert isinstance(err, PolicyError) and err.reason == "no shell" and err.rule_id == "deny-shell"

    wrapped = wrap_tool(lambda cmd: cmd, "shell2")
    kind, value = await in_handler(kernel, lambda: wrapped("ls"))
    assert kind == "ok" and "Tool 'shell2' was denied" in value


async def test_rate_limited(kernel: FakeKernel) -> None:
    kernel.on_submit = lambda k, r: {"decision": "rate_limited", "reason": "rate_limit_exceeded",
                                     "retry_after_ms": 250}

    @tool("t")
    async def t() -> int:
        return 1

    kind, err = await in_handler(kernel, t)
    assert isinstance(err, RateLimited) and err.retry_after_ms == 250 and err.reason == "rate_limit_exceeded"


async def test_rate_limited_does_not_advance_the_occurrence(kernel: FakeKernel) -> None:
    def on_submit(k: FakeKernel, r: Recorded) -> Any:
        if len(k.submits()) == 1:
            return {"decision": "rate_limited", "reason": "rate_limit_exceeded"}
        return None

    kernel.on_submit = on_submit

    async def body() -> list[int]:
        try:
            await step("n", lambda: 0)
        except RateLimited:
            pass
        return [await step("n", lambda: 1), await step("n", lambda: 2)]

    assert await in_handler(kernel, body) == ("ok", [1, 2])
    assert [r.headers["rebuno-step-occurrence"] for r in kernel.submits()] == ["0", "0", "1"]


@pytest.mark.parametrize("decision,signal", [
    ({"decision": "blocked", "step_id": "auto", "approval_id": "a"}, Blocked),
    ({"decision": "execution_blocked"}, Blocked),
    ({"decision": "execution_terminal"}, Terminated),
])
async def test_signals(kernel: FakeKernel, decision: dict[str, Any], signal: type[Exception]) -> None:
    kernel.on_submit = lambda k, r: decision
    kind, err = await in_handler(kernel, lambda: step("s", lambda: 1))
    assert kind == "raised" and isinstance(err, signal)


async def test_body_error_is_recorded(kernel: FakeKernel) -> None:
    @tool("flaky")
    async def flaky() -> None:
        raise ConnectionResetError("peer reset")

    eid = kernel.add_execution()
    kind, err = await in_handler(kernel, flaky, eid)
    assert isinstance(err, ToolError) and err.message == "peer reset"
    assert isinstance(err.__cause__, ConnectionResetError)
    (fail,) = [r for r in kernel.requests if r.path.endswith("/fail") and "/steps/" in r.path]
    assert fail.json() == {"error": {"message": "peer reset", "type": "ConnectionResetError"}}
    # The replay raises the same ToolError message.
    kind, err2 = await in_handler(kernel, flaky, eid)
    assert isinstance(err2, ToolError) and err2.message == "peer reset"


async def test_result_must_be_json(kernel: FakeKernel) -> None:
    @tool("weird")
    async def weird() -> Any:
        return {"s": {1, 2}}

    kind, err = await in_handler(kernel, weird)
    assert isinstance(err, ToolError) and "not JSON-serializable: set" in err.message
    (fail,) = [r for r in kernel.requests if r.path.endswith("/fail")]
    assert fail.json()["error"]["type"] == "TypeError"


async def test_cancelled_body_is_recorded_when_the_dispatch_goes_on(kernel: FakeKernel) -> None:
    started = asyncio.Event()

    @tool("slow")
    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    async def body() -> str:
        task = asyncio.create_task(slow())
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "body cancelled"
        return "not cancelled"

    assert await in_handler(kernel, body) == ("ok", "body cancelled")
    (fail,) = [r for r in kernel.requests if r.path.endswith("/fail") and "/steps/" in r.path]
    assert fail.json() == {"error": {"message": "cancelled after start", "type": "cancelled"}}


async def test_identical_concurrent_calls_are_serialised_in_start_order(kernel: FakeKernel) -> None:
    order: list[int] = []

    @tool("ping")
    async def ping(n: int) -> int:
        order.append(execution().dispatch_attempt or 0)
        await asyncio.sleep(0)
        return n

    async def body() -> list[int]:
        return list(await asyncio.gather(ping(1), ping(1), ping(2), ping(1)))

    assert await in_handler(kernel, body) == ("ok", [1, 1, 2, 1])
    by_args: dict[str, list[str]] = {}
    for r in kernel.submits():
        by_args.setdefault(json.dumps(r.json()["args"]), []).append(r.headers["rebuno-step-occurrence"])
    assert by_args == {'{"n": 1}': ["0", "1", "2"], '{"n": 2}': ["0"]}
    assert len(kernel.steps) == 4


async def test_sync_tool_runs_in_a_thread_with_the_context(kernel: FakeKernel) -> None:
    seen: list[Any] = []

    @tool("sync_tool")
    def sync_tool(x: int) -> int:
        seen.append((threading.current_thread() is threading.main_thread(), execution().execution_id))
        return x * 2

    kind, value = await in_handler(kernel, lambda: sync_tool(21))
    assert (kind, value) == ("ok", 42)
    assert seen[0][0] is False and seen[0][1] in kernel.executions


async def test_step_sync_and_async_and_args(kernel: FakeKernel) -> None:
    async def fetch() -> str:
        return "page"

    async def body() -> list[Any]:
        return [await step("now", lambda: 5), await step("fetch", fetch, {"url": "u"}, "at_most_once")]

    assert await in_handler(kernel, body) == ("ok", [5, "page"])
    b1, b2 = submit_bodies(kernel)
    assert b1 == {"kind": "local", "target": "now", "args": {}, "idempotency": "safe_to_retry", "resources": []}
    assert b2 == {"kind": "local", "target": "fetch", "args": {"url": "u"}, "idempotency": "at_most_once",
                  "resources": []}


async def test_step_validates() -> None:
    with pytest.raises(ValueError):
        await step("", lambda: 1)
    with pytest.raises(ValueError):
        await step("s", lambda: 1, resources=["a b"])


async def test_tool_methods_skip_self(kernel: FakeKernel) -> None:
    class Box:
        @tool("box.get")
        async def get(self, key: str) -> str:
            return key.upper()

    assert await in_handler(kernel, lambda: Box().get("k")) == ("ok", "K")
    assert submit_bodies(kernel)[0]["args"] == {"key": "k"}


async def test_body_sees_its_step_id(kernel: FakeKernel) -> None:
    seen: list[Any] = []

    @tool("keyed")
    async def keyed() -> str:
        seen.append(execution().step_id)
        return "ok"

    async def body() -> Any:
        before = execution().step_id
        await keyed()
        return before, execution().step_id

    assert await in_handler(kernel, body) == ("ok", (None, None))
    assert seen == list(kernel.steps)  # the recorded step's id, inside the body only
