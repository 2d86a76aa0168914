"""``--on-conflict``'s choices as one enum (merge.on_conflict.OnConflictChoice, made from the
merge layer's list): the CLI's options take it (typer turns the choice into a member), and a
member is the string itself wherever it goes below. Pure: no workspace."""
from __future__ import annotations

import pytest

import typing

import click
import typer.main

from merge.on_conflict import ON_CONFLICT, OnConflictChoice

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def test_the_enum_is_the_list():
    assert tuple(m.value for m in OnConflictChoice) == ON_CONFLICT
    for name in ON_CONFLICT:  # a member is its string: compared, hashed, formatted, dumped
        m = OnConflictChoice(name)
        assert m == name and hash(m) == hash(name) and f"{m}" == name and str(m) == name
    import json
    assert json.dumps({"on_conflict": OnConflictChoice("markers")}) == '{"on_conflict": "markers"}'


def test_every_cli_option_takes_the_enum():
    import inspect

    from orchestrator.cli import merge as cli_merge
    from orchestrator.cli import try_ as cli_try

    for fn in (cli_merge.promote, cli_try.try_, cli_try.rebase):
        param = typing.get_type_hints(fn, include_extras=True)["on_conflict"]
        assert typing.get_args(param)[0] is OnConflictChoice, fn.__name__
        assert inspect.signature(fn).parameters["on_conflict"].default is OnConflictChoice("fail"), fn.__name__
    from orchestrator.cli.app import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="petri")
    for name in ("promote", "try", "rebase"):  # what click offers (and says when refusing) is the list
        cmd = group.get_command(root, name)
        opt = next(p for p in (cmd.params if cmd else ()) if p.name == "on_conflict")
        assert isinstance(opt.type, click.Choice) and tuple(opt.type.choices) == ON_CONFLICT, name
