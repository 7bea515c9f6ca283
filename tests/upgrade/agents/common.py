"""Agent-side plumbing shared by the two agent scripts of the upgrade suite.

Standard library plus ``rebuno.execution`` only, which both SDKs offer with the
same meaning, so the same file serves the published 0.29.2 client and this
project's SDK. The test passes: ``REBUNO_URL`` and ``REBUNO_AGENT_SECRET`` (read
by both SDKs), ``UPGRADE_AGENT_ID``, ``UPGRADE_PORT``, ``UPGRADE_RECORD`` (the
JSON-lines file body runs are appended to), ``UPGRADE_GATES`` (the folder of
gate release files) and ``UPGRADE_LLM_URL`` (the scripted OpenAI-compatible
server).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
from typing import Any

from rebuno import execution

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

AGENT_ID = os.environ["UPGRADE_AGENT_ID"]
PORT = int(os.environ["UPGRADE_PORT"])
LLM_URL = os.environ.get("UPGRADE_LLM_URL", "")
MODEL = "scripted-upgrade"
SDK = importlib.metadata.version("rebuno")
_RECORD = os.environ["UPGRADE_RECORD"]
_GATES = os.environ["UPGRADE_GATES"]


def record(event: str, **fields: Any) -> None:
    """Appends one line (one O_APPEND write, so lines stay whole) naming the
    body that ran, the SDK version and the dispatch attempt it ran in."""
    try:
        attempt = execution().dispatch_attempt
    except RuntimeError:
        attempt = None
    line = {"event": event, "pid": os.getpid(), "sdk": SDK, "attempt": attempt, **fields}
    fd = os.open(_RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


async def gate(name: str) -> None:
    """Records that a body reached gate ``name`` and waits until the test
    creates the release file of that name."""
    record(f"gate:{name}")
    path = os.path.join(_GATES, name)
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
