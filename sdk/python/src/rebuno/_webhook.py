"""Reading a kernel webhook: a bounded body, then its signature, then its JSON.

The body is read only up to `MAX_WEBHOOK_BODY_BYTES` — a declared
`Content-Length` over it is refused before anything is read, a streamed body
as soon as it crosses it — so an unsigned request cannot make the agent hold
more than that. The signature is checked over the bytes read, and only a
verified body is parsed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ._dispatch import DispatchKey
from .signing import verify_webhook

__all__ = ["MAX_WEBHOOK_BODY_BYTES", "DEFAULT_LEASE_TIMEOUT", "Delivery", "Refused", "receive"]

# A webhook carries four short fields; 64 KiB leaves room for any future ones.
MAX_WEBHOOK_BODY_BYTES = 64 * 1024
DEFAULT_LEASE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Delivery:
    """What a verified webhook asks of the agent."""

    execution_id: str
    key: DispatchKey
    lease_seconds: float


class Refused(Exception):
    """A webhook the agent answers with an error envelope."""

    def __init__(self, status: int, code: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        # Unread body bytes may still be on their way: close rather than drain them.
        self.close = close

    def response(self) -> JSONResponse:
        headers = {"Connection": "close"} if self.close else None
        return JSONResponse({"code": self.code, "message": self.message}, status_code=self.status,
                            headers=headers)


def _too_large() -> Refused:
    return Refused(413, "payload_too_large", f"webhook body over {MAX_WEBHOOK_BODY_BYTES} bytes", close=True)


async def read_body(request: Request, limit: int = MAX_WEBHOOK_BODY_BYTES) -> bytes:
    """The request body, or `Refused` (413) once it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Refused(400, "validation_error", "invalid Content-Length", close=True)
        if int(declared) > limit:
            raise _too_large()
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise _too_large()
        body += chunk
    return bytes(body)


async def receive(request: Request, secret: str) -> Delivery:
    """Read, verify and parse one webhook; raise `Refused` for anything else."""
    body = await read_body(request)
    signatures = request.headers.getlist("rebuno-signature")
    if len(signatures) != 1 or not verify_webhook(secret, body, signatures[0]):
        raise Refused(401, "unauthorized", "unauthorized")
    return parse(body)


def parse(body: bytes) -> Delivery:
    """The delivery a verified webhook body names."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise Refused(400, "validation_error", "body must be a JSON object")
    execution_id, dispatch_id = data.get("execution_id"), data.get("dispatch_id")
    if not _is_uuid(execution_id) or not _is_uuid(dispatch_id):
        raise Refused(400, "validation_error", "execution_id and dispatch_id are required")
    attempt = data.get("dispatch_attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        attempt = None
    lease = data.get("lease_timeout_seconds")
    lease_seconds = float(lease) if isinstance(lease, (int, float)) and not isinstance(lease, bool) \
        and lease > 0 else DEFAULT_LEASE_TIMEOUT
    return Delivery(str(execution_id).lower(), DispatchKey(str(dispatch_id).lower(), attempt), lease_seconds)


def _is_uuid(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        uuid.UUID(v)
    except ValueError:
        return False
    return len(v) == 36
