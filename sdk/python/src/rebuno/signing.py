"""HMAC signatures (docs/protocol/auth.md §3).

* Agent → kernel requests carry a request-bound `v1` signature over six lines
  (constant, method, request target, timestamp, dispatch id, dispatch attempt)
  followed by the raw body.
* A submit's `Rebuno-Step-Occurrence` is bound to that request by
  `Rebuno-Occurrence-Signature`: a MAC over the request's own v1 signature
  and the occurrence, so a captured submit cannot be replayed with another
  occurrence (the published client sends neither header).
* Kernel → agent webhooks carry the legacy body-only `sha256=` signature.

Every MAC is HMAC-SHA256 keyed with the agent secret's UTF-8 bytes, written as
64 lowercase hex digits, and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = ["V1_PREFIX", "OCCURRENCE_PREFIX", "v1_message", "sign_v1", "sign_occurrence", "sign_legacy",
           "verify_webhook"]

V1_PREFIX = "rebuno-request-v1"
OCCURRENCE_PREFIX = "rebuno-occurrence-v1"
_LEGACY_RE = re.compile(r"sha256=[0-9a-f]{64}")


def _mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def v1_message(method: str, target: str, timestamp: str, dispatch_id: str | None,
               attempt: str | None, body: bytes) -> bytes:
    """The signed message of a v1 request: six LF-terminated lines, then the body."""
    head = "\n".join([V1_PREFIX, method.upper(), target, timestamp, dispatch_id or "", attempt or ""]) + "\n"
    return head.encode("utf-8") + body


def sign_v1(secret: str, method: str, target: str, timestamp: str, dispatch_id: str | None,
            attempt: str | None, body: bytes) -> str:
    """The `Rebuno-Signature` value of a v1 request (`v1=<hex>`).

    `target` is the request target exactly as sent in the request line: the
    escaped path plus `?query` when there is one.
    """
    return "v1=" + _mac(secret, v1_message(method, target, timestamp, dispatch_id, attempt, body))


def sign_occurrence(secret: str, request_signature: str, occurrence: str) -> str:
    """The `Rebuno-Occurrence-Signature` value (`v1=<hex>`) of a request whose
    `Rebuno-Signature` is `request_signature` and whose
    `Rebuno-Step-Occurrence` is `occurrence`, both exactly as sent."""
    message = "\n".join([OCCURRENCE_PREFIX, request_signature, occurrence])
    return "v1=" + _mac(secret, message.encode("utf-8"))


def sign_legacy(secret: str, body: bytes) -> str:
    """The body-only signature (`sha256=<hex>`) the kernel puts on webhooks."""
    return "sha256=" + _mac(secret, body)


def verify_webhook(secret: str, body: bytes, header: str | None) -> bool:
    """Check a webhook's `Rebuno-Signature` over the exact body bytes."""
    if header is None or _LEGACY_RE.fullmatch(header) is None:
        return False
    return hmac.compare_digest(header.encode("ascii"), sign_legacy(secret, body).encode("ascii"))
