"""Request and webhook signatures against PROTOCOL §11.4 (request signature vectors)."""

from __future__ import annotations

from rebuno.signing import sign_legacy, sign_occurrence, sign_v1, v1_message, verify_webhook

SECRET = "test-secret"
EXEC_PATH = "/v0/executions/018f3a2b-4c5d-7e6f-8a9b-0c1d2e3f4a5b"
DISPATCH = "01920000-0000-7000-8000-000000000001"
BODY = b'{"kind":"tool_call","target":"send_email","args":{"to":"ops@example.com"},"idempotency":"safe_to_retry"}'


def test_vector_1_submit() -> None:
    assert len(BODY) == 104
    msg = v1_message("POST", EXEC_PATH + "/steps", "1700000000", DISPATCH, "3", BODY)
    assert len(msg) == 235
    assert msg.startswith(b"rebuno-request-v1\nPOST\n" + EXEC_PATH.encode() + b"/steps\n1700000000\n"
                          + DISPATCH.encode() + b"\n3\n")
    assert sign_v1(SECRET, "POST", EXEC_PATH + "/steps", "1700000000", DISPATCH, "3", BODY) == \
        "v1=017dff4039ba40e90d3d8d566fdf51db427672f92d45ef41b738672238ea0058"
    assert sign_legacy(SECRET, BODY) == "sha256=88b767a9e1e2a49ad76f1b27828c50989de249ba0f6ed5a29fbcceeb23abba99"


def test_vector_2_get_with_query() -> None:
    target = EXEC_PATH + "/steps?status=terminal"
    assert len(v1_message("GET", target, "1700000000", None, None, b"")) == 109
    assert sign_v1(SECRET, "GET", target, "1700000000", None, None, b"") == \
        "v1=3c8f9ae9166e84e4b3660904bf829d900757408f63e92526d08941e7b75cd215"


def test_vector_3_heartbeat_without_attempt() -> None:
    target = EXEC_PATH + "/heartbeat"
    assert len(v1_message("POST", target, "1700000000", DISPATCH, None, b"")) == 134
    assert sign_v1(SECRET, "POST", target, "1700000000", DISPATCH, None, b"") == \
        "v1=50126b8835e31c9fbe34b4170efb611d85a8595d1e0dc74cd5abc4bb13980731"


def test_occurrence_signature_vectors() -> None:
    secret = "s3cret-agent-key"
    request_signature = "v1=50126b8835e31c9fbe34b4170efb611d85a8595d1e0dc74cd5abc4bb13980731"
    assert sign_occurrence(secret, request_signature, "0") == \
        "v1=c6884bbf6fcc8941aeac42d932b31cfdb1c369d7fee69e13bc887b6c313ef6c8"
    assert sign_occurrence(secret, request_signature, "7") == \
        "v1=7eb262dd2b0b6db488386364a4d0ce8e8c0c8b517048fb10f62eb32d58b86a60"


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
