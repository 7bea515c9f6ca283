"""Step identity against the shared vectors (docs/protocol/vectors: canonical JSON, step ids)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from rebuno.identity import (NULL_ARGS_HASH, args_hash, canonical_json, canonical_text, parse_json,
                             step_id)

from .vectors import load

CANONICAL = load("canonical-json")
STEP_IDS = load("step-ids")
EXEC = STEP_IDS["execution_id"]


@pytest.mark.parametrize("case", CANONICAL["cases"], ids=lambda c: c["name"])
def test_canonical_vectors(case: dict[str, str]) -> None:
    canonical = bytes.fromhex(case["canonical_hex"])
    assert hashlib.sha256(canonical).hexdigest() == case["args_hash"]
    got = canonical_text(case["args"])
    assert got.encode("utf-8") == canonical
    assert args_hash(got) == case["args_hash"]


def test_absent_args() -> None:
    assert NULL_ARGS_HASH == CANONICAL["absent_args_hash"]
    assert args_hash(canonical_text(None)) == NULL_ARGS_HASH
    assert args_hash(canonical_text("null")) == NULL_ARGS_HASH
    assert args_hash(canonical_json(None)) == NULL_ARGS_HASH


@pytest.mark.parametrize("case", STEP_IDS["cases"], ids=lambda c: c["name"])
def test_step_id_vectors(case: dict[str, Any]) -> None:
    h = args_hash(canonical_text(case["args"]))
    assert h == case["args_hash"]
    got = step_id(EXEC, case["kind"], case["target"], h, case["occurrence"])
    assert got == case["step_id"] == hashlib.sha256(case["preimage"].encode("utf-8")).hexdigest()
    # The execution id is hashed in lowercase whatever the caller passes.
    assert step_id(EXEC.upper(), case["kind"], case["target"], h, case["occurrence"]) == got


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
