"""(b) LLM calls through the client's http_client() transport with the official
openai AsyncOpenAI client, plain and streamed."""

from __future__ import annotations

import os

import rebuno
from openai import AsyncOpenAI

from agentkit import make_agent, record, serve

MODEL = "scripted-model-1"


async def handler(question: str) -> dict:
    async with rebuno.http_client() as http:
        llm = AsyncOpenAI(base_url=os.environ["COMPAT_LLM_URL"], api_key="sk-compat", http_client=http, max_retries=0)
        plain = await llm.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}])
        record("llm:plain:returned")
        parts = []
        stream = await llm.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": question},
                {"role": "assistant", "content": plain.choices[0].message.content},
                {"role": "user", "content": "and streamed?"},
            ],
            stream=True,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        record("llm:stream:returned", chunks=len(parts))
    return {"plain": plain.choices[0].message.content, "streamed": "".join(parts), "chunks": len(parts)}


if __name__ == "__main__":
    serve(make_agent(), handler)
