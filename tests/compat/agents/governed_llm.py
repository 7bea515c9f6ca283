"""Governance (f): LLM calls through the client's http_client() transport under a
policy that denies one model and meters another. A refused call reaches the
caller as the provider client's HTTP error (the transport never raises for a
kernel decision); with ``catch`` the handler records what it caught and what
``raise_for_refusal`` turns it back into, without it the error escapes the
handler and the client fails the execution."""

from __future__ import annotations

import os
from typing import Any

import openai
import rebuno
from openai import AsyncOpenAI

from agentkit import make_agent, record, serve

ALLOWED = "scripted-model-1"
FORBIDDEN = "forbidden-model"
METERED = "metered-model"


def _refusal(e: openai.APIStatusError) -> dict[str, Any]:
    info: dict[str, Any] = {"error": type(e).__name__, "status": e.status_code, "body": e.body}
    try:
        rebuno.raise_for_refusal(e)
    except rebuno.PolicyError as p:
        info["as"] = "PolicyError"
        info["reason"] = Exception.__str__(p)
    except rebuno.RateLimited as r:
        info["as"] = "RateLimited"
        info["reason"] = r.reason
    return info


async def _ask(llm: AsyncOpenAI, model: str, question: str) -> str:
    reply = await llm.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
    return reply.choices[0].message.content or ""


async def handler(question: str, catch: bool = True) -> dict:
    out: dict[str, Any] = {}
    async with rebuno.http_client() as http:
        llm = AsyncOpenAI(base_url=os.environ["COMPAT_LLM_URL"], api_key="sk-compat", http_client=http, max_retries=0)
        try:
            out["forbidden"] = await _ask(llm, FORBIDDEN, question)
        except openai.APIStatusError as e:
            if not catch:
                raise
            out["forbidden"] = _refusal(e)
            record("llm:refused", model=FORBIDDEN, **out["forbidden"])
        out["allowed"] = await _ask(llm, ALLOWED, question)
        metered = []
        for i in range(2):
            try:
                metered.append(await _ask(llm, METERED, f"{question} #{i}"))
            except openai.APIStatusError as e:
                metered.append(_refusal(e))
                record("llm:refused", model=METERED, **metered[-1])
        out["metered"] = metered
    return out


if __name__ == "__main__":
    serve(make_agent(), handler)
