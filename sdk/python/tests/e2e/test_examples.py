"""The examples in examples/python, run against the real kernel."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

from rebuno import Agent

from .harness import REPO_ROOT, KernelProcess, eventually, register, serve_agent
from .scripted_llm import ScriptedLLM

EXAMPLES = REPO_ROOT / "examples" / "python"
SECRET = "examples-secret-0123456789"


def load(name: str) -> ModuleType:
    path = EXAMPLES / name / "agent.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run_example(kernel: KernelProcess, name: str, agent_id: str, input: Any,
                      policy: str | None = None) -> Any:
    agent = Agent(agent_id, secret=SECRET, base_url=kernel.url)
    agent.bind(load(name).process)
    async with serve_agent(agent) as served, kernel.client() as client:
        await register(kernel, agent_id, served.url + "/webhook", SECRET)
        if policy is not None:
            await client.set_policy(agent_id, policy)
        ex = await client.create(agent_id, input)
        return await client.wait(ex.id, timeout=30)


async def test_hello(kernel_proc: KernelProcess) -> None:
    done = await run_example(kernel_proc, "hello", "hello", {"name": "Ada"})
    assert done.status == "completed"
    assert done.output["greeting"] == "Hello, Ada!" and 1 <= done.output["lucky"] <= 100
    assert done.output["execution"] == done.id


async def test_langchain_tools(kernel_proc: KernelProcess, llm: tuple[ScriptedLLM, str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    server, url = llm
    server.tool_args["get_forecast"] = {"city": "Paris"}
    monkeypatch.setenv("LLM_MODEL", "scripted-weather")
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    done = await run_example(kernel_proc, "langchain_tools", "weather", {"task": "Umbrella in Paris?"})
    assert done.status == "completed", done
    assert done.output == {"answer": "Final: light rain, 14°C"}
    tools = [t["function"]["name"] for t in server.requests[0]["tools"]]
    assert tools == ["get_forecast", "convert_temperature"]
    assert server.requests[0]["tools"][0]["function"]["description"] == "Get today's weather forecast for a city."


async def test_approval_shell(kernel_proc: KernelProcess) -> None:
    policy = (EXAMPLES / "approval_shell" / "policy.yaml").read_text()
    done = await run_example(kernel_proc, "approval_shell", "shell", {"command": "echo hello"}, policy)
    assert done.output == {"output": "exit 0: hello"}
    done = await run_example(kernel_proc, "approval_shell", "shell", {"command": "ls; rm -r x"}, policy)
    assert "rm is never allowed" in done.output["output"]

    agent = Agent("shell", secret=SECRET, base_url=kernel_proc.url)
    agent.bind(load("approval_shell").process)
    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "shell", served.url + "/webhook", SECRET)
        ex = await client.create("shell", {"command": "printf 'approved run'"})
        approvals = await eventually(lambda: client.approvals(execution_id=ex.id), what="approval")
        assert (await client.get(ex.id)).status == "blocked"
        await client.grant(approvals[0].id, decided_by="oncall")
        done = await client.wait(ex.id, timeout=30)
        assert done.output == {"output": "exit 0: approved run"}


def test_examples_are_listed() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    for name in ("hello", "langchain_tools", "approval_shell"):
        assert (EXAMPLES / name / "agent.py").is_file() and f"[{name}]" in readme
