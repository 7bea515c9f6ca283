"""Handler input binding: the handler's signature is its input schema.

Three shapes (Agents page; docs/protocol/sdk.md §3):

1. keyword fields — each parameter is an input field, validated by a pydantic
   model built from the signature (extra keys ignored, annotations enforced);
2. a single pydantic model parameter — the input is validated against it;
3. raw passthrough — a single `dict`/`Any`/unannotated parameter gets the
   input unchanged.

Shapes 1 and 2 need a JSON object (`null` counts as `{}`). Failures raise
`BindingError` with the execution's failure reason.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pydantic
from pydantic import BaseModel, ConfigDict

__all__ = ["Binding", "BindingError", "bind_handler"]


class BindingError(Exception):
    """The input cannot be bound; `reason` is the execution's failure reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _is_raw(tp: Any) -> bool:
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return True
    origin = typing.get_origin(tp) or tp
    return origin in (dict, Mapping, typing.Mapping) or (inspect.isclass(origin) and issubclass(origin, dict))


def _format_errors(err: pydantic.ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "; ".join(parts)


@dataclass
class Binding:
    """How one handler takes its input."""

    shape: str  # "fields", "model" or "raw"
    param: str | None
    model: type[BaseModel] | None
    names: tuple[str, ...]

    def bind(self, value: Any) -> dict[str, Any]:
        """Keyword arguments for the handler, or `BindingError`."""
        if self.shape == "raw":
            return {self.param: value} if self.param else {}
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise BindingError("input must be a JSON object")
        assert self.model is not None
        try:
            validated = self.model.model_validate(value)
        except pydantic.ValidationError as e:
            raise BindingError(f"input validation failed: {_format_errors(e)}") from e
        except Exception as e:  # any other binding failure (docs/protocol/sdk.md §3)
            raise BindingError(f"input validation failed: {e}") from e
        if self.shape == "model":
            assert self.param is not None
            return {self.param: validated}
        return {name: getattr(validated, name) for name in self.names}

    def json_schema(self) -> dict[str, Any] | None:
        """The input schema published as agent metadata (None for raw input)."""
        if self.model is None:
            return None
        try:
            return self.model.model_json_schema()
        except Exception:  # an annotation pydantic cannot describe
            return None


def _resolve_each(handler: Callable[..., Any], sig: inspect.Signature) -> dict[str, Any]:
    """Resolve postponed (string) annotations one by one; an annotation that
    names something the handler's module cannot see is an error at bind time."""
    namespace = dict(getattr(handler, "__globals__", {}))
    hints: dict[str, Any] = {}
    for p in sig.parameters.values():
        ann = p.annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, namespace)  # noqa: S307 - the handler's own annotation text
            except Exception as e:
                raise TypeError(f"cannot resolve the annotation {p.annotation!r} of handler parameter "
                                f"{p.name!r} ({e}); define the type at module level") from e
        hints[p.name] = ann
    return hints


def bind_handler(handler: Callable[..., Any]) -> Binding:
    """Analyse a handler's signature once, at `bind()` time."""
    sig = inspect.signature(handler)
    try:
        hints = typing.get_type_hints(handler)
    except Exception:
        hints = _resolve_each(handler, sig)
    params = [p for p in sig.parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in sig.parameters.values()):
        raise TypeError("handler parameters must be passable by keyword")
    if not params:
        return Binding("raw", None, None, ())
    if len(params) == 1:
        p = params[0]
        tp = hints.get(p.name, p.annotation)
        if _is_model(tp):
            return Binding("model", p.name, tp, (p.name,))
        if _is_raw(tp):
            return Binding("raw", p.name, None, (p.name,))
    fields: dict[str, Any] = {}
    for p in params:
        tp = hints.get(p.name, p.annotation)
        if tp is inspect.Parameter.empty:
            tp = Any
        fields[p.name] = (tp, ... if p.default is inspect.Parameter.empty else p.default)
    model = pydantic.create_model(
        f"{getattr(handler, '__name__', 'handler')}_input",
        __config__=ConfigDict(extra="ignore", arbitrary_types_allowed=True),
        **fields,
    )
    return Binding("fields", None, model, tuple(fields))
