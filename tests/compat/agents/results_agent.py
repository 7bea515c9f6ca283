"""(f) How a handler ends: Result(output, state), previous() of a continuation,
an exception escaping the handler, a failing tool body."""

from __future__ import annotations

from rebuno import Result, ToolError, previous, tool

from agentkit import make_agent, record, serve


class WidgetError(Exception):
    pass


@tool
async def flaky(path: str) -> str:
    record("tool:flaky")
    raise OSError(f"disk full at {path}")


async def handler(mode: str, payload: dict | None = None) -> object:
    if mode == "result":
        return Result(output={"answer": 42, "payload": payload}, state={"memo": "remember me", "turn": 1})
    if mode == "continue":
        return {"previous": await previous()}
    if mode == "raise":
        raise WidgetError("the widget broke")
    if mode == "tool":
        return await flaky("/var/data")
    if mode == "tool-caught":
        try:
            await flaky("/var/data")
        except ToolError as e:
            return {"caught": str(e)}
    return {"unknown mode": mode}


if __name__ == "__main__":
    serve(make_agent(), handler)
