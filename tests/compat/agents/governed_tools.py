"""Governance (f): tools under a policy. ``transfer`` is held for approval by the
test's bundle, ``wipe`` is denied by it, ``lookup`` is allowed. The handler records
what each decorated tool returned to it, so the test can see a denial arrive as
the client's refusal string."""

from __future__ import annotations

from rebuno import tool

from agentkit import make_agent, record, serve


@tool
async def lookup(account: str) -> dict:
    record("tool:lookup", account=account)
    return {"account": account, "balance": 120}


@tool("transfer", idempotency="at_most_once")
async def transfer(account: str, amount: int) -> dict:
    record("tool:transfer", account=account, amount=amount)
    return {"transferred": amount, "to": account}


@tool
async def wipe(account: str) -> str:
    record("tool:wipe", account=account)
    return "wiped"


async def handler(account: str, amount: int = 0, wipe_too: bool = False) -> dict:
    info = await lookup(account)
    out: dict = {"balance": info["balance"]}
    if wipe_too:
        out["wipe"] = await wipe(account)
        record("handler:wipe_returned", value=out["wipe"])
    if amount:
        out["transfer"] = await transfer(account, amount)
        record("handler:transfer_returned", value=out["transfer"])
    return out


if __name__ == "__main__":
    serve(make_agent(), handler)
