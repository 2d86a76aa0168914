"""The MCP tools' schemas are derived, not written (orchestrator.mcp.params, schema, tools):
each tool's inputSchema is its handler's argument model, its outputSchema the record (or
TypedDict) its document is. These tests pin that derivation so it cannot drift: the schema's
properties are the model's fields, a required argument has no default, a default in the
schema is the one the handler gets, the output schema's properties are the record's fields
and real documents validate against it, and the generated module the server reads is what
the types make now. Pure: no SDK, no workspace."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import jsonschema
import pytest

from merge.on_conflict import ON_CONFLICT
from orchestrator import results as R
from orchestrator.errors import UsageError
from orchestrator.mcp import params as P
from orchestrator.mcp.tools import BY_NAME, TOOLS

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

REPO = Path(__file__).resolve().parents[2]


def _fields(model):
    return {(f.alias or name): f for name, f in model.model_fields.items()}


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_the_input_schema_is_the_handlers_argument_model(tool):
    hints = typing.get_type_hints(tool.handler)
    assert list(hints)[:2] == ["st", "a"] and hints["a"] is tool.params and issubclass(tool.params, P.Args)
    schema = tool.input_schema
    fields = _fields(tool.params)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(fields)
    assert set(schema["required"]) == {k for k, f in fields.items() if f.is_required()}
    for name, prop in schema["properties"].items():
        f = fields[name]
        if f.is_required() or f.default is None:
            assert "default" not in prop, (tool.name, name)  # required, or "not given": no default to show
        else:
            assert prop["default"] == f.default, (tool.name, name)
        assert "null" not in str(prop.get("type")) and "anyOf" not in prop, (tool.name, name)  # never nullable


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_a_tool_told_only_its_defaults_gets_them(tool):
    required = {k: None for k in tool.required}
    if required:
        return
    parsed = tool.parse({})
    for name, prop in tool.args.items():
        if "default" in prop:
            got = getattr(parsed, _attr(tool.params, name))
            assert got == prop["default"], (tool.name, name)


def _attr(model, alias):
    return next(n for n, f in model.model_fields.items() if (f.alias or n) == alias)


def _record(tool):
    return next((s for s in tool.result if isinstance(s, type) and issubclass(s, R.Record)), None)


@pytest.mark.parametrize("tool", [t for t in TOOLS if _record(t)], ids=lambda t: t.name)
def test_the_output_schema_is_the_records_fields(tool):
    rec = _record(tool)
    fields = [f for f in dataclasses.fields(rec) if f.name not in ("extra", "_order")]
    schema = tool.output_schema
    assert {f.name for f in fields} | {"schema"} <= set(schema["properties"])
    needed = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert needed | {"schema"} <= set(schema["required"])
    assert schema["properties"]["schema"] == {"type": "integer", "const": 1}
    for name, nested in rec.nested.items():  # rows of records: their fields, required as the row's record says
        items = schema["properties"][name]["items"]
        assert {f.name for f in dataclasses.fields(nested)} - {"extra", "_order"} == set(items["properties"])


def test_real_documents_validate_against_the_output_schemas_and_wrong_ones_do_not():
    def ok(tool, doc):
        return jsonschema.Draft202012Validator(BY_NAME[tool].output_schema).is_valid(doc)

    info = R.SandboxInfo(id="sb-1", label="a", limits={"mem_bytes": 1}, last_exit_code=None)
    assert ok("sandbox_fork", R.Forked(sandboxes=(info,)).to_json())
    assert ok("sandbox_list", R.SandboxList(sandboxes=(info,)).to_json())
    run = R.RunResult(id="sb-1", run=2, exit_code=0, limits_hit=("pids",), argv=["true"]).to_json()
    tails = {"stdout_tail": "", "stderr_tail": "", "truncated": {"stdout": 0, "stderr": 0}}
    assert ok("sandbox_run", {**run, **tails})
    assert not ok("sandbox_run", run)  # the tails are promised
    assert not ok("sandbox_run", {**run, **tails, "exit_code": "0"})
    race = R.Race(race="r-1", candidates=(R.RaceCandidate(candidate="a", kind="cmd"),)).to_json()
    assert ok("race", {**race, "done": True})
    assert ok("race", {**race, "done": False, "candidates": [{**race["candidates"][0], "rank": None}]})  # not yet
    assert not ok("race", race)
    assert ok("sandbox_run_poll", {"schema": 1, "events": [{"cursor": 0, "stream": "stdout", "text": "x"}],
                                   "next_cursor": 1, "done": False, "exit_code": None, "killed_by": None})
    assert not ok("sandbox_run_poll", {"schema": 1, "events": [{"cursor": 0}], "next_cursor": 1, "done": False,
                                       "exit_code": None, "killed_by": None})
    assert not ok("sandbox_fork", {"schema": 2, "sandboxes": []})


def test_bad_arguments_are_one_usage_line_naming_the_argument():
    with pytest.raises(UsageError, match=r"^sandbox_run: timeout_s: True is not of type 'number', 'string'$"):
        BY_NAME["sandbox_run"].parse({"sandbox": "x", "command": "true", "timeout_s": True})
    with pytest.raises(UsageError, match=r"^sandbox_fork: label: None is not of type 'string'$"):
        BY_NAME["sandbox_fork"].parse({"label": None})  # left out, never null
    with pytest.raises(UsageError, match=r"^race: candidates/0: .* has too many properties$"):
        BY_NAME["race"].parse({"check": "true", "candidates": [{"cmd": "a", "patch": "b"}]})
    with pytest.raises(UsageError, match=r"^promote: on_conflict: 'both' is not one of"):
        BY_NAME["promote"].parse({"sandbox": "x", "on_conflict": "both"})
    with pytest.raises(UsageError, match=r"^sandbox_move_file: Additional properties are not allowed \('from_'"):
        BY_NAME["sandbox_move_file"].parse({"sandbox": "x", "from_": "a", "to": "b"})


def test_parsed_arguments_are_typed_and_from_is_from():
    got = BY_NAME["race"].parse({"check": "true", "candidates": [{"cmd": "a"}, {"patch_text": "p"}], "from": "s-1",
                                  "timeout_s": "10m"})
    assert isinstance(got, P.Race) and got.from_ == "s-1" and got.timeout_s == "10m" and got.jobs == 8
    assert [type(c) for c in got.candidates] == [P.Candidate, P.Candidate] and got.candidates[1].patch_text == "p"
    moved = BY_NAME["sandbox_move_file"].parse({"sandbox": "x", "from": "a", "to": "b"})
    assert moved.from_ == "a" and moved.overwrite is False


def test_on_conflict_is_the_one_enum():
    prop = BY_NAME["promote"].args["on_conflict"]
    assert tuple(prop["enum"]) == ON_CONFLICT and prop["default"] == "fail" and prop["type"] == "string"
    got = BY_NAME["promote"].parse({"sandbox": "x", "on_conflict": "theirs"})
    assert got.on_conflict == "theirs" and got.on_conflict.value == "theirs"


def test_the_server_module_loads_neither_the_tools_nor_pydantic_before_initialize():
    # petri mcp answers `initialize` (handshake) after importing the server module and before
    # the SDK: the tool table and its models (pydantic) must not be on that path
    code = ("import sys, orchestrator.mcp.server as s\n"
            "assert s.INSTRUCTIONS\n"
            "bad = [m for m in ('pydantic', 'orchestrator.mcp.tools', 'orchestrator.mcp.params') if m in sys.modules]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_generated_schemas_are_what_the_types_make_now():
    # The server reads the schemas from a generated module (made ahead: start-up); a changed
    # model, record or TypedDict must be followed by `python -m orchestrator.mcp.schema`.
    from orchestrator.mcp import schema
    from orchestrator.mcp._generated_schemas import SCHEMAS

    made = schema.derived()
    assert list(SCHEMAS) == [t.name for t in TOOLS]
    for name, got in made.items():
        assert SCHEMAS[name] == got, f"{name}: run `python -m orchestrator.mcp.schema` (the schemas are stale)"
    assert schema.GENERATED.read_text() == schema.generated_text(made), "run `python -m orchestrator.mcp.schema`"
    assert schema.main(["--check"]) == 0
