"""The MCP tools' argument schemas as a model reads them (the table in orchestrator.mcp.tools,
no server): what each argument means is said in its description, and the arguments the
issue found missing are there. Pure: imports no SDK, touches no workspace."""
from __future__ import annotations

import jsonschema
import pytest

from orchestrator.mcp.tools import BY_NAME, INSTRUCTIONS, TOOLS, _duration

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def props(tool: str) -> dict:
    return BY_NAME[tool].input_schema["properties"]


def valid(tool: str, args: dict) -> bool:
    return jsonschema.Draft202012Validator(BY_NAME[tool].input_schema).is_valid(args)


def test_sandbox_run_says_exactly_one_of_command_or_argv_and_has_cwd():
    for tool in ("sandbox_run", "sandbox_run_start"):
        p = props(tool)
        assert "exactly one of command and argv" in p["command"]["description"]
        assert "exactly one of command and argv" in p["argv"]["description"]
        assert "exactly one of command" in BY_NAME[tool].description
        assert p["cwd"]["type"] == "string" and "relative to the workspace root" in p["cwd"]["description"]


def test_timeout_s_takes_a_duration_as_ttl_does():
    for tool in ("sandbox_run", "sandbox_run_start"):
        assert valid(tool, {"sandbox": "sb", "command": "true", "timeout_s": "10m"}), tool
    assert valid("race", {"check": "true", "candidates": [{"cmd": "x"}], "timeout_s": "10m"})
    assert _duration({"timeout_s": "10m"}, "timeout_s", 120) == 600.0
    assert _duration({"timeout_s": 2.5}, "timeout_s", 120) == 2.5
    assert _duration({}, "timeout_s", 120) == 120.0
    from orchestrator.errors import UsageError
    with pytest.raises(UsageError, match="^timeout_s: bad duration 'soon'"):
        _duration({"timeout_s": "soon"}, "timeout_s", 120)
    with pytest.raises(UsageError, match="^timeout_s: 0 is not more than 0 seconds"):
        _duration({"timeout_s": 0}, "timeout_s", 120)


def test_every_argument_of_the_file_tools_is_described_and_fork_from_takes_a_label():
    for name, tool in BY_NAME.items():
        if not name.startswith("sandbox_") or not name.endswith(("_file", "_files", "_grep")):
            continue
        for arg, schema in tool.args.items():
            if arg in ("include_ignored", "ignore_case", "content", "new", "old", "encoding", "max_bytes",
                       "max_entries", "max_matches", "replace_all", "count", "pattern"):
                continue  # their names say it
            assert schema.get("description"), (name, arg)
    assert "label" in props("sandbox_fork")["from"]["description"]
    assert "winner" in props("race")["label"]["description"]


def test_the_file_tools_of_spec_are_there_with_their_arguments():
    assert {"sandbox", "path", "glob"} <= set(props("sandbox_list_files"))
    assert {"sandbox", "pattern", "path", "glob"} <= set(props("sandbox_grep"))
    assert set(BY_NAME["sandbox_grep"].required) == {"sandbox", "pattern"}
    assert set(BY_NAME["sandbox_delete_file"].required) == {"sandbox", "path"}
    assert set(BY_NAME["sandbox_move_file"].required) == {"sandbox", "from", "to"}
    assert {"start_line", "end_line"} <= set(props("sandbox_read_file"))
    for name in ("sandbox_list_files", "sandbox_grep"):
        assert BY_NAME[name].read_only and not BY_NAME[name].destructive
    for name in ("sandbox_delete_file", "sandbox_move_file"):
        assert BY_NAME[name].destructive and not BY_NAME[name].read_only
    assert "sandbox_grep" in INSTRUCTIONS and len(INSTRUCTIONS) < 2000
    assert all(len(t.description) < 300 for t in TOOLS)
