"""A problem with a request document, said as one ``FieldError`` whose message starts with
the bad field's path (``offers[1].quota: must be ..., got -2``): ``field_error`` turns a
pydantic ``ValidationError`` into it, ``check`` validates one value against a field type
(``fields``), ``PathError`` is how a model validator names the field it refuses.
"""

from __future__ import annotations

import datetime
import math
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, TypeAdapter, ValidationError

from srifty_core.errors import FieldError, UnknownNameError
from srifty_core.planner.schema.fields import Rule


class PathError(ValueError):
    """Raised by a model validator about one field (pydantic gives such errors no path)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


class HugeInt:
    """An integer literal too long to convert (Python refuses over 4300 digits), as the
    request file readers keep it: no field type accepts it, so the error names the field
    instead of the parser crashing."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit integer"


def field_error(exc: ValidationError, root: Any, where: str = "") -> FieldError:
    """One ``FieldError`` for a pydantic ``ValidationError`` of ``root`` (a model class or
    an annotated type): the first problem, then the paths of the others."""
    problems = []
    errors = exc.errors(include_url=False)
    # An unknown key first: it is most often a typo of the field also reported missing.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    for err in errors:
        path, text = _describe(err, root)
        problems.append((_join(where, path), text, err["type"] == "missing"))
    if not problems:  # pragma: no cover - pydantic always reports one
        return FieldError(where or "value", "is invalid")
    whole = where or str(getattr(root, "kind", "value"))
    (path, text, _), rest = problems[0], problems[1:]
    path = path or whole
    if rest:
        others = [f"{p or whole}{' (missing)' if gone else ''}" for p, _, gone in rest[:5]]
        more = f", {len(rest) - 5} more" if len(rest) > 5 else ""
        text += f" (also wrong: {', '.join(others)}{more})"
    return FieldError(path, text)


def _describe(err: Mapping[str, Any], root: Any) -> tuple[str, str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "missing":
        return _path(loc), "missing"
    if kind == "invalid_key":
        return _path(loc[:-1]), f"field names must be strings, got {_show(loc[-1])}"
    if kind == "extra_forbidden":
        node = _node_at(root, loc[:-1])
        valid = list(node.model_fields) if _is_model(node) else []
        what = f"{getattr(node, 'kind', 'field')} field"
        return _path(loc), str(UnknownNameError(what, _clip(str(loc[-1])), valid))
    error = (err.get("ctx") or {}).get("error")
    if isinstance(error, PathError):
        return _join(_path(loc), error.path), error.problem
    rule = _rule_at(root, loc)
    value = err.get("input")
    if rule is None:
        return _path(loc), f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {_show(value)}"
    return _path(loc), f"must be {rule}, got {_show(value)}"


def _join(where: str, path: str) -> str:
    if not where:
        return path
    if not path:
        return where
    return where + path if path.startswith("[") else f"{where}.{path}"


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{_clip(repr(part))}]"
    return out


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _show(value: Any) -> str:
    """A short, safe rendering of a bad value (never the whole of a huge one)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        digits = len(str(abs(value))) if value.bit_length() < 64 else _digits(value)
        return str(value) if digits <= 20 else f"a {digits}-digit integer"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _clip(repr(value))
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}" if value else "an empty list"
    if isinstance(value, HugeInt):
        return repr(value)
    if isinstance(value, datetime.date):  # YAML reads 2026-01-01 as a date
        return f"the date {value.isoformat()}"
    return f"a value of type {type(value).__name__}"


def _digits(value: int) -> int:
    """Decimal digits of ``value`` without ``str`` (which refuses over 4300 digits)."""
    v = abs(value)
    d = max(1, math.floor((v.bit_length() - 1) * math.log10(2)) + 1)  # d or d + 1
    return d + 1 if v >= 10**d else d


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)


def _strip(ann: Any) -> tuple[Any, list[Any]]:
    """``ann`` without ``Optional`` and ``Annotated``, and the metadata they carried."""
    meta: list[Any] = []
    while True:
        origin = typing.get_origin(ann)
        if origin is Annotated:
            ann, *extra = typing.get_args(ann)
            meta.extend(extra)
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return ann, meta
            ann = args[0]
        else:
            return ann, meta


def _node_at(root: Any, loc: tuple[Any, ...]) -> Any:
    """The type at ``loc`` under ``root`` (a model class or an annotated type)."""
    return _walk(root, loc)[0]


def _walk(root: Any, loc: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    ann, meta = _strip(root)
    for part in loc:
        if _is_model(ann) and isinstance(part, str) and part in ann.model_fields:
            f = ann.model_fields[part]
            ann, meta = _strip(f.annotation)
            meta = [*f.metadata, *meta]
        elif isinstance(part, int) and typing.get_origin(ann) in (list, tuple):
            ann, meta = _strip(typing.get_args(ann)[0])
        else:
            return None, []
    return ann, meta


def _rule_at(root: Any, loc: tuple[Any, ...]) -> str | None:
    ann, meta = _walk(root, loc)
    for m in meta:
        if isinstance(m, Rule):
            return m.text
    if _is_model(ann):
        return str(ann.rule)
    return None


_ADAPTERS: dict[int, TypeAdapter[Any]] = {}


def check(path: str, kind: Any, value: Any) -> None:
    """Raise ``FieldError`` naming ``path`` unless ``value`` is a valid ``kind`` (one of the
    field types of ``fields``): how the planner's dataclasses check what they are given."""
    adapter = _ADAPTERS.get(id(kind))
    if adapter is None:
        adapter = _ADAPTERS[id(kind)] = TypeAdapter(kind)
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        raise field_error(exc, kind, path) from None
