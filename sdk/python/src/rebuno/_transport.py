"""The agent's HTTP/1.1 connections to the kernel.

The kernel client sends one request per step, so its per-request cost is the
SDK's per-step cost. `httpx2` spends about 0.6 ms of CPU on a request here
(URL model, connection-pool bookkeeping, anyio and timeout layers); the pool
below spends about 0.12 ms: `h11` frames each exchange over a plain asyncio
`Protocol`, and idle keep-alive connections are reused newest first.

Failures are classified for the retry rules of docs/protocol/sdk.md §2: `ConnectFailed`
means the request never reached the kernel, so sending it again is always
safe; `TransportFailed` means it may have.

Unit tests swap in any `httpx2` transport (`HttpxTransport`), so that the SDK
runs against an in-memory kernel unchanged.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import h11
import httpx2

__all__ = ["ConnectFailed", "TransportFailed", "Response", "Transport", "ConnectionPool", "HttpxTransport"]

Headers = list[tuple[bytes, bytes]]


class ConnectFailed(Exception):
    """No connection to the kernel: the request was not sent."""


class TransportFailed(Exception):
    """The exchange broke after the request may have reached the kernel."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class Transport(Protocol):
    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> Response: ...

    async def aclose(self) -> None: ...


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self) -> None:
        self._h11 = h11.Connection(h11.CLIENT)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._chunks: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._h11.receive_data(data)
            self._read_events()
        except h11.RemoteProtocolError as e:
            self._broken(TransportFailed(f"bad answer from the kernel: {e}"))

    def eof_received(self) -> bool:
        try:
            self._h11.receive_data(b"")
            self._read_events()
        except h11.RemoteProtocolError as e:
            self._broken(TransportFailed(f"bad answer from the kernel: {e}"))
        self._broken(TransportFailed("the kernel closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(TransportFailed(f"connection lost: {exc or 'closed'}"))

    def _broken(self, error: Exception) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    def _read_events(self) -> None:
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                self._status = event.status_code
                self._headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                self._chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                response = Response(self._status, self._headers, b"".join(self._chunks))
                self._chunks = []
                if self._waiter is not None and not self._waiter.done():
                    self._waiter.set_result(response)
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._broken(TransportFailed("the kernel closed the connection"))
                return

    async def exchange(self, method: str, target: str, headers: Headers, body: bytes) -> Response:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        request = h11.Request(method=method.encode("ascii"), target=target.encode("ascii"), headers=headers)
        self._transport.write(self._h11.send(request) + self._h11.send(h11.Data(data=body))
                              + self._h11.send(h11.EndOfMessage()))
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def reusable(self) -> bool:
        """After a complete exchange: ready for the next one, if both sides keep the connection."""
        if self.closed or self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
            return False
        self._h11.start_next_cycle()
        return True

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class ConnectionPool:
    """Keep-alive connections to the origin of one kernel URL (http or
    https); `send` takes the request target as it goes on the wire."""

    def __init__(self, base_url: str, timeout: float) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the kernel URL must be http:// or https://, not {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._authority = url.netloc.rpartition("@")[2]
        self._host_header = (b"Host", self._authority.encode("idna"))
        self._timeout = timeout
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                _, conn = await loop.create_connection(_Connection, self._host, self._port, ssl=self._ssl)
        except (OSError, TimeoutError) as e:
            raise ConnectFailed(f"cannot connect to the kernel at {self._authority}: {e}") from e
        return conn

    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> Response:
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if conn is None:
            conn = await self._connect()
        all_headers = [self._host_header, (b"Content-Length", b"%d" % len(body))]
        all_headers += headers
        try:
            async with asyncio.timeout(self._timeout):
                response = await conn.exchange(method, target, all_headers, body)
        except BaseException as e:
            conn.close()
            if isinstance(e, TimeoutError):
                raise TransportFailed(f"no answer within {self._timeout} s") from e
            if isinstance(e, h11.LocalProtocolError):
                raise TransportFailed(str(e)) from e
            raise
        if conn.reusable():
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class HttpxTransport:
    """The kernel client over an `httpx2` transport (unit tests' in-memory kernels)."""

    def __init__(self, base_url: str, timeout: float, transport: httpx2.AsyncBaseTransport) -> None:
        url = urlsplit(base_url)
        self._origin = f"{url.scheme}://{url.netloc}"
        self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(timeout), transport=transport, follow_redirects=False)

    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> Response:
        try:
            resp = await self._client.request(method, self._origin + target, content=body, headers=headers)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as e:
            raise ConnectFailed(str(e)) from e
        except httpx2.TransportError as e:
            raise TransportFailed(str(e)) from e
        return Response(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content)

    async def aclose(self) -> None:
        await self._client.aclose()
