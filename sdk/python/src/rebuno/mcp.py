"""MCP tools as governed tool steps (needs the `mcp` extra).

    from mcp import ClientSession, StdioServerParameters, stdio_client
    from rebuno.mcp import wrap_mcp_tools

    async with stdio_client(StdioServerParameters(command="my-server")) as (r, w):
        async with ClientSession(r, w) as session:
            await session.initialize()
            tools = await wrap_mcp_tools(session)           # every tool the server lists
            graph = create_agent(model=model, tools=tools)

Each wrapped tool is an async function named after the tool, with keyword
parameters from its input schema and its description as docstring, so
frameworks see an ordinary tool. A call is a `tool_call` step whose target is
the tool id and whose args are the call's arguments: the first run calls the
server, replays return the recorded value. A result the server flags
`is_error` fails the step (`ToolError`). Denials return a string, as with
`@tool`.
"""

from __future__ import annotations

import inspect
import json
import keyword
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from ._effects import run_effect, validate_idempotency, validate_resources
from .errors import PolicyError
from .tool import Idempotency, denial_message

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

__all__ = ["wrap_mcp_tool", "wrap_mcp_tools", "McpToolError", "mcp_result_value"]

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict, "null": type(None)}


class McpToolError(Exception):
    """The MCP server answered a call with `is_error`."""


def _field(obj: Any, snake: str, camel: str) -> Any:
    value = getattr(obj, snake, None)
    return getattr(obj, camel, None) if value is None else value


def mcp_result_value(result: CallToolResult) -> Any:
    """The value a wrapped tool returns: the structured content when the server
    sent one, else the text of its content (several blocks joined by blank
    lines), else the content blocks as JSON."""
    if _field(result, "is_error", "isError"):
        raise McpToolError(_content_text(result) or "MCP tool call failed")
    structured = _field(result, "structured_content", "structuredContent")
    if structured is not None:
        return structured
    text = _content_text(result)
    if text is not None:
        return text
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]


def _content_text(result: CallToolResult) -> str | None:
    texts = [getattr(b, "text", None) for b in result.content]
    if not texts or any(not isinstance(t, str) for t in texts):
        return None
    return "\n\n".join(str(t) for t in texts)


def _annotation(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return Any
    t = schema.get("type")
    if isinstance(t, str):
        return _JSON_TYPES.get(t, Any)
    return Any


def _signature(tool: Tool) -> tuple[inspect.Signature, dict[str, Any]]:
    schema = _field(tool, "input_schema", "inputSchema") or {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    params: list[inspect.Parameter] = []
    annotations: dict[str, Any] = {}
    if isinstance(props, dict):
        ordered = sorted(props.items(), key=lambda kv: kv[0] not in required)  # required first, stable
        for name, prop in ordered:
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                continue
            ann = _annotation(prop)
            default: Any = inspect.Parameter.empty
            if name not in required:
                default = prop.get("default") if isinstance(prop, dict) else None
                ann = ann | None if ann is not Any else Any
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann))
            annotations[name] = ann
    annotations["return"] = Any
    return inspect.Signature(params, return_annotation=Any), annotations


def wrap_mcp_tool(session: ClientSession, tool: Tool, *, id: str | None = None,
                  idempotency: Idempotency = "safe_to_retry",
                  resources: Sequence[str] | None = None) -> Callable[..., Awaitable[Any]]:
    """Wrap one tool of an initialised MCP `ClientSession` as a governed tool."""
    validate_idempotency(idempotency)
    keys = validate_resources(resources)
    tool_id = id or tool.name
    sig, annotations = _signature(tool)

    async def call(**kwargs: Any) -> Any:
        arguments = {k: v for k, v in kwargs.items() if v is not None or k not in sig.parameters
                     or sig.parameters[k].default is inspect.Parameter.empty}

        async def body() -> Any:
            result = await session.call_tool(tool.name, arguments)
            return mcp_result_value(result)

        try:
            return await run_effect("tool_call", tool_id, arguments, body, idempotency=idempotency,
                                    resources=keys, what=f"MCP tool {tool_id!r}")
        except PolicyError as err:
            return denial_message(tool_id, err)

    call.__name__ = tool_id
    call.__qualname__ = tool_id
    call.__doc__ = tool.description or f"MCP tool {tool.name}."
    call.__signature__ = sig  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    call.__rebuno_tool__ = {  # type: ignore[attr-defined]
        "id": tool_id, "idempotency": idempotency, "resources": keys, "mcp_tool": tool.name,
        "input_schema": json.loads(json.dumps(_field(tool, "input_schema", "inputSchema") or {}))}
    return call


async def wrap_mcp_tools(session: ClientSession, *, names: Sequence[str] | None = None, prefix: str = "",
                         idempotency: Idempotency = "safe_to_retry",
                         resources: Sequence[str] | None = None) -> list[Callable[..., Awaitable[Any]]]:
    """Wrap every tool the session lists (or those in `names`, in that order).

    `prefix` is prepended to each tool id (e.g. `"github."`), which keeps ids
    unique when several servers are wrapped.
    """
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        if cursor is None:
            listing = await session.list_tools()
        else:
            from mcp.types import PaginatedRequestParams

            listing = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(listing.tools)
        cursor = _field(listing, "next_cursor", "nextCursor")
        if not cursor:
            break
    if names is not None:
        by_name = {t.name: t for t in tools}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(f"the MCP server has no tool named {', '.join(missing)}")
        tools = [by_name[n] for n in names]
    return [wrap_mcp_tool(session, t, id=prefix + t.name, idempotency=idempotency, resources=resources)
            for t in tools]
