"""An approval-gated shell tool.

Harmless commands run at once; anything else waits for the on-call engineer
(policy.yaml). While it waits the execution is `blocked`; once granted, the
kernel redelivers and the command runs exactly once (`at_most_once`).

    export REBUNO_AGENT_SECRET=dev-secret-0123456789
    python examples/python/approval_shell/agent.py
    rebuno agent add --id shell --webhook-url http://127.0.0.1:5000/webhook \\
        --policy-file examples/python/approval_shell/policy.yaml
    rebuno exec create shell '{"command": "uname -a"}' --watch      # blocks
    curl -s localhost:8080/v0/approvals                             # find the approval id
    curl -s -XPOST localhost:8080/v0/approvals/<id>/grant -d '{"decided_by":"oncall"}'
"""

from __future__ import annotations

import asyncio

from rebuno import Agent, tool


@tool("run_shell", idempotency="at_most_once")
async def run_shell(command: str) -> str:
    """Run a shell command and return its output."""
    proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return f"exit {proc.returncode}: {out.decode(errors='replace').strip()}"


async def process(command: str) -> dict[str, str]:
    """Run one shell command under the policy."""
    # A denial comes back as a string (the tool catches PolicyError); a pending
    # approval raises Blocked, which ends this dispatch until it is decided.
    return {"output": await run_shell(command)}


if __name__ == "__main__":
    Agent("shell").run(process, port=5000)
