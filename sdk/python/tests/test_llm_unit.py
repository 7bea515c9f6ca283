"""The LLM transport: recording, replay, streaming tee and synthetic refusals
(docs/protocol/sdk.md §3), through the official `openai` client over a mock provider."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from rebuno import (Blocked, PolicyError, RateLimited, Terminated, execution, http_client, raise_for_refusal)
from rebuno.http_client import DELTA_MAX_BYTES, _split_utf8, llm_step_args

from .fakes import FakeKernel, error_response
from .test_effects_unit import in_handler


class Provider:
    """A mock OpenAI-compatible provider that counts its requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        text = "reply %d" % len(self.requests)
        if body.get("stream"):
            chunks = [{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": part},
                                    "finish_reason": None}]} for part in (text[:3], text[3:])]
            chunks.append({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse.encode())
        return httpx2.Response(200, json={
            "id": "c1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        })


def make_openai(provider: Provider) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="test-key", base_url="http://provider.test/v1", max_retries=2,
                              http_client=http_client(transport=provider.transport()))


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_plain_call_is_recorded_and_replayed(kernel: FakeKernel) -> None:
    provider = Provider()

    async def call() -> str:
        resp = await make_openai(provider).chat.completions.create(model="gpt-test", messages=MESSAGES)  # type: ignore[arg-type]
        return str(resp.choices[0].message.content)

    eid = kernel.add_execution()
    assert await in_handler(kernel, call, eid) == ("ok", "reply 1")
    (sub,) = kernel.submits()
    body = sub.json()
    assert body["kind"] == "llm_call" and body["target"] == "gpt-test" and body["resources"] == []
    assert body["args"]["messages"] == MESSAGES and "stream" not in body["args"]
    (st,) = kernel.steps.values()
    assert st.status == "succeeded" and st.result["status"] == 200
    assert json.loads(st.result["body"])["choices"][0]["message"]["content"] == "reply 1"
    # Replay: the provider is not asked again, the answer is identical.
    assert await in_handler(kernel, call, eid) == ("ok", "reply 1")
    assert len(provider.requests) == 1


async def test_streamed_call_is_teed_recorded_and_replayed(kernel: FakeKernel) -> None:
    provider = Provider()

    async def call() -> str:
        stream = await make_openai(provider).chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        parts = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    eid = kernel.add_execution()
    assert await in_handler(kernel, call, eid) == ("ok", "reply 1")
    (st,) = kernel.steps.values()
    assert st.status == "succeeded" and st.result["status"] == 200
    assert st.result["headers"]["content-type"] == "text/event-stream"
    assert st.result["body"].endswith("data: [DONE]\n\n")
    deltas = [r.json() for r in kernel.requests if r.path.endswith("/stream")]
    assert deltas and "".join(d["data"] for d in deltas) == st.result["body"]
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    # The args are the body as sent, streaming flag included (the published client's identity).
    assert kernel.submits()[0].json()["args"]["stream"] is True
    assert await in_handler(kernel, call, eid) == ("ok", "reply 1")
    assert len(provider.requests) == 1


async def test_early_close_still_records_the_whole_stream(kernel: FakeKernel) -> None:
    provider = Provider()

    async def call() -> str:
        stream = await make_openai(provider).chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        async for chunk in stream:
            break
        await stream.close()
        return "closed"

    assert await in_handler(kernel, call) == ("ok", "closed")
    (st,) = kernel.steps.values()
    assert st.status == "succeeded" and st.result["body"].endswith("data: [DONE]\n\n")


@pytest.mark.parametrize("answer,status,code", [
    ({"decision": "denied", "step_id": "auto", "reason": "no_llm", "rule_id": "r9"}, 403, "denied"),
    ({"decision": "rate_limited", "reason": "rate_limit_exceeded", "retry_after_ms": 1500}, 429, "rate_limited"),
    ({"decision": "blocked", "step_id": "auto", "approval_id": "ap"}, 403, "blocked"),
    ({"decision": "execution_blocked"}, 403, "blocked"),
    ({"decision": "execution_terminal"}, 403, "execution_terminal"),
    ("superseded", 403, "lease_superseded"),
])
async def test_synthetic_refusals(kernel: FakeKernel, answer: Any, status: int, code: str) -> None:
    kernel.on_submit = lambda k, r: error_response(409, "lease_superseded") if answer == "superseded" else answer
    provider = Provider()

    async def raw() -> httpx2.Response:
        async with http_client(transport=provider.transport()) as c:
            return await c.post("http://provider.test/v1/chat/completions",
                                json={"model": "m", "messages": MESSAGES})

    kind, resp = await in_handler(kernel, raw)
    assert kind == "ok" and provider.requests == []
    assert resp.status_code == status
    assert resp.headers["x-should-retry"] == "false" and resp.headers["rebuno-refusal"] == code
    err = resp.json()["error"]
    assert err["type"] == "rebuno_refusal" and err["code"] == code
    assert err["message"].startswith(f"rebuno_refusal: {code}")
    if code == "denied":
        assert err["message"] == "rebuno_refusal: denied reason=no_llm" and err["rule_id"] == "r9"
    if code == "rate_limited":
        assert err["retry_after_ms"] == 1500


@pytest.mark.parametrize("answer,expected", [
    ({"decision": "denied", "step_id": "auto", "reason": "no_llm", "rule_id": "r9"}, PolicyError),
    ({"decision": "rate_limited", "reason": "rate_limit_exceeded", "retry_after_ms": 1500}, RateLimited),
    ({"decision": "blocked", "step_id": "auto", "approval_id": "ap"}, Blocked),
    ({"decision": "execution_terminal"}, Terminated),
])
async def test_openai_errors_unwrap_to_refusals(kernel: FakeKernel, answer: Any, expected: type) -> None:
    kernel.on_submit = lambda k, r: answer
    provider = Provider()
    caught: list[BaseException] = []
    ctxs: list[Any] = []

    async def call() -> None:
        ctxs.append(execution())
        try:
            await make_openai(provider).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        except openai.APIStatusError as e:
            caught.append(e)
            raise_for_refusal(e)
            raise

    kind, err = await in_handler(kernel, call)
    assert kind == "raised" and isinstance(err, expected), err
    assert isinstance(caught[0], openai.APIStatusError)
    assert len(kernel.submits()) == 1 and provider.requests == []  # the provider client did not retry
    if expected is PolicyError:
        assert err.reason == "no_llm" and err.rule_id == "r9"
    if expected is RateLimited:
        assert err.retry_after_ms == 1500
    if expected in (Blocked, Terminated):
        assert err is ctxs[0].signal  # the sticky signal itself


async def test_agent_reports_a_wrapped_denial_as_policy_denied(kernel: FakeKernel) -> None:
    kernel.on_submit = lambda k, r: {"decision": "denied", "step_id": "auto", "reason": "budget"}
    from .fakes import deliver, make_agent, uuid7

    agent = make_agent(kernel)
    provider = Provider()

    @agent.bind
    async def process() -> None:
        await make_openai(provider).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert kernel.finished(eid) == ("failed", "policy_denied: budget")


async def test_provider_failure_is_recorded_as_step_failure(kernel: FakeKernel) -> None:
    def down(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("provider unreachable")

    async def call() -> None:
        async with http_client(transport=httpx2.MockTransport(down)) as c:
            await c.post("http://provider.test/v1/chat/completions", json={"model": "m", "messages": []})

    kind, err = await in_handler(kernel, call)
    assert isinstance(err, httpx2.ConnectError)
    (st,) = kernel.steps.values()
    assert st.status == "failed" and st.error == {"message": "provider unreachable", "type": "ConnectError"}


def test_step_args_choice() -> None:
    req = httpx2.Request("POST", "http://x/v1/chat/completions")
    target, args = llm_step_args(req, b'{"model":"gpt","stream":true,"stream_options":{"a":1},"temperature":0.0}')
    assert target == "gpt" and set(args) == {"model", "stream", "stream_options", "temperature"}
    assert str(args["temperature"]) == "0.0"  # number literals are kept as written
    target, args = llm_step_args(req, b"not json")
    assert target == "" and args["body"] == "not json" and args["path"] == "/v1/chat/completions"


def test_delta_split_counts_bytes() -> None:
    text = "é" * 5000  # 10,000 bytes
    parts = _split_utf8(text)
    assert "".join(parts) == text
    assert all(len(p.encode()) <= DELTA_MAX_BYTES for p in parts) and len(parts) == 2


def test_raise_for_refusal_finds_markers_anywhere() -> None:
    raise_for_refusal(ValueError("unrelated"))  # returns normally
    with pytest.raises(PolicyError) as e:
        raise_for_refusal(RuntimeError("Error code: 403 - {'error': {'message': 'rebuno_refusal: denied "
                                       "reason=too risky', 'code': 'denied'}}"))
    assert e.value.reason == "too risky"
    outer = RuntimeError("wrapper")
    outer.__cause__ = ValueError("rebuno_refusal: rate_limited reason=rate_limit_exceeded")
    with pytest.raises(RateLimited):
        raise_for_refusal(outer)
    with pytest.raises(Terminated):
        raise_for_refusal(ExceptionGroup("g", [ValueError("x"), KeyError("rebuno_refusal: execution_terminal")]))

