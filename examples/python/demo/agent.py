"""The agent of `make demo`: a small coding agent that edits files in a workspace.

The workspace is a *resource*: a directory made by the SDK's `LocalDirectory`
driver. `resource()` creates it on the first dispatch (and takes a baseline
checkpoint), opens the same directory again on every later dispatch, and in a
fork restores it from the checkpoint the kernel names. `write_file` declares
that it changes the workspace, so with `CheckpointPolicy(every_steps=1)` each
write is followed by a checkpoint; `read_file` and `read_files` do not declare
it. The handler:

    1. write_file app.py = print("hello")          → checkpoint
    2. read_file  app.py                            (a live step: coverage ends)
    3. write_file VERSION = 1.0.0                   → held for approval by policy.yaml
    4. write_file app.py = print("hello, world")    → checkpoint
    5. read_files                                   → the completion checkpoint follows

and returns what the workspace holds. If the release is denied it skips step 4.

    export REBUNO_AGENT_SECRET=dev-secret-0123456789
    export REBUNO_LOCAL_RESOURCES=/tmp/rebuno-workspaces
    python examples/python/demo/agent.py --listen 127.0.0.1:5000
    rebuno agent add --id coder --webhook-url http://127.0.0.1:5000/webhook \\
        --policy-file examples/python/demo/policy.yaml
    rebuno exec create coder '{"release": "1.0.0"}' --watch

The demo (examples/demo) starts it with `--kernel`, `--listen`, `--id` and
`--secret`, and reads the lines it logs ("<execution> <what happened>") to
tell which steps ran and which replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any, Awaitable, TypeVar

from rebuno import Agent, Blocked, CheckpointPolicy, execution, resource, tool
from rebuno.drivers import LocalDirectory

T = TypeVar("T")
log = logging.getLogger("demo-agent")
DELAY = 0.4  # seconds each write pretends to work (--step-delay)

HELLO = 'print("hello")\n'
HELLO_WORLD = 'print("hello, world")\n'

# One driver for the whole process; its root is $REBUNO_LOCAL_RESOURCES.
DRIVER = LocalDirectory()

# Only for the demo's narration: every body counts its runs here, so that the
# handler can tell a step that ran from one that replayed.
_runs = [0]


async def workspace() -> Any:
    """The workspace's handle: the first call in a dispatch registers, creates
    or opens it; later calls return the same handle."""
    return await resource("workspace", driver=DRIVER, checkpoints=CheckpointPolicy(every_steps=1))


@tool("write_file", resources=["workspace"])
async def write_file(path: str, content: str) -> str:
    """Write a file in the workspace."""
    _runs[0] += 1
    ws = await workspace()
    await asyncio.sleep(DELAY)
    await ws.files.write(path, content)
    return f"wrote {path}"


@tool("read_file")
async def read_file(path: str) -> str:
    """Read a file of the workspace."""
    _runs[0] += 1
    ws = await workspace()
    await asyncio.sleep(DELAY / 4)
    text: str = await ws.files.read(path)
    return text


@tool("read_files")
async def read_files() -> dict[str, str]:
    """Every file of the workspace with its contents."""
    _runs[0] += 1
    ws = await workspace()
    return {name: await ws.files.read(name) for name in await ws.files.list("/")}


def say(what: str, *args: Any) -> None:
    log.info("%s " + what, execution().execution_id[-8:], *args)


async def narrate(target: str, args: dict[str, Any], call: Awaitable[T]) -> T:
    """Awaits one step and logs whether its body ran, its result replayed, or
    the policy held or denied it."""
    before = _runs[0]
    shown = json.dumps(args)
    try:
        result = await call
    except Blocked:
        say("  blocked %s %s: waiting for approval", target, shown)
        raise
    if isinstance(result, str) and result.startswith(f"Tool '{target}' was denied"):
        how = "denied "
    else:
        how = "run    " if _runs[0] > before else "replay "
    say("  %s %s %s", how, target, shown)
    return result


async def edit(release: str = "1.0.0") -> dict[str, Any]:
    """Write a program, publish a release (with approval), then improve the program."""
    ctx = execution()
    say("attempt %s of dispatch %s", ctx.dispatch_attempt, ctx.dispatch_id[-8:])
    ws = await workspace()
    say("  workspace %s", ws.path)

    await narrate("write_file", {"path": "app.py"}, write_file("app.py", HELLO))
    await narrate("read_file", {"path": "app.py"}, read_file("app.py"))
    answer = await narrate("write_file", {"path": "VERSION"}, write_file("VERSION", release + "\n"))
    released = answer == "wrote VERSION"
    if released:
        await narrate("write_file", {"path": "app.py"}, write_file("app.py", HELLO_WORLD))
    files = await narrate("read_files", {}, read_files())
    return {"released": released, "files": files}


def main() -> None:
    global DELAY
    ap = argparse.ArgumentParser(description="The Rebuno demo agent (Python SDK, a workspace resource).")
    ap.add_argument("--kernel", default=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"), help="kernel URL")
    ap.add_argument("--listen", default="127.0.0.1:5000", help="host:port to serve the webhook on")
    ap.add_argument("--id", default="coder", help="agent id")
    ap.add_argument("--secret", default=os.environ.get("REBUNO_AGENT_SECRET"), help="agent secret")
    ap.add_argument("--step-delay", type=float, default=DELAY, help="seconds each write pretends to work")
    args = ap.parse_args()
    DELAY = args.step_delay
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    host, _, port = args.listen.rpartition(":")
    agent = Agent(args.id, secret=args.secret, base_url=args.kernel)
    log.info("agent %s listening on http://%s/webhook, workspaces under %s", args.id, args.listen, DRIVER.root)
    agent.run(edit, host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
