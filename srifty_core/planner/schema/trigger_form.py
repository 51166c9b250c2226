"""The per-field JSON schemas of a document model for the DAG's trigger form (Airflow
``Param``s): self-contained, references inlined, nullable types the form can show."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


def param_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Per top-level field of ``model``: ``{"schema": ..., "description": ..., "default":
    ...}`` for an Airflow ``Param`` (self-contained JSON schemas: references inlined,
    ``anyOf [X, null]`` written as ``type: [.., "null"]`` for the trigger form).
    ``default`` is absent for a required field."""
    full = model.model_json_schema()
    defs = full.get("$defs", {})
    out: dict[str, dict[str, Any]] = {}
    for name, prop in full["properties"].items():
        schema = _simplify(_inline(prop, defs))
        entry: dict[str, Any] = {}
        if "description" in schema:
            entry["description"] = schema.pop("description")
        if "default" in schema:
            entry["default"] = schema.pop("default")
        entry["schema"] = schema
        out[name] = entry
    return out


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline({**copy.deepcopy(target), **rest}, defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _simplify(node: Any) -> Any:
    if isinstance(node, list):
        return [_simplify(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _simplify(v) for k, v in node.items() if k != "title"}
    options = node.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other.get("type"), str):
            del node["anyOf"]
            merged = {**other, **node, "type": [other["type"], "null"]}
            if "enum" in merged:
                merged["enum"] = [*merged["enum"], None]
            return merged
    return node
