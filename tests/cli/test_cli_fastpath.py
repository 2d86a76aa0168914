"""The hot commands' fast path (``orchestrator.cli.fastpath``) against typer, the CLI's
definition: its table is what the typer app's declarations generate now; whatever argv it
accepts, typer accepts with the same values (and the same global flags); well-formed argv
of the hot commands is accepted (so the path is used at all); and what it hands over ends
exactly as through typer alone. In-process: typer's commands get a recorder in place of
the function (``gen_fastpath.recording``), so nothing runs."""
from __future__ import annotations

import contextlib
import functools
import io
import subprocess
import sys

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import fastpath, gen_fastpath, main
from orchestrator.cli import app as cli_app
from orchestrator.cli._fastpath_table import COMMANDS
from orchestrator.cli.common import G
from snapshot.errors import PetriError

HOT = gen_fastpath.HOT


@pytest.fixture(autouse=True)
def fresh_globals():
    before = dict(vars(G))
    yield
    vars(G).clear()
    vars(G).update(before)


def reset() -> None:
    vars(G).clear()


def test_the_committed_table_is_what_the_declarations_generate():
    assert gen_fastpath.TABLE.read_text() == gen_fastpath.generate(), \
        "stale: run python -m orchestrator.cli.gen_fastpath"
    assert tuple(COMMANDS) == HOT


def test_the_generator_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    stale = tmp_path / "table.py"
    stale.write_text(gen_fastpath.TABLE.read_text().replace("'--net'", "'--network'"))
    monkeypatch.setattr(gen_fastpath, "TABLE", stale)
    assert gen_fastpath.main(["--check"]) == 1
    stale.write_text(gen_fastpath.generate())
    assert gen_fastpath.main(["--check"]) == 0


def test_the_generator_refuses_what_the_fast_path_cannot_read():
    """``port``'s argument is an integer, which the table has only for options: a hot command
    with one must not be generated as if it were a string."""
    with pytest.raises(gen_fastpath.Unsupported):
        gen_fastpath.describe("port")
    # nor `try`'s command line, where the first word ends the options (allow_interspersed_args)
    with pytest.raises(gen_fastpath.Unsupported):
        gen_fastpath.describe("try")


# ------------------------------------------------------------------- typer's reading


SEEN: dict = {}  # what the recorders of recorded_group() were called with, for the last argv


@functools.cache
def recorded_group() -> click.Group:
    """The typer app's click group, each hot command's function replaced by a recorder into
    SEEN. Built once: typer builds the whole group again for each command it is asked for
    (26 hot commands: 0.13 s of every example, most of these tests' time); click makes a new
    context for every call, so one group serves every argv."""
    group = cli_app.root_group()
    for name in HOT:
        group.commands[name] = gen_fastpath.recorded_command(name, SEEN)
    return group


def typer_reads(raw: list[str]) -> tuple[str, dict, dict, str]:
    """How the typer app reads ``raw``: ("called", what the function got, G, stdout) or
    ("refused", {}, G, stdout)."""
    reset()
    group = recorded_group()
    SEEN.clear()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            args = cli_app._normalise(raw, group)
            group.main(args=args, prog_name="petri", standalone_mode=False)
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, PetriError):
        return "refused", {}, dict(vars(G)), out.getvalue()
    return ("called" if SEEN else "refused"), dict(SEEN), dict(vars(G)), out.getvalue()


def fast_reads(raw: list[str]) -> tuple[fastpath.Call | None, dict]:
    reset()
    call = fastpath.parse(raw)
    return call, dict(vars(G))


def ends(entry, raw: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``entry(raw)`` in this process."""
    reset()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = entry(list(raw))
    return code, out.getvalue(), err.getvalue()


def check_agreement(raw: list[str]) -> fastpath.Call | None:
    call, g_fast = fast_reads(raw)
    how, seen, g_typer, printed = typer_reads(raw)
    if call is None:
        if how == "refused":  # handed over and refused while parsing (nothing runs): as typer alone
            assert ends(main, raw) == ends(cli_app.main, raw), raw
        return None
    if call.name == "--version":
        assert how == "refused" and printed.startswith(("petri ", '{"schema"')), (raw, how, printed)
        assert g_fast == g_typer, raw
        return call
    assert how == "called", (raw, "the fast path accepted what typer refuses")
    command = seen.pop("__command__")
    assert command == call.function.__name__, raw
    assert seen == call.kwargs, raw
    assert g_fast == g_typer, raw
    return call


# ------------------------------------------------------------------- argv strategies

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=6)
WORDS = st.one_of(TEXT, st.sampled_from(["-", "--", "-x", "--json", "--debug", "-h", "--help", "--bogus", "x=y",
                                         "-1", "3", "live", "sb-1", "--version", "--workspace", "--reason"]))
INTS = st.one_of(st.integers(-5, 99).map(str), st.sampled_from(["x", "", " 4", "1_0", "+2", "٣", "2.0", "0x1"]))


def globals_() -> st.SearchStrategy[list[str]]:
    value = st.sampled_from(["/w", "", "why", "--json"])
    return st.one_of(st.just(["--json"]), st.just(["--debug"]),
                     st.tuples(st.sampled_from(["--workspace", "--reason"]), value).map(list),
                     st.tuples(st.sampled_from(["--workspace=", "--reason="]), value).map(lambda t: [t[0] + t[1]]))


def option_words(name: str, wellformed: bool) -> st.SearchStrategy[list[str]]:
    """One option of ``name`` as argv words (well-formed, or anything)."""
    opts = COMMANDS[name]["options"]
    strategies = []
    for opt, (_, kind, _) in opts.items():
        if kind == "flag":
            strategies.append(st.just([opt]))
            if not wellformed:
                strategies.append(TEXT.map(lambda v, o=opt: [f"{o}={v}"]))
            continue
        choices = COMMANDS[name].get("choices", {}).get(opts[opt][0])
        values = st.integers(0, 99).map(str) if kind == "int" and wellformed else INTS if kind == "int" else \
            st.sampled_from(choices) if choices and wellformed else \
            st.one_of(st.sampled_from(choices), TEXT, WORDS) if choices else \
            TEXT.filter(lambda v: not v.startswith("-")) if wellformed else st.one_of(TEXT, WORDS)
        strategies.append(values.map(lambda v, o=opt: [o, v]))
        if opt.startswith("--") or not wellformed:
            strategies.append(values.map(lambda v, o=opt: [f"{o}={v}"]))
        if not opt.startswith("--") and not wellformed:  # click's -n3
            strategies.append(values.map(lambda v, o=opt: [f"{o}{v}"]))
    if not wellformed:
        strategies.append(WORDS.map(lambda w: [w]))
    return st.one_of(*strategies) if strategies else st.nothing()


POSITIONAL = TEXT.filter(lambda v: not v.startswith("-"))


@st.composite
def argv(draw, wellformed: bool) -> list[str]:
    # never another real command: typer would run it (only the hot ones have recorders)
    other = WORDS.filter(lambda w: w not in cli_app.COMMANDS and w != "help")
    name = draw(st.sampled_from(HOT) if wellformed else st.one_of(st.sampled_from(HOT), other))
    spec = COMMANDS.get(name)
    pre = draw(st.lists(globals_(), max_size=2))
    words: list[list[str]] = []
    if spec is not None and spec["options"]:
        words += draw(st.lists(option_words(name, wellformed), max_size=4))
    words += draw(st.lists(globals_(), max_size=2))
    if not wellformed:
        words += draw(st.lists(WORDS.map(lambda w: [w]), max_size=3))
    order = draw(st.permutations(words)) if words else []
    flat = [w for group in pre for w in group] + [name] + [w for group in order for w in group]
    if spec is None:
        return flat
    args = [a for a in spec["arguments"]]
    if spec["trailing"]:  # run: options, the sandbox, then any command at all
        flat.append(draw(POSITIONAL))
        dashes = draw(st.booleans())
        if dashes:
            flat.append("--")
        command = draw(st.lists(st.one_of(TEXT, WORDS), min_size=1 if wellformed else 0, max_size=4))
        if wellformed and not dashes:  # an option-like first word needs `--` (typer: unknown option)
            command[0] = draw(POSITIONAL)
        return flat + command
    for _, nargs in args:
        count = 1 if nargs == 1 else draw(st.integers(0, 1 if wellformed and nargs == 0 else 3))
        for _ in range(count):
            flat.insert(draw(st.integers(flat.index(name) + 1, len(flat))) if not wellformed else len(flat),
                        draw(POSITIONAL))
    if draw(st.booleans()) and not wellformed:
        flat.append("--")
        flat += draw(st.lists(TEXT, max_size=2))
    return flat


FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(argv(wellformed=False))
def test_what_the_fast_path_accepts_typer_reads_the_same(raw):
    check_agreement(raw)


@FAST
@given(argv(wellformed=True))
def test_well_formed_hot_commands_take_the_fast_path(raw):
    call = check_agreement(raw)
    assert call is not None, raw


@pytest.mark.parametrize("raw", [
    ["fork"], ["--json", "fork", "-n", "3", "--from", "s-1", "--net"], ["fork", "--label=--x", "--pids", "7"],
    ["ls"], ["ls", "-a", "--json"], ["ls", "--all"], ["status", "sb-1"], ["--debug", "status", "x", "--json"],
    ["rm"], ["rm", "a", "b", "--all"], ["rm", "--", "-a"], ["run", "SB", "ls", "-la"], ["run", "SB", "--", "ls"],
    ["run", "-e", "A=1", "--env", "B=2", "SB", "--timeout", "5s", "make", "--json"], ["run", "--json", "SB", "true"],
    ["mcp"], ["mcp", "--allow-live"], ["--version"], ["--version", "--json"], ["--workspace", "/w", "--version"],
    ["init"], ["init", "proj", "--backend", "copy"], ["promote", "sb-1", "--json"], ["promote", "--to", "prod"],
    ["promote", "sb-1", "--on-conflict=markers", "--", "a", "b"], ["gc"], ["deinit", "--force"], ["diff", "sb-1"],
])
def test_the_common_shapes_take_the_fast_path(raw):
    assert check_agreement(raw) is not None


@pytest.mark.parametrize("raw", [
    [], ["--help"], ["fork", "--help"], ["fork", "-h"], ["fork", "-n", "x"], ["fork", "-n3"], ["fork", "--net=1"],
    ["fork", "--label"], ["fork", "--bogus"], ["status"], ["status", "a", "b"], ["ls", "-ab"], ["run"],
    ["run", "SB", "--bogus", "ls"], ["--version", "fork"], ["promote", "x", "--on-conflict", "Ours"], ["forks"],
    ["init", "--backend", "nope"], ["init", "a", "b"], ["tui"],
])
def test_anything_else_goes_to_typer(raw):
    call, _ = fast_reads(raw)
    assert call is None


@pytest.mark.parametrize("raw", [
    ["fork", "-n", "x"], ["fork", "--bogus"], ["status"], ["status", "a", "b"], ["--json", "rm", "--all=1"],
    ["run", "SB", "--bogus", "ls"], ["run"], ["ls", "-ab"], ["forks"],
])
def test_what_it_hands_over_ends_as_through_typer_alone(raw, capsys):
    """Same stdout, stderr and exit code as the typer app given the same argv (these are
    refused while parsing, so nothing runs)."""
    reset()
    code = main(list(raw))
    got = capsys.readouterr()
    reset()
    want_code = cli_app.main(list(raw))
    want = capsys.readouterr()
    assert (code, got.out, got.err) == (want_code, want.out, want.err)
    assert code == 2 and got.err.startswith("petri: ")


def test_hot_commands_load_no_typer_or_click(tmp_path):
    """Through a real process: the fast path imports neither (the ~20 ms it exists for),
    and typer still serves what it hands over."""
    code = ("import sys\n"
            "from orchestrator.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            "print('LOADED', sorted(m for m in ('typer', 'click') if m in sys.modules), file=sys.stderr)\n"
            "sys.exit(rc)\n")

    def loaded(*args: str) -> tuple[int, str]:
        cp = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True)
        return cp.returncode, cp.stderr.splitlines()[-1]

    # not a workspace: each command gets as far as opening one (exit 4), through the fast path
    for args in (["fork"], ["ls", "--json"], ["status", "x"], ["rm", "x"], ["run", "x", "true"], ["mcp"],
                 ["deinit", "--force"], ["gc"], ["snapshot"], ["snapshots"], ["rollback", "x"], ["diff", "x"],
                 ["promotions"], ["review", "x"], ["reject", "x", "--reason", "r"], ["logs", "x"], ["stop", "x", "web"],
                 ["race", "--cmd", "true", "--check", "true"], ["log"], ["stats"], ["promote", "x"],
                 ["promote", "x", "--on-conflict", "ours", "--", "a"], ["lineage"], ["rebase", "x"],
                 ["services", "x"]):
        assert loaded(*args) == (4, "LOADED []"), args
    assert loaded("--version") == (0, "LOADED []")
    (tmp_path / "w").mkdir()
    assert loaded("init", str(tmp_path / "w"), "--backend", "copy") == (0, "LOADED []")
    assert loaded("fork", "--help") == (0, "LOADED ['click', 'typer']")
