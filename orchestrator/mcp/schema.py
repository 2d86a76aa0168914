"""JSON Schemas of the tools' results, derived from the API's records (``orchestrator.results``).

One set of models serves the CLI, the API and MCP: a tool's ``outputSchema`` is made here
from the record class whose ``to_json()`` the tool returns, so the schema cannot drift from
the document. Each record's typed fields become ``properties`` (those without a default are
``required``, with ``schema``); more keys are allowed, as the JSON shapes say ("fields
that must exist; more are welcome").

Pure: imports neither the SDK nor anything that touches a workspace.

Caveat: the mapping knows the annotations the records use (str, int, float, bool, None,
Any, Mapping, tuple/list of X, records, unions of those); anything else becomes ``{}``
(any value), which validates everything rather than rejecting a real document.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from ..results import Record

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def type_schema(tp: Any) -> dict[str, Any]:
    """The JSON Schema of one (resolved) annotation."""
    if tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if isinstance(tp, type) and issubclass(tp, Record):
        return record_schema(tp, top=False)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [type_schema(a) for a in args]
        if any(p == {} for p in parts):
            return {}
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": sorted({p["type"] for p in parts}, key=[p["type"] for p in parts].index)}
        seen: list[dict[str, Any]] = []
        for p in parts:  # tuple[str, ...] | list[str]: one array schema, not two
            if p not in seen:
                seen.append(p)
        return seen[0] if len(seen) == 1 else {"anyOf": seen}
    if origin in (tuple, list) or tp in (tuple, list):
        item = args[0] if args else Any
        return {"type": "array", "items": type_schema(item)}
    if origin in (dict, Mapping) or tp in (dict, Mapping) or origin is typing.Mapping:
        return {"type": "object"}
    return {}


def record_schema(cls: type[Record], *, top: bool = True) -> dict[str, Any]:
    """The schema of ``cls.to_json()`` (``top``: with ``schema``; nested rows carry none)."""
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    if top:
        props["schema"] = {"type": "integer", "const": 1}
        required.append("schema")
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "_order"):
            continue
        nested = cls.nested.get(f.name)
        tp = hints[f.name]
        props[f.name] = ({"type": "array", "items": record_schema(nested, top=False)} if nested else type_schema(tp))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return {"type": "object", "properties": props, "required": required}


def extend(base: dict[str, Any], props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``base`` with more properties (and required names): a record's document plus what a
    tool adds to it (``done``, output tails...)."""
    out = {**base, "properties": {**base.get("properties", {}), **props}}
    out["required"] = list(dict.fromkeys([*base.get("required", []), *required]))
    return out


def obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}
