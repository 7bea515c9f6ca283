"""(b) An LLM call through the published client's http_client() transport, with
the official openai AsyncOpenAI client against the scripted server, plain and
streamed: each is one llm_call step whose target is the model (docs/protocol/steps.md §1), recorded
with the provider's answer, and the handler gets the right text."""

from __future__ import annotations

import json

from kernel_harness import parse_with_models, step_id

AGENT = "llm-agent"
MODEL = "scripted-model-1"
PLAIN = "Plain answer from the script."
STREAMED = "Streamed answer, in several small chunks."


def _sse_text(body: str) -> str:
    out = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[len("data: ") :])["choices"]:
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


def test_llm_plain_and_streamed(kernel, spawn_agent, records, llm):
    llm.script(PLAIN, STREAMED)
    spawn_agent("llm_agent.py", AGENT, env={"COMPAT_LLM_URL": llm.url})
    eid = kernel.create_execution(AGENT, {"question": "what is durable execution?"})["id"]

    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    assert ex["status"] == "completed", ex
    assert ex["output"]["plain"] == PLAIN
    assert ex["output"]["streamed"] == STREAMED
    # The scripted server sends 4 characters per chunk: the answer really
    # arrived as a stream through the client's tee.
    assert ex["output"]["chunks"] == -(-len(STREAMED) // 4)

    # The provider saw exactly two requests, the second one streamed.
    assert llm.count == 2
    assert llm.requests[0].get("stream") in (None, False)
    assert llm.requests[1]["stream"] is True

    steps = kernel.steps(eid)
    assert [(s["kind"], s["target"], s["status"], s["idempotency"]) for s in steps] == [
        ("llm_call", MODEL, "succeeded", "safe_to_retry"),
        ("llm_call", MODEL, "succeeded", "safe_to_retry"),
    ]
    for s, sent in zip(steps, llm.requests, strict=True):
        # The recorded args are the request body the provider received.
        assert s["args"] == sent
        assert s["args"]["model"] == MODEL
        assert s["step_id"] == step_id(eid, "llm_call", MODEL, sent)
        assert s["resources"] == []

    plain, streamed = steps[0]["result"], steps[1]["result"]
    assert plain["status"] == 200
    assert plain["headers"]["content-type"].startswith("application/json")
    assert json.loads(plain["body"])["choices"][0]["message"]["content"] == PLAIN
    assert streamed["status"] == 200
    assert streamed["headers"]["content-type"].startswith("text/event-stream")
    assert streamed["body"].rstrip().endswith("data: [DONE]")
    assert _sse_text(streamed["body"]) == STREAMED

    types = kernel.event_types(eid)
    assert types.count("step.succeeded") == 2
    assert types[-1] == "execution.completed"

    # The streamed call posted live deltas on the side channel (docs/protocol/events.md §5), which the
    # kernel accepted with 204.
    accepted = kernel.metric(
        "rebuno_http_requests_total",
        where=lambda lb: lb.get("route", "").endswith("/steps/{step_id}/stream") and lb.get("status") == "204",
    )
    refused = kernel.metric(
        "rebuno_http_requests_total",
        where=lambda lb: lb.get("route", "").endswith("/steps/{step_id}/stream") and lb.get("status") != "204",
    )
    assert accepted >= 1 and refused == 0

    assert records.count("llm:plain:returned") == 1
    assert records.count("llm:stream:returned") == 1
    parse_with_models(kernel, eid)
