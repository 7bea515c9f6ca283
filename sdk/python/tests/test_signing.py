"""Request and webhook signatures against the shared vectors (docs/protocol/vectors/signatures.json)."""

from __future__ import annotations

from typing import Any

import pytest

from rebuno.signing import sign_legacy, sign_occurrence, sign_v1, v1_message, verify_webhook

from .vectors import load

SIGNATURES = load("signatures")
SECRET = SIGNATURES["requests"][0]["secret"]


@pytest.mark.parametrize("case", SIGNATURES["requests"], ids=lambda c: c["name"])
def test_request_vectors(case: dict[str, Any]) -> None:
    body = case["body"].encode("utf-8")
    args = (case["secret"], case["method"], case["target"], case["timestamp"], case["dispatch_id"],
            case["dispatch_attempt"], body)
    msg = v1_message(*args[1:])
    assert msg == case["message"].encode("utf-8") and len(msg) == case["message_length"]
    assert sign_v1(*args) == case["signature"]
    if "legacy_signature" in case:
        assert sign_legacy(case["secret"], body) == case["legacy_signature"]


@pytest.mark.parametrize("case", SIGNATURES["occurrences"], ids=lambda c: "occurrence " + c["occurrence"])
def test_occurrence_signature_vectors(case: dict[str, Any]) -> None:
    assert sign_occurrence(case["secret"], case["request_signature"], case["occurrence"]) == case["signature"]


def test_verify_webhook() -> None:
    body = b'{"execution_id":"x"}'
    good = sign_legacy(SECRET, body)
    assert verify_webhook(SECRET, body, good)
    assert not verify_webhook(SECRET, body + b" ", good)
    assert not verify_webhook("other", body, good)
    assert not verify_webhook(SECRET, body, None)
    assert not verify_webhook(SECRET, body, good.upper().replace("SHA256", "sha256"))  # uppercase hex refused
    assert not verify_webhook(SECRET, body, "v1=" + good[len("sha256="):])
    assert not verify_webhook(SECRET, body, good[:-1])
