"""A webhook's body is read up to a fixed limit before its signature is
checked: an unsigned 300 MiB POST to a real agent process is refused with
`413` long before it has been sent, and the agent's memory does not grow
with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path
from typing import Iterable

from rebuno._webhook import MAX_WEBHOOK_BODY_BYTES

from .harness import KernelProcess, agent_process

SECRET = "limits-secret-0123456789"
MiB = 1 << 20
HUGE = 300 * MiB
# How much the agent's peak resident memory may grow while it is sent HUGE bytes.
RSS_GROWTH_MAX = 20 * MiB
PATIENCE = 120.0


def peak_rss(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def zeros(total: int, chunk: int = MiB) -> Iterable[bytes]:
    block = b"0" * chunk
    for start in range(0, total, chunk):
        yield block[: min(chunk, total - start)]


def chunked(parts: Iterable[bytes]) -> Iterable[bytes]:
    """The chunked transfer coding of a body."""
    for part in parts:
        yield b"%x\r\n" % len(part) + part + b"\r\n"
    yield b"0\r\n\r\n"


async def post(port: int, headers: dict[str, str], body: Iterable[bytes]) -> tuple[int, dict[str, str], int]:
    """POST /webhook with the body streamed part by part until the agent
    answers; return the status, the answer's envelope and how many body
    bytes were written by then.

    Plain socket calls, not asyncio streams: an agent that refuses a body
    closes the connection with the rest unread, and the reset that follows
    fails the writes but must not hide the answer already received."""
    loop = asyncio.get_running_loop()
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"127.0.0.1:{port}", **headers}.items())
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setblocking(False)
        await loop.sock_sendall(sock, f"POST /webhook HTTP/1.1\r\n{head}\r\n".encode("ascii"))

        async def send() -> None:
            nonlocal sent
            with contextlib.suppress(ConnectionError):
                for part in body:
                    await loop.sock_sendall(sock, part)
                    sent += len(part)

        async def answer() -> bytes:
            data = b""
            while b"\r\n\r\n" not in data or len(data) < _answer_length(data):
                more = await loop.sock_recv(sock, 65536)
                if not more:
                    raise AssertionError(f"the connection closed without a whole answer: {data!r}")
                data += more
            return data

        sender = asyncio.create_task(send())
        try:
            data = await asyncio.wait_for(answer(), PATIENCE)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    head_text, _, rest = data.partition(b"\r\n\r\n")
    return int(head_text.split()[1]), json.loads(rest), sent


def _answer_length(data: bytes) -> int:
    """The length of an answer whose head has arrived: head plus Content-Length."""
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    raise AssertionError(f"an answer without Content-Length: {head!r}")


async def test_unsigned_huge_bodies_are_refused_unread(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    agent = agent_process("crash", kernel_proc, "limits", SECRET, tmp_path / "markers")
    try:
        url = await agent.webhook()
        port = int(url.split(":")[2].split("/")[0])
        json_type = {"Content-Type": "application/json"}
        # Warm up: an unsigned webhook within the limit is read, then refused as unsigned.
        small = b'{"execution_id":"x"}'
        status, envelope, _ = await post(port, {**json_type, "Content-Length": str(len(small))}, [small])
        assert (status, envelope["code"]) == (401, "unauthorized")
        before = peak_rss(agent.proc.pid)

        # Declared too large: refused from the header, before any of the body is read.
        status, envelope, sent = await post(port, {**json_type, "Content-Length": str(HUGE)}, zeros(HUGE))
        assert (status, envelope["code"]) == (413, "payload_too_large")
        assert sent < HUGE // 2, f"the agent answered only after {sent} of {HUGE} bytes"

        # Streamed without a length: refused once the limit is crossed.
        status, envelope, sent = await post(port, {**json_type, "Transfer-Encoding": "chunked"},
                                            chunked(zeros(HUGE)))
        assert (status, envelope["code"]) == (413, "payload_too_large")
        assert sent < HUGE // 2, f"the agent answered only after {sent} of {HUGE} bytes"

        growth = peak_rss(agent.proc.pid) - before
        print(f"peak RSS before {before / MiB:.1f} MiB, growth {growth / MiB:.1f} MiB")
        assert growth <= RSS_GROWTH_MAX, f"peak RSS grew by {growth / MiB:.1f} MiB"

        # Exactly at the limit is still read and checked; one byte more is not.
        at_limit = b"{" + b" " * (MAX_WEBHOOK_BODY_BYTES - 2) + b"}"
        status, envelope, _ = await post(port, {**json_type, "Transfer-Encoding": "chunked"},
                                         chunked([at_limit]))
        assert (status, envelope["code"]) == (401, "unauthorized")
        status, envelope, _ = await post(port, {**json_type, "Transfer-Encoding": "chunked"},
                                         chunked([at_limit, b" "]))
        assert (status, envelope["code"]) == (413, "payload_too_large")
    finally:
        agent.stop()
