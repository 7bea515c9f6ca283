"""Step identity (docs/protocol/identity.md): canonical JSON, `args_hash` and `step_id`.

The SDK computes `args_hash` locally to count occurrences itself and send
`Rebuno-Step-Occurrence` (docs/protocol/identity.md §7). The canonical form here must be bit-exact
with the kernel's:

* numbers keep their original literal text (`1.0` stays `1.0`);
* object members are sorted by the UTF-8 bytes of their keys;
* strings are escaped HTML-safely (`<`, `>`, `&`, U+2028, U+2029) and lone
  surrogates become U+FFFD; everything else non-ASCII is raw UTF-8.

The SDK sends the canonical text itself as the step's `args`, so what it
hashes is byte for byte what it sends.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable

from pydantic_core import to_jsonable_python

__all__ = [
    "JSONLiteral",
    "parse_json",
    "canonical_json",
    "canonical_text",
    "canonical_value",
    "args_hash",
    "step_id",
    "NULL_ARGS_HASH",
]


class JSONLiteral(str):
    """A JSON number kept as the literal text it was written with."""

    __slots__ = ()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str | bytes) -> Any:
    """Parse JSON keeping number literals verbatim (as `JSONLiteral`).

    `NaN`, `Infinity` and `-Infinity` are rejected, as the kernel rejects them.
    Duplicate keys keep the last occurrence.
    """
    return json.loads(text, parse_int=JSONLiteral, parse_float=JSONLiteral, parse_constant=_reject_constant)


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029]')
_NAMED = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    named = _NAMED.get(c)
    return named if named is not None else f"\\u{ord(c):04x}"


def _fix(s: str) -> str:
    return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s


def _quote(s: str) -> str:
    return '"' + _ESCAPE.sub(_escape_char, _fix(s)) + '"'


def _write(v: Any, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, JSONLiteral):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(_quote(v))
    elif isinstance(v, list):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    elif isinstance(v, dict):
        items = sorted(((_fix(k), val) for k, val in v.items()), key=lambda kv: kv[0].encode("utf-8"))
        out.append("{")
        for i, (k, val) in enumerate(items):
            if i:
                out.append(",")
            out.append(_quote(k))
            out.append(":")
            _write(val, out)
        out.append("}")
    else:  # pragma: no cover - parse_json produces nothing else
        raise TypeError(f"not a parsed JSON value: {type(v).__name__}")


def canonical_value(parsed: Any) -> str:
    """Canonical text of a value produced by `parse_json`."""
    out: list[str] = []
    _write(parsed, out)
    return "".join(out)


def canonical_text(text: str | bytes | None) -> str:
    """Canonical text of raw JSON (`None` or empty means absent → `null`)."""
    if text is None or (isinstance(text, (bytes, str)) and not text.strip()):
        return "null"
    return canonical_value(parse_json(text))


def _dumps(value: Any, default: Callable[[Any], Any] | None) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=default)


def canonical_json(value: Any, *, lenient: bool = True) -> str:
    """Canonical text of a Python value.

    With `lenient` (the default, used for step args) values that plain JSON
    cannot encode (pydantic models, dataclasses, datetimes, ...) are converted
    the way pydantic would dump them; otherwise they raise `TypeError`.
    """
    default: Callable[[Any], Any] | None = to_jsonable_python if lenient else None
    return canonical_text(_dumps(value, default))


def args_hash(canonical: str) -> str:
    """`lowercase hex SHA-256` of canonical args text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


NULL_ARGS_HASH = args_hash("null")


def step_id(execution_id: str, kind: str, target: str, hash_hex: str, occurrence: int) -> str:
    """The kernel's step id: SHA-256 over length-prefixed fields (docs/protocol/identity.md §4)."""
    fields = [execution_id.lower(), kind, target, hash_hex, str(occurrence)]
    pre = b"".join(str(len(f.encode("utf-8"))).encode("ascii") + b":" + f.encode("utf-8") for f in fields)
    return hashlib.sha256(pre).hexdigest()
