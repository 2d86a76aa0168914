"""The MCP tools' JSON Schemas, made by pydantic from types, none written by hand:

- ``input_schema(model)``: a tool's ``inputSchema`` from its argument model (``params``:
  one pydantic model per tool, the field types, defaults, bounds and descriptions);
- ``output_schema(*shapes)``: a tool's ``outputSchema`` from the record class whose
  ``to_json()`` the tool returns (``orchestrator.results``: one set of types serves the CLI,
  the API and MCP, so the schema cannot drift from the document), merged with a
  ``TypedDict`` of what the tool adds to it (``documents``), or a ``TypedDict`` alone where
  no record exists.

A record's typed fields become ``properties`` (those without a default are ``required``,
with ``schema``); more keys are allowed, as the JSON shapes say ("fields that must exist;
more are welcome").

pydantic's output is then put in the form the tools always had, which several model APIs
read more reliably: no ``title``; ``$ref`` inlined; a union of plain types as one ``type``
list; a union with ``Any`` in it as any value; an object's ``additionalProperties: true``
left implicit; in an output schema no ``default``; an argument whose default is None is
left out rather than given as null (so no argument is nullable: none was, and the handlers
read None as "not given").

Run ahead of time, not when the server starts: ``python -m orchestrator.mcp.schema`` writes
every tool's schemas into ``_generated_schemas.py``, which the server reads (``--check``
only compares; tests/mcp/test_mcp_tool_schemas.py fails when the file is not what the types
make now). Making them costs tens of milliseconds of CPU (pydantic's schema generation and
the records' type hints), which would otherwise sit on the way to a client's first
``tools/list``.

Caveats: a record field typed with something pydantic cannot describe fails here, when the
module is generated (or checked), not when a tool is called; a recursive type
would not end (``$ref``s are inlined; no record or model is recursive).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from ..api.records import Record


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The ``inputSchema`` of a tool whose arguments ``model`` declares."""
    out = _tidy(model.model_json_schema(by_alias=True), argument=True)
    out.setdefault("required", [])
    return out


def output_schema(*shapes: type, loose: typing.Mapping[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """The ``outputSchema`` of a tool whose document is ``shapes`` merged (a record class and
    the ``TypedDict`` of what the tool adds; a later shape's property wins). ``loose``: per
    array of rows, the fields of a row that may hold anything (not known yet)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for shape in shapes:
        tp = _record_shape(shape, top=True) if isinstance(shape, type) and issubclass(shape, Record) else shape
        got = _tidy(TypeAdapter(tp).json_schema(by_alias=True), argument=False)
        props.update(got.get("properties", {}))
        required += [r for r in got.get("required", []) if r not in required]
    for array, names in (loose or {}).items():
        props[array]["items"]["properties"].update({n: {} for n in names})
    return {"type": "object", "properties": props, "required": required}


@functools.cache
def _record_shape(cls: type[Record], *, top: bool) -> Any:
    """A ``TypedDict`` of ``cls.to_json()`` (``top``: with ``schema``; nested rows carry none):
    a field without a default is required, the others ``NotRequired``."""
    hints = typing.get_type_hints(cls)
    keys: dict[str, Any] = {"schema": Literal[1]} if top else {}
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "_order"):
            continue
        nested = cls.nested.get(f.name)
        tp = tuple[_record_shape(nested, top=False), ...] if nested else _swap(hints[f.name])  # type: ignore[misc]
        if nested and type(None) in typing.get_args(hints[f.name]):  # rows only some documents have
            tp = tp | None
        needed = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        keys[cls.aliases.get(f.name, f.name)] = tp if needed else NotRequired[tp]
    return TypedDict(cls.__name__, keys)  # type: ignore[operator]


def _swap(tp: Any) -> Any:
    """``tp`` with every record class in it replaced by its ``TypedDict``."""
    if isinstance(tp, type) and issubclass(tp, Record):
        return _record_shape(tp, top=False)
    args = typing.get_args(tp)
    new = tuple(a if a is Ellipsis else _swap(a) for a in args)
    if new == args:
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.Union[new]
    return typing.get_origin(tp)[new]


def _tidy(schema: dict[str, Any], *, argument: bool) -> dict[str, Any]:
    """pydantic's ``schema`` in the tools' form (the module docstring lists the rules);
    ``argument``: an input schema."""
    defs = schema.pop("$defs", {})

    def walk(node: Any, *, is_property: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[1]]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        node = dict(node)
        node.pop("title", None)
        if node.get("additionalProperties") is True:
            del node["additionalProperties"]
        if argument and is_property and "default" in node and node["default"] is None:
            del node["default"]  # left out, not null
            if "anyOf" in node:
                node["anyOf"] = [m for m in node["anyOf"] if m != {"type": "null"}]
        elif not argument:
            node.pop("default", None)
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "properties":
                out[k] = {name: walk(p, is_property=True) for name, p in v.items()}
            elif k in ("enum", "required", "const", "default", "examples"):  # values, not schemas
                out[k] = v
            else:
                out[k] = walk(v)
        if "anyOf" in out:
            out = _union(out)
        return out

    return walk(schema)


def _union(node: dict[str, Any]) -> dict[str, Any]:
    """An ``anyOf`` as the simplest schema that says the same."""
    members: list[dict[str, Any]] = []
    for m in node.pop("anyOf"):
        if m not in members:
            members.append(m)
    if any(m == {} for m in members):
        return {k: v for k, v in node.items() if k == "description"}  # anything
    if len(members) == 1:
        return {**members[0], **node}
    if all(set(m) == {"type"} and isinstance(m["type"], str) for m in members):
        return {"type": [m["type"] for m in members], **node}
    return {"anyOf": members, **node}


# ---------------------------------------------------------------------------- the generated module

GENERATED = Path(__file__).with_name("_generated_schemas.py")


def derived() -> dict[str, dict[str, Any]]:
    """Every tool's schemas as made now from its model and result types (name -> inputSchema,
    outputSchema)."""
    from .tools import TOOLS

    return {t.name: {"inputSchema": input_schema(t.params), "outputSchema": output_schema(*t.result, loose=t.loose)}
            for t in TOOLS}


def generated_text(schemas: dict[str, dict[str, Any]]) -> str:
    body = json.dumps(schemas, indent=1, ensure_ascii=False)
    return (f"{_HEADER}\nimport json\nfrom typing import Any\n\n"
            f'SCHEMAS: dict[str, dict[str, Any]] = json.loads(r"""\n{body}\n""")\n')


_HEADER = '''# ruff: noqa: E501
"""The MCP tools' schemas (tool name -> inputSchema, outputSchema), generated from their
argument models and result types by ``python -m orchestrator.mcp.schema``: do not edit.

Made ahead rather than when the server starts: pydantic takes tens of milliseconds of CPU
to make them, on the way to a client's first tools/list. tests/mcp/test_mcp_tool_schemas.py
fails when this file is not what the types make now.
"""'''


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.mcp.schema [--check]``: write the generated module (or only
    check that it is current: exit 1 if not)."""
    args = sys.argv[1:] if argv is None else argv
    text = generated_text(derived())
    if "--check" in args:
        current = GENERATED.read_text() if GENERATED.exists() else ""
        if current != text:
            print(f"{GENERATED} is out of date: run `python -m orchestrator.mcp.schema`", file=sys.stderr)
            return 1
        return 0
    GENERATED.write_text(text)
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
