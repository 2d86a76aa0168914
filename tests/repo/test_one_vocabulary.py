"""One list of ``--on-conflict`` choices (merge.on_conflict): the merge layer's type, the CLI's
options (promote, try, rebase), the MCP tools' schemas and the API all read it, so a new choice
cannot reach one of them and not the others (it was spelled in four places)."""
from __future__ import annotations

import typing

import click
import pytest
import typer.main

from merge.on_conflict import ON_CONFLICT, OnConflict

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def test_the_choices_are_the_merge_layers_type():
    assert ON_CONFLICT == typing.get_args(OnConflict) == ("fail", "markers", "theirs", "ours")
    import merge.promote
    assert merge.promote.OnConflict is OnConflict


def test_every_cli_option_offers_exactly_those_choices():
    from orchestrator.cli.app import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="petri")
    seen = []
    for name in group.list_commands(root):
        sub = group.get_command(root, name)
        for p in sub.params if sub is not None else ():
            if "--on-conflict" in getattr(p, "opts", ()):
                assert isinstance(p.type, click.Choice) and tuple(p.type.choices) == ON_CONFLICT, name
                seen.append(name)
    assert {"promote", "try", "rebase"} <= set(seen), seen


def test_every_mcp_tool_offers_exactly_those_choices():
    from orchestrator.mcp.tools import TOOLS

    seen = [t.name for t in TOOLS if "on_conflict" in t.args]
    for t in TOOLS:
        if "on_conflict" in t.args:
            assert tuple(t.args["on_conflict"]["enum"]) == ON_CONFLICT, t.name
    assert "promote" in seen, seen
