"""Step identity against every vector of PROTOCOL §11.4."""

from __future__ import annotations

import hashlib

import pytest

from rebuno.identity import (NULL_ARGS_HASH, args_hash, canonical_json, canonical_text, parse_json,
                             step_id)

EXEC = "018ff0a0-0000-7000-8000-000000000001"

# (args as sent, canonical text or None when given as hex, canonical hex or None, args_hash)
DERIVED = [
    ('{"b":"<&>","a":"é\\u2028"}', '{"a":"é\\u2028","b":"\\u003c\\u0026\\u003e"}', None,
     "a48f75fb205c4c4f6587c024b5ce2587fe9100c1b45ffc78e379fc22a59df526"),
    ("{}", "{}", None, "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
    ("[]", "[]", None, "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"),
    ('"hello"', '"hello"', None, "5aa762ae383fbb727af3c7a36d4940a5b8c40a989452d2304fc958ff3f354e7a"),
    ("42", "42", None, "73475cb40a568e8da8a045ced110137e159f890ac4da883b6b17dc651b3a8049"),
    ('{ "b" : 1 , "a" : [ true , false , null ] , "c" : { "z" : "\\n" , "y" : 1.0 } }',
     '{"a":[true,false,null],"b":1,"c":{"y":1.0,"z":"\\n"}}', None,
     "205fa043afdd0b171222ade3a7a238e96b38629eeb3c60c0a888b1074556a099"),
    ('{"n":[1,1.0,1E2,-0,12345678901234567890,1e-7]}', '{"n":[1,1.0,1E2,-0,12345678901234567890,1e-7]}', None,
     "a0043e6d0a529bd4ff88f4618cd8f28a215b8a9a5cd407557c795c267171a6e0"),
    ('{"s":"\\b\\f\\u0001\\u001f\\u007f\\t\\r\\"\\\\\\/"}', None,
     "7b2273223a225c625c665c75303030315c75303031667f5c745c725c225c5c2f227d",
     "95203623d9f0eb4e6c1961784433436ecf1de1d960accf401190117a1f9ebe57"),
    ('{"é":1,"z":2,"A":3,"a":4}', '{"A":3,"a":4,"z":2,"é":1}', None,
     "5bed303ab65d461fdba6f1f905b2433b6462f29fc129d54498f86ba1aae07df4"),
    ('{"\\uff41":1,"\\ud83d\\ude00":2}', None, "7b22efbd81223a312c22f09f9880223a327d",
     "507afd20b4666759002be909c9ce520dcd824cf3f9b44b78b0b2a5b66631bf04"),
    ('{"x":"\\ud800"}', None, "7b2278223a22efbfbd227d",
     "6587c929901f4acd02e8476793f8299067f1e19c0afc2201a6b4be08b18de706"),
    ('{"q":"caf\\u00e9 \\u2029 <b>&amp;</b>"}',
     '{"q":"café \\u2029 \\u003cb\\u003e\\u0026amp;\\u003c/b\\u003e"}', None,
     "5bbabad99b76b49dc1edb105f0047a5eb5ac50793cc8a09e178c7887c63374cc"),
    ('{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}',
     '{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o"}', None,
     "f6ba5028679eb60d0565209bd47356058dc9001b52bef518c77f9115949c479f"),
]


@pytest.mark.parametrize("sent,text,hex_,want", DERIVED, ids=[f"D{i + 1}" for i in range(len(DERIVED))])
def test_derived_vectors(sent: str, text: str | None, hex_: str | None, want: str) -> None:
    got = canonical_text(sent)
    if text is not None:
        assert got == text
    if hex_ is not None:
        assert got.encode("utf-8").hex() == hex_
    assert args_hash(got) == want


def test_published_vectors() -> None:
    h = args_hash(canonical_text('{"path":"/tmp"}'))
    assert h == "ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e7247639"
    assert step_id(EXEC, "tool_call", "read", h, 0) == \
        "88aef972f184963cdb5e1d243d942762ba9614e8cc3ecb7874a2b94b058bce34"
    assert step_id(EXEC, "tool_call", "read", h, 1) == \
        "f506dab25eaea86dc79b0cf5fc8be1bd3ad964e4545b259e955f55951dc3d3ff"
    preimage = ("36:018ff0a0-0000-7000-8000-0000000000019:tool_call4:read64:"
                "ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e72476391:0")
    assert hashlib.sha256(preimage.encode()).hexdigest() == step_id(EXEC, "tool_call", "read", h, 0)
    assert NULL_ARGS_HASH == "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
    assert args_hash(canonical_text(None)) == NULL_ARGS_HASH
    assert args_hash(canonical_text("null")) == NULL_ARGS_HASH
    assert args_hash(canonical_json(None)) == NULL_ARGS_HASH


def test_derived_step_ids() -> None:
    h = args_hash(canonical_text('{"path":"/tmp"}'))
    assert step_id(EXEC, "tool_call", "read", h, 2) == \
        "c762bbc17c29013b5b3c3b09acec3f2cb0301054a0cc0c96f2b51a61281dca15"
    d13 = args_hash(canonical_text('{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}'))
    assert step_id(EXEC, "llm_call", "gpt-4o", d13, 0) == \
        "8060242f6e479b475259b0816e96db25798e2dd06d55e6152332b3d4fc33cadd"
    assert step_id(EXEC, "llm_call", "", d13, 0) == \
        "efa779eb48a4e89e26328d187f0a1aa41c37cb070ed8915928c1e0c2cbfa4813"
    assert step_id(EXEC, "local", "fetch_page", args_hash(canonical_text("{}")), 0) == \
        "df001e5f1224dea94941171bd5c501bf59589f7c26a1a716ca6462778f936d4b"
    # The execution id is hashed in lowercase whatever the caller passes.
    assert step_id(EXEC.upper(), "tool_call", "read", h, 2) == step_id(EXEC, "tool_call", "read", h, 2)


def test_python_values_hash_like_their_json() -> None:
    assert canonical_json({"b": "<&>", "a": "é\u2028"}) == '{"a":"é\\u2028","b":"\\u003c\\u0026\\u003e"}'
    assert canonical_json({"path": "/tmp"}) == canonical_text('{"path":"/tmp"}')
    # Floats keep Python's JSON text; ints and bools are not confused.
    assert canonical_json({"x": 1.0, "y": 1, "z": True}) == '{"x":1.0,"y":1,"z":true}'
    # Lone surrogates become U+FFFD, like the kernel's decoding.
    assert canonical_json({"x": "\ud800"}) == canonical_text('{"x":"\\ud800"}')
    # Tuples are arrays; pydantic-dumpable values are accepted for args.
    assert canonical_json({"t": (1, 2)}) == '{"t":[1,2]}'


def test_non_json_rejected() -> None:
    with pytest.raises(ValueError):
        parse_json('{"x": NaN}')
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
    with pytest.raises(TypeError):
        canonical_json(object(), lenient=False)


def test_duplicate_keys_keep_last() -> None:
    assert canonical_text('{"a":1,"a":2}') == '{"a":2}'
