"""A small MCP server over stdio for the end-to-end tests. Each tool call
appends the tool's name to the file named by `MARKERS`, so tests can count
real calls (a replay must not reach the server)."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("rebuno-test-tools")


def mark(name: str) -> None:
    with open(os.environ["MARKERS"], "a") as f:
        f.write(name + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    mark("add")
    return a + b


@server.tool(structured_output=False)
def shout(text: str, times: int = 1) -> str:
    """Upper-case a text."""
    mark("shout")
    return (text.upper() + " ") * times


@server.tool()
def explode(reason: str) -> str:
    """Always fails."""
    mark("explode")
    raise ValueError(f"exploded: {reason}")


if __name__ == "__main__":
    server.run("stdio")
