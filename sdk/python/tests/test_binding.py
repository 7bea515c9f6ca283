"""Handler input binding: the three shapes of the Agents page and docs/protocol/sdk.md §3's reasons."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from rebuno._binding import BindingError, bind_handler


async def fields(prompt: str, limit: int = 10) -> dict[str, Any]:
    return {}


class In(BaseModel):
    prompt: str
    limit: int = 10


async def model(data: In) -> dict[str, Any]:
    return {}


async def raw_dict(input: dict[str, Any]) -> dict[str, Any]:
    return {}


async def raw_any(input: Any) -> dict[str, Any]:
    return {}


async def raw_bare(input):  # type: ignore[no-untyped-def]
    return {}


async def nothing() -> dict[str, Any]:
    return {}


async def single_str(prompt: str) -> dict[str, Any]:
    return {}


def test_keyword_fields() -> None:
    b = bind_handler(fields)
    assert b.shape == "fields"
    assert b.bind({"prompt": "hi"}) == {"prompt": "hi", "limit": 10}
    assert b.bind({"prompt": "hi", "limit": "3", "extra": True}) == {"prompt": "hi", "limit": 3}
    with pytest.raises(BindingError) as e:
        b.bind({"limit": 1})
    assert e.value.reason == "input validation failed: prompt: Field required"
    with pytest.raises(BindingError) as e:
        b.bind({"prompt": "hi", "limit": "many"})
    assert e.value.reason.startswith("input validation failed: limit: ")


def test_not_an_object() -> None:
    for handler in (fields, model, single_str):
        b = bind_handler(handler)
        for value in ("text", 3, [1], True):
            with pytest.raises(BindingError) as e:
                b.bind(value)
            assert e.value.reason == "input must be a JSON object"


def test_null_is_empty_object() -> None:
    with pytest.raises(BindingError) as e:
        bind_handler(fields).bind(None)
    assert e.value.reason == "input validation failed: prompt: Field required"

    async def optional(limit: int = 5) -> None: ...

    assert bind_handler(optional).bind(None) == {"limit": 5}


def test_pydantic_model() -> None:
    b = bind_handler(model)
    assert b.shape == "model"
    got = b.bind({"prompt": "hi"})
    assert isinstance(got["data"], In) and got["data"] == In(prompt="hi", limit=10)
    with pytest.raises(BindingError) as e:
        b.bind({"limit": 3})
    assert e.value.reason == "input validation failed: prompt: Field required"
    assert b.json_schema() is not None and "prompt" in b.json_schema()["properties"]  # type: ignore[index]


@pytest.mark.parametrize("handler", [raw_dict, raw_any, raw_bare])
def test_raw_passthrough(handler: Any) -> None:
    b = bind_handler(handler)
    assert b.shape == "raw"
    for value in ({"anything": [1, 2]}, "text", None, 5):
        assert b.bind(value) == {"input": value}


def test_single_field_is_not_raw() -> None:
    b = bind_handler(single_str)
    assert b.shape == "fields"
    assert b.bind({"prompt": "x"}) == {"prompt": "x"}


def test_no_parameters_ignores_input() -> None:
    assert bind_handler(nothing).bind({"x": 1}) == {}
    assert bind_handler(nothing).bind("anything") == {}


def test_postponed_annotations_resolve() -> None:
    ns: dict[str, Any] = {}
    exec("from __future__ import annotations\nasync def h(n: int, s: str = 'x'):\n    return n\n", ns)
    b = bind_handler(ns["h"])
    assert b.bind({"n": "4"}) == {"n": 4, "s": "x"}


def test_unresolvable_annotation_fails_at_bind_time() -> None:
    ns: dict[str, Any] = {}
    exec("from __future__ import annotations\nasync def h(data: Missing):\n    return data\n", ns)
    with pytest.raises(TypeError, match="Missing"):
        bind_handler(ns["h"])
