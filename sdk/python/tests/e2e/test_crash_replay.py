"""kill -9 of the agent process mid-handler, then redelivery to a new process:
every recorded step replays, only the orphaned step runs again. LLM calls
(openai, streamed and not; LangChain `create_agent`) replay without a second
provider request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import KernelProcess, agent_process, count, eventually, markers, register
from .scripted_llm import ScriptedLLM

SECRET = "crash-secret-0123456789"


async def crash_and_redeliver(kernel: KernelProcess, scenario: str, agent_id: str, tmp_path: Path,
                              input: Any, *, wait_marker: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the scenario, kill the agent once `wait_marker` appears, start a
    new agent process, let the lease lapse and return the finished execution
    (and, under `killed`, the steps as the kernel held them after the kill)."""
    mfile = tmp_path / "markers"
    first = agent_process(scenario, kernel, agent_id, SECRET, mfile, env)
    try:
        url = await first.webhook()
        await register(kernel, agent_id, url, SECRET)
        async with kernel.client() as client:
            ex = await client.create(agent_id, input)
            await eventually(lambda: wait_marker in markers(mfile), timeout=60, what=wait_marker)
            first.kill()  # SIGKILL mid-handler: nothing reported, the step stays executing
            assert (await client.get(ex.id)).status == "running"
            killed = await client.steps(ex.id)
            second = agent_process(scenario, kernel, agent_id, SECRET, mfile, {**(env or {}), "RELEASE": "1"})
            try:
                await register(kernel, agent_id, await second.webhook(), SECRET)
                await kernel.advance(121)  # the killed attempt's lease lapses; the kernel redelivers
                done = await client.wait(ex.id, timeout=60)
            finally:
                second.stop()
            assert done.status == "completed", (done, "".join(second.output))
            events = await client.all_events(ex.id)
            steps = await client.steps(ex.id)
            return {"execution": done, "events": events, "steps": steps, "killed": killed}
    finally:
        first.stop()


async def test_kill_and_replay_tools_and_local_steps(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    out = await crash_and_redeliver(kernel_proc, "crash", "crasher", tmp_path, {"n": 7}, wait_marker="c-start")
    done = out["execution"]
    mfile = tmp_path / "markers"
    # The tool and the local step ran once; only the orphaned blocking tool ran twice.
    assert count(mfile, "a") == 1 and count(mfile, "b") == 1 and count(mfile, "c-start") == 2
    steps = {s.target: s for s in out["steps"]}
    assert done.output["a"] == "a:7" and done.output["c"] == "released"
    assert done.output["b"] == steps["pick_b"].result  # the replayed random value, not a new one
    types = [e.type for e in out["events"]]
    assert "dispatch.lease_expired" in types
    retry = [e for e in out["events"] if e.type == "step.executing" and e.payload.get("retry")]
    assert [e.payload["target"] for e in retry] == ["block_until_killed"]


async def test_kill_with_a_pending_outcome_reruns_exactly_that_step(kernel_proc: KernelProcess,
                                                                   tmp_path: Path) -> None:
    out = await crash_and_redeliver(kernel_proc, "pending_outcome", "pender", tmp_path, {"n": 3},
                                    wait_marker="killing", env={"KILL_AFTER": "safe_c"})
    mfile = tmp_path / "markers"
    # What the kernel acknowledged before the kill was all there: safe_a's
    # outcome (carried by once_b's submit) and once_b's; safe_c's outcome died
    # with the process, its step still executing.
    assert [(s.target, s.status) for s in out["killed"]] == [
        ("safe_a", "succeeded"), ("once_b", "succeeded"), ("safe_c", "executing")]
    # On replay exactly the step whose outcome was lost ran again.
    assert [count(mfile, t) for t in ("safe_a", "once_b", "safe_c", "safe_d")] == [1, 1, 2, 1]
    assert out["execution"].output == {"a": "safe_a:3", "b": "once_b:3", "c": "safe_c:3", "d": "safe_d:3"}
    retry = [e for e in out["events"] if e.type == "step.executing" and e.payload.get("retry")]
    assert [e.payload["target"] for e in retry] == ["safe_c"]
    assert [(s.target, s.status) for s in out["steps"]] == [
        ("safe_a", "succeeded"), ("once_b", "succeeded"), ("safe_c", "succeeded"), ("safe_d", "succeeded")]
    # safe_d's outcome travelled with the execution's complete: one transaction.
    assert [e.type for e in out["events"]][-2:] == ["step.succeeded", "execution.completed"]


async def test_kill_right_after_an_at_most_once_step_never_runs_it_again(kernel_proc: KernelProcess,
                                                                       tmp_path: Path) -> None:
    out = await crash_and_redeliver(kernel_proc, "pending_outcome", "once-pender", tmp_path, {"n": 4},
                                    wait_marker="killing", env={"KILL_AFTER": "once_b"})
    mfile = tmp_path / "markers"
    # once_b reported before it returned: its outcome survived the kill and
    # replays; nothing ran twice.
    assert [(s.target, s.status) for s in out["killed"]] == [("safe_a", "succeeded"), ("once_b", "succeeded")]
    assert [count(mfile, t) for t in ("safe_a", "once_b", "safe_c", "safe_d")] == [1, 1, 1, 1]
    assert out["execution"].output == {"a": "safe_a:4", "b": "once_b:4", "c": "safe_c:4", "d": "safe_d:4"}
    assert not [e for e in out["events"] if e.type == "step.executing" and e.payload.get("retry")]


async def test_kill_and_replay_openai_calls(kernel_proc: KernelProcess, tmp_path: Path,
                                            llm: tuple[ScriptedLLM, str]) -> None:
    server, url = llm
    out = await crash_and_redeliver(kernel_proc, "llm_crash", "llm-crasher", tmp_path, {"prompt": "hello"},
                                    wait_marker="c-start", env={"LLM_URL": url})
    assert len(server.requests) == 2  # one plain and one streamed call, never asked again
    assert server.requests[1]["stream"] is True
    done = out["execution"]
    assert done.output == {"plain": "echo: hello", "streamed": "echo: hello!", "c": "released"}
    llm_steps = [s for s in out["steps"] if s.kind == "llm_call"]
    assert [(s.target, s.status) for s in llm_steps] == [("scripted-1", "succeeded"), ("scripted-1", "succeeded")]
    assert llm_steps[1].result["headers"]["content-type"].startswith("text/event-stream")
    assert "data: [DONE]" in llm_steps[1].result["body"]
    # The args are the request body as sent, the streaming flag included.
    assert "stream" not in llm_steps[0].args and llm_steps[1].args["stream"] is True


@pytest.mark.parametrize("stream", ["0", "1"], ids=["plain", "streamed"])
async def test_kill_and_replay_langchain_agent(kernel_proc: KernelProcess, tmp_path: Path,
                                               llm: tuple[ScriptedLLM, str], stream: str) -> None:
    server, url = llm
    out = await crash_and_redeliver(kernel_proc, "langchain_crash", "lc-crasher", tmp_path,
                                    {"task": "What is the weather in Paris?"}, wait_marker="c-start",
                                    env={"LLM_URL": url, "STREAM": stream})
    assert len(server.requests) == 2  # tool call + final answer, each asked once
    assert all(bool(r.get("stream")) == (stream == "1") for r in server.requests)
    assert count(tmp_path / "markers", "weather") == 1
    assert out["execution"].output == {"answer": "Final: sunny in Paris", "c": "released"}
    kinds = [(s.kind, s.target) for s in out["steps"]]
    assert kinds == [("llm_call", "scripted-lc"), ("tool_call", "lookup_weather"), ("llm_call", "scripted-lc"),
                     ("tool_call", "block_until_killed")]
