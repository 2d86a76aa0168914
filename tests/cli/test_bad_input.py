"""Bad input, as a fault-and-attack run throws it (issue 20, "Bad input" 7-10): generated bad
values for every command's options (huge, negative, NaN and infinite numbers, empty strings,
control characters, bytes that are not UTF-8, unknown choices, bad durations and sizes,
missing arguments) and config files with wrong types, checked against the documented contract: one
line on stderr and no traceback, exit 2 for a usage error, under `--json` also
`{"error", "exit_code"}` on stdout, and nothing created. Then each item of the issue on its
own: a NaN stage timeout, `log -n` past SQLite, `--json -h`, the words of a missing
argument and of the duration hint, `log --op bogus` (and in tests/cluster/test_cluster.py, `race
--cluster` where no Ray head answers).

Real `petri` processes on a copy-backend workspace; the parsers and the config validation
also in-process (pure, milliseconds)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import units
from orchestrator.config import parse_config
from orchestrator.errors import ConfigError, UsageError
from tests.conftest import petri


def run_petri(ws: Path, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
    """petri with ``argv`` as bytes (a str holding surrogate escapes is the bytes it stood for)."""
    env = dict(os.environ)
    env.pop("PETRI_WORKSPACE", None)
    cp = subprocess.run([sys.executable, "-m", "orchestrator.cli", *[os.fsencode(a) for a in argv]], cwd=ws,
                        env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return cp.returncode, cp.stdout.decode("utf-8", "replace"), cp.stderr.decode("utf-8", "replace")


def made(ws: Path) -> tuple:
    """What a refused command must not have made: the registry's sandboxes, snapshots,
    promotions and runs, and the trees in the store."""
    db = sqlite3.connect(f"file:{ws / '.petri' / 'registry.db'}?mode=ro", uri=True)
    try:
        rows = tuple(tuple(r[0] for r in db.execute(f"SELECT id FROM {t} ORDER BY id"))  # noqa: S608 - ours
                     for t in ("sandboxes", "snapshots", "promotions"))
        runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        db.close()
    trees = tuple(sorted(p.name for d in ("sandboxes", "snapshots", "layers") if (ws / ".petri" / d).is_dir()
                         for p in (ws / ".petri" / d).iterdir()))
    return rows, runs, trees


def assert_one_line_error(argv: list[str], rc: int, out: str, err: str, code: int = 2) -> str:
    lines = err.splitlines()
    assert rc == code, (argv, rc, err[-500:])
    assert len(lines) == 1 and lines[0].startswith("petri: "), (argv, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    message = lines[0][len("petri: "):]
    if "--json" in argv:
        assert out.count("\n") == 1, (argv, out)
        doc = json.loads(out)
        assert doc["error"] == message and doc["exit_code"] == code and doc["schema"] == 1, (argv, doc)
    else:
        assert out == "", (argv, out)
    return message


# ---------------------------------------------------------------------------- a workspace to attack


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A copy-backend workspace with one sandbox (label "target") and a few audit rows."""
    w = tmp_path_factory.mktemp("bad-input") / "proj"
    w.mkdir()
    (w / "a.txt").write_text("one\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    r = petri("fork", "--label", "target", "--json", cwd=w)
    assert r.rc == 0, r
    try:
        yield w
    finally:
        petri("gc", cwd=w)
        petri("deinit", "--force", cwd=w)


@pytest.fixture(scope="module")
def target(ws):
    return petri("status", "target", "--json", cwd=ws).json["sandboxes"][0]["id"]


# ---------------------------------------------------------------------------- bad values, generated


def _refused(check):
    """A filter: values ``check`` refuses with a usage error (any other exception fails the test)."""
    def bad(value):
        try:
            check(value)
        except UsageError:
            return True
        return False
    return bad


NOT_UTF8 = st.binary(min_size=1, max_size=6).map(lambda b: b.decode("utf-8", "surrogateescape")).filter(
    lambda t: any(0xDC80 <= ord(c) <= 0xDCFF for c in t) and "\x00" not in t)
CONTROL = st.sampled_from(["\n", "\r", "\t", "\x1b[31m", "\x7f", "\x85", "\x01"])
WEIRD = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "-", "--", "nan", "inf", "-inf", "NaN", "1e400", "1e-400", "-1", "0", "-0",
                     "99999999999999999999999", "9223372036854775808", "1" * 500, "0x10", "1_000", "\u0663",
                     "+5", "1.5.5", "1h-30m", "1h 30m x", "5x", "P1D", "00:10:00", "1E", "-1G", "1 G B", ".",
                     "\u202e", "1s\n2s", "9" * 40 + "K"]),
    NOT_UTF8,
    st.tuples(st.text(max_size=4), CONTROL, st.text(max_size=4)).map("".join),
).filter(lambda t: "\x00" not in t)  # an argv word cannot hold one
BAD_DURATION = WEIRD.filter(_refused(units.parse_duration))
BAD_SIZE = WEIRD.filter(_refused(units.parse_size))
BAD_CPUS = st.one_of(WEIRD.filter(_refused(units.parse_cpus)),
                     st.integers(min_value=units.machine_cpus() + 1).map(str), st.just("0.001"))
BAD_INT = st.one_of(st.integers(min_value=1 << 63), st.integers(max_value=0),
                    st.sampled_from(["x", "", "1.5", "nan", "0x10", "1e3", " ", "--"])).map(str)
BAD_LABEL = st.one_of(st.text(min_size=65, max_size=90), st.sampled_from(["", "   ", "-x", "--json"]),
                      st.tuples(st.text(max_size=4), CONTROL).map("".join), NOT_UTF8).filter(lambda t: "\x00" not in t)
BAD_NOTE = st.one_of(st.tuples(st.text(max_size=4), CONTROL, st.text(max_size=4)).map("".join),
                     st.text(min_size=1001, max_size=1100)).filter(lambda t: "\x00" not in t)
BAD_ENV = st.one_of(st.text(max_size=10).filter(lambda t: "=" not in t or t.startswith("=")),
                    st.just("=x")).filter(lambda t: "\x00" not in t)


def bad_id(ws: Path):
    """Text that names no sandbox, snapshot or promotion of ``ws`` (a prefix of none, no label)."""
    rows, _, _ = made(ws)
    ids = [i for group in rows for i in group] + ["target"]
    return st.one_of(WEIRD, st.sampled_from(["sb-", "s-", "p-", "r-", "sb-zz", "target2", "../../etc"])).filter(
        lambda t: t != "--" and not any(i.startswith(t) for i in ids))  # "--": no argument at all


def choice_not(*choices: str):
    return WEIRD.filter(lambda t: t.strip().lower() not in choices and t.lstrip()[:1] != "-")


def bad_since():
    from orchestrator.api import _since
    return WEIRD.filter(_refused(_since))


def bad_cluster():
    from orchestrator.cluster.connect import parse_address
    return WEIRD.filter(_refused(parse_address))


def bad_op():
    from orchestrator.audit import OPS
    return WEIRD.filter(lambda t: t not in OPS and "\x00" not in t)


@st.composite
def bad_command(draw, ws: Path, sb: str) -> list[str]:
    """One command line with one bad part (the rest well-formed), as argv."""
    race = ["race", "--check", "true", "--cmd", "true"]
    cases = {
        "fork": lambda: draw(st.sampled_from([
            ["--ttl", draw(BAD_DURATION)], ["--mem", draw(BAD_SIZE)], ["--disk", draw(BAD_SIZE)],
            ["--cpus", draw(BAD_CPUS)], ["-n", draw(BAD_INT)], ["--pids", draw(BAD_INT)],
            ["--label", draw(BAD_LABEL)], ["--from", draw(bad_id(ws))]])),
        "race": lambda: draw(st.sampled_from([
            ["--ttl", draw(BAD_DURATION)], ["--timeout", draw(BAD_DURATION)], ["--mem", draw(BAD_SIZE)],
            ["--cpus", draw(BAD_CPUS)], ["--jobs", draw(BAD_INT)], ["--pids", draw(BAD_INT)],
            ["--seccomp", draw(choice_not("default", "strict", "off"))], ["--cluster", draw(bad_cluster())],
            ["--from", draw(bad_id(ws))], ["--patch", f"/nonexistent/{draw(st.text(max_size=5))}"]])),
        "run": lambda: draw(st.sampled_from([
            ["--timeout", draw(BAD_DURATION), sb, "--", "true"], ["-e", draw(BAD_ENV), sb, "--", "true"],
            ["--seccomp", draw(choice_not("default", "strict", "off")), sb, "--", "true"],
            [draw(bad_id(ws)), "--", "true"]])),
        "shell": lambda: draw(st.sampled_from([
            [sb, "--timeout", draw(BAD_DURATION)], ["-e", draw(BAD_ENV), sb],
            ["--seccomp", draw(choice_not("default", "strict", "off")), sb], [draw(bad_id(ws))]])),
        "tui": lambda: ["--race", draw(st.one_of(st.just(""), bad_id(ws)))],  # no race exists here
        "logs": lambda: draw(st.sampled_from([[draw(bad_id(ws))], [sb, "--run", draw(BAD_INT)]])),
        "status": lambda: [draw(bad_id(ws))],
        "lineage": lambda: [draw(bad_id(ws))],
        "rollback": lambda: [draw(bad_id(ws))],
        "diff": lambda: [draw(bad_id(ws))],
        "rm": lambda: [draw(bad_id(ws))],
        "promote": lambda: draw(st.sampled_from([
            [draw(bad_id(ws))], [sb, "--on-conflict", draw(choice_not("fail", "markers", "theirs", "ours"))],
            [sb, "--to", draw(WEIRD.filter(lambda t: "\x00" not in t))], ["--resume", draw(bad_id(ws))]])),
        "log": lambda: draw(st.sampled_from([
            ["--limit", draw(BAD_INT)], ["-n", draw(BAD_INT)], ["--op", draw(bad_op())],
            ["--since", draw(bad_since())]])),
        "stats": lambda: ["--since", draw(bad_since())],
        "gc": lambda: ["--keep-generations", draw(BAD_INT)],
        "snapshot": lambda: ["-m", draw(BAD_NOTE)],
        "init": lambda: ["--backend", draw(choice_not("auto", "btrfs", "zfs", "reflink", "overlay", "fuse", "copy"))],
        "help": lambda: [draw(WEIRD.filter(lambda t: t.strip() and "\x00" not in t and t[:1] != "-"))],
        "doctor": lambda: [draw(st.one_of(st.text(max_size=6), NOT_UTF8).map(lambda t: f"/nonexistent/{t}").filter(
            lambda t: "\x00" not in t))],
    }
    kind = draw(st.sampled_from([*cases, "missing", "unknown option", "reason", "workspace"]))
    if kind == "missing":
        argv = draw(st.sampled_from([["status"], ["rollback"], ["logs"], ["diff"], ["run"], race[:1] + ["--cmd",
                                     "true"], ["race", "--check", "true"]]))
    elif kind == "unknown option":
        argv = [draw(st.sampled_from(["fork", "ls", "status", "snapshot", "snapshots", "log", "gc", "promotions",
                                      "mcp", "tui", "shell", "deinit", "lineage", "stats", "diff", "logs",
                                      "doctor"])),
                draw(st.sampled_from(["--bogus-x", "-Z", "--json=1", "--all=yes"]))]
    elif kind == "reason":
        argv = ["--reason", draw(BAD_NOTE), draw(st.sampled_from(["fork", "snapshot", "gc"]))]
    elif kind == "workspace":  # an empty --workspace is a script's empty variable, not "the one here"
        argv = [draw(st.sampled_from(["--workspace", "--workspace="])), *draw(st.sampled_from([
            ["ls"], ["status", sb], ["fork"], ["tui"], ["mcp"], ["snapshot"], ["log"]]))]
        if argv[0] == "--workspace":
            argv.insert(1, draw(st.sampled_from(["", " "])))
    else:
        argv = (race[1:] if kind == "race" else []) + cases[kind]()
        argv = [kind, *argv]
    if draw(st.booleans()):  # first, or last (before `--` that would be the command's)
        argv.insert(0 if "--" in argv or draw(st.booleans()) else len(argv), "--json")
    return argv


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.filter_too_much])
@given(data=st.data())
def test_generated_bad_input_is_one_line_exit_2_and_makes_nothing(ws, target, data):
    argv = data.draw(bad_command(ws, target))
    before = made(ws)
    rc, out, err = run_petri(ws, argv)
    assert_one_line_error(argv, rc, out, err)
    assert made(ws) == before, (argv, "a refused command made something")


# ---------------------------------------------------------------------------- the parsers alone


@given(st.one_of(st.text(), NOT_UTF8, WEIRD))
def test_parsers_give_a_value_in_range_or_a_usage_error(text):
    for parse, low, high in ((units.parse_duration, 0, units.MAX_DURATION_S), (units.parse_size, 1, units.MAX_SIZE - 1),
                             (units.parse_cpus, 0, math.inf)):
        try:
            v = parse(text)
        except UsageError as e:
            assert "\n" not in str(e) and len(str(e)) < 400
            continue
        assert math.isfinite(v) and low < v <= high or v == low == 1, (parse.__name__, text, v)


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.integers(min_value=1 << 60),
                    st.booleans(), st.none(), st.text(max_size=3), st.just(10 ** 5000))


@given(NUMBERS)
def test_numbers_from_files_and_the_api_are_checked_like_flags(value):
    for check, high in ((units.check_seconds, units.MAX_DURATION_S), (units.check_bytes, units.MAX_SIZE - 1)):
        try:
            v = check(value)
        except UsageError as e:
            assert "\n" not in str(e) and len(str(e)) < 400
            continue
        assert not isinstance(value, bool) and math.isfinite(v) and 0 < v <= high, (check.__name__, value, v)


def test_the_duration_hint_names_every_form_it_takes():
    with pytest.raises(UsageError) as e:
        units.parse_duration("5x")
    hint = str(e.value)
    for form in ("500ms", "90s", "15m", "2h", "1h30m", "2w"):
        assert form in hint, (form, hint)
        assert units.parse_duration(form) > 0  # and the hint is true
    for unit in ("ms", "s", "m", "h", "d", "w"):
        assert f" {unit}," in hint or f" {unit} " in hint, (unit, hint)
    assert units.parse_duration("1h30m") == 5400 and units.parse_duration("90ms") == pytest.approx(0.09)
    assert units.parse_duration("2w") == 14 * 86400
    with pytest.raises(UsageError) as e:
        units.parse_size("5X")
    for form in ("K", "M", "G", "T", "P", "KiB"):
        assert form in str(e.value)
    assert units.parse_size("1KiB") == units.parse_size("1KB") == units.parse_size("1k") == 1024
    assert units.parse_size("1P") == 1 << 50


# ---------------------------------------------------------------------------- config files


KEYS = {  # a place in the file -> TOML that puts VALUE there
    "limits.mem": "[limits]\nmem = {v}\n", "limits.cpus": "[limits]\ncpus = {v}\n",
    "limits.pids": "[limits]\npids = {v}\n", "limits.disk": "[limits]\ndisk = {v}\n",
    "limits.ttl": "[limits]\nttl = {v}\n", "limits.net": "[limits]\nnet = {v}\n",
    "promotions.preimage_budget": "[promotions]\npreimage_budget = {v}\n",
    "kpi.fork_p95": "[kpi]\nfork_p95 = {v}\n", "kpi.race_success": "[kpi]\nrace_success = {v}\n",
    "stages[0].timeout": '[[stages]]\nname = "a"\ntarget = "fresh"\ntimeout = {v}\n',
    "stages[0].target": '[[stages]]\nname = "a"\ntarget = {v}\n',
    "stages[0].checks": '[[stages]]\nname = "a"\ntarget = "fresh"\nchecks = {v}\n',
    "stages[0].gate": '[[stages]]\nname = "a"\ntarget = "fresh"\ngate = {v}\n',
    "masks": "masks = {v}\n", "env.A": "[env]\nA = {v}\n", "seccomp": "seccomp = {v}\n",
    "sandbox_user": "sandbox_user = {v}\n", "allow_sockets": "allow_sockets = {v}\n",
    "toolchains": "toolchains = {v}\n", "limits": "limits = {v}\n", "stages": "stages = {v}\n",
}
TOML_VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "+nan", "0", "-1", "0.0", "true", "false", "99999999999999999999999",
                     "9223372036854775807", "1e300", "-1e300", "1e-300", "[]", "{}", "[1, 2]", '""', '" "',
                     '"\\u0000"', '"a\\u0000b"', '"\\n"', '"5x"', '"-1G"', '"nan"', '"inf"', '"1e400"', '"1h30m"',
                     '["\\u0000"]', '[""]', '["relative"]', "1979-05-27T07:32:00Z", '"~/../x"', "[[]]", '"root"']),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: "nan" if f != f else "inf" if f == math.inf else
                                                       "-inf" if f == -math.inf else repr(f)),
    st.integers().map(str),
    st.text(max_size=6).map(json.dumps),
)


@given(st.sampled_from(sorted(KEYS)), TOML_VALUES)
@settings(max_examples=400, deadline=None)
def test_a_config_file_is_valid_or_refused_in_one_line_naming_the_file_and_the_key(key, value):
    text = KEYS[key].format(v=value)
    path = Path("/etc/petri-test/config.toml")
    try:
        cfg = parse_config(text.encode(), path)
    except ConfigError as e:
        message = str(e)
        assert e.exit_code == 2 and "\n" not in message, message
        assert message.startswith(f"{path}: "), message
        if "not valid TOML" not in message:
            assert f"key '{key.split('.')[0].split('[')[0]}" in message, (key, message)
        return
    except Exception as e:  # noqa: BLE001 - the point: nothing but a ConfigError
        raise AssertionError(f"{key} = {value}: {type(e).__name__}: {e}") from e
    # accepted: every number in it means something
    for name in ("mem_bytes", "disk_bytes", "preimage_budget_bytes"):
        v = getattr(cfg, name)
        assert v is None or (type(v) is int and 0 < v < units.MAX_SIZE), (key, value, v)
    assert cfg.cpus is None or (math.isfinite(cfg.cpus) and cfg.cpus >= units.MIN_CPUS), (key, value)
    assert cfg.pids is None or (type(cfg.pids) is int and 1 <= cfg.pids <= 1 << 22), (key, value)
    assert cfg.ttl_s is None or units.MIN_TTL_S <= cfg.ttl_s <= units.MAX_DURATION_S, (key, value)
    assert cfg.net in (None, True, False)
    for st_ in cfg.stages:
        assert st_.timeout_s is None or 0 < st_.timeout_s <= units.MAX_DURATION_S, (key, value)
        assert all("\0" not in c and c.strip() for c in st_.checks) and "\0" not in st_.target
    for v in cfg.kpi.values():
        assert math.isfinite(v) and v >= 0, (key, value)
    assert all("\0" not in str(m) for m in (*cfg.masks, *cfg.allow_sockets, *cfg.toolchains))
    assert all("\0" not in k + v for k, v in cfg.env.items())


def test_a_limit_of_the_config_beyond_this_machine_names_the_file_and_the_key(tmp_path):
    from orchestrator.limits import Limits

    path = tmp_path / "config.toml"
    cfg = parse_config(f"[limits]\ncpus = {units.machine_cpus() + 1}\n".encode(), path)
    with pytest.raises(ConfigError) as e:
        cfg.apply_defaults(Limits())
    assert str(e.value).startswith(f"{path}: key 'limits.cpus' = ") and "CPUs this machine has" in str(e.value)
    assert cfg.apply_defaults(Limits(cpus=1)).cpus == 1  # a flag overrides it: then it is not used


def test_a_nan_stage_timeout_is_refused_at_load_and_promote_makes_nothing(ws, target):
    """Item 7: `timeout = nan` passed validation, then `promote --to` ended in "internal
    error: ExceptionGroup" (exit 1) with a pending promotion and a pinned fork left."""
    config = ws / ".petri" / "config.toml"
    config.write_text('[[stages]]\nname = "fresh"\ntarget = "fresh"\nchecks = ["true"]\ntimeout = nan\n')
    try:
        for argv in (["promote", target, "--to", "fresh"], ["--json", "promote", target, "--to", "fresh"]):
            before = made(ws)
            rc, out, err = run_petri(ws, argv)
            message = assert_one_line_error(argv, rc, out, err)
            assert message.startswith(f"{config}: key 'stages[0].timeout'") and "nan" in message, message
            assert made(ws) == before
    finally:
        config.unlink()


# ---------------------------------------------------------------------------- the CLI's words


def test_log_refuses_a_limit_past_sqlite_and_an_unknown_op(ws):
    """Item 8 and 9: `log -n 99999999999999999999999` was "internal error: OverflowError"
    (exit 1); `log --op bogus` an empty table with exit 0."""
    for argv in (["log", "-n", "99999999999999999999999"], ["log", "--json", "--limit", str(1 << 63)],
                 ["log", "-n", "0"]):
        rc, out, err = run_petri(ws, argv)
        assert "bad --limit" in assert_one_line_error(argv, rc, out, err)
    rc, out, err = run_petri(ws, ["log", "--op", "bogus"])
    message = assert_one_line_error(["log"], rc, out, err)
    assert "bad --op 'bogus'" in message and "fork" in message and "promote" in message
    rc, out, _ = run_petri(ws, ["log", "--json", "--op", "fork", "-n", str((1 << 63) - 1)])
    ops = [e["op"] for e in json.loads(out)["entries"]]
    assert rc == 0 and ops and set(ops) == {"fork"}, ops  # the fixture's fork, and refused ones if any ran
    rc, out, _ = run_petri(ws, ["log", "--json", "--op", "evolve"])  # known, none yet: not a typo
    assert rc == 0 and json.loads(out)["entries"] == []


def test_every_op_petri_writes_is_one_log_op_knows():
    """``audit.OPS`` is what `log --op` accepts without a row: every op a scope is opened with
    in the code must be in it."""
    import re

    from orchestrator.audit import OPS
    root = Path(__file__).resolve().parents[2]
    found = set()
    for path in [*root.glob("orchestrator/**/*.py"), *root.glob("petri/**/*.py"), *root.glob("tui/**/*.py")]:
        text = path.read_text()
        found |= set(re.findall(r'_audited\("(\w+)"\)', text))
        found |= set(re.findall(r'audit\.(?:operation|begin)\("(\w+)"', text))
    assert found and found <= OPS, found - OPS


def test_json_help_is_one_json_document(ws):
    """Item 9: `--json -h` printed the help text. A script that asked for JSON gets the help as
    one document: the text people read, and the same as fields."""
    for argv in (["--json", "-h"], ["--help", "--json"], ["--json", "fork", "-h"], ["fork", "--help", "--json"],
                 ["--json", "help", "race"], ["--json", "run", "-h"], ["status", "--json", "-h"]):
        rc, out, err = run_petri(ws, argv)
        assert rc == 0 and err == "", (argv, err)
        assert out.count("\n") == 1, (argv, out[:300])
        doc = json.loads(out)
        assert doc["schema"] == 1 and doc["command"].startswith("petri") and doc["usage"].startswith("petri")
        words = [w for w in argv if w not in ("--json", "-h", "--help", "help")]
        plain = run_petri(ws, [*words, "--help"])[1] if words != ["race"] else run_petri(ws, ["race", "--help"])[1]
        assert doc["help"].strip() == plain.strip(), argv
    doc = json.loads(run_petri(ws, ["--json", "fork", "-h"])[1])
    by_name = {o["names"][0]: o for o in doc["options"]}
    assert by_name["--ttl"]["takes_value"] and by_name["--net"]["takes_value"] is False
    assert by_name["-n"]["default"] == 1 and by_name["--from"]["default"] == "live"
    doc = json.loads(run_petri(ws, ["--json", "promote", "-h"])[1])
    assert {o["names"][0]: o for o in doc["options"]}["--on-conflict"]["choices"] == ["fail", "markers", "theirs",
                                                                                      "ours"]
    assert [a["name"] for a in doc["arguments"]] == ["SANDBOX", "PATHS"]
    root = json.loads(run_petri(ws, ["--json", "--help"])[1])
    assert {"fork", "race", "promote", "log"} <= {c["name"] for c in root["commands"]}


def test_a_missing_argument_says_what_to_give_and_the_usage(ws):
    """Item 9: `petri status` said only "Missing argument"."""
    for argv, words in ((["status"], ["SANDBOX", "sandbox id, prefix or label", "usage: petri status"]),
                        (["--json", "rollback"], ["IDENT", "s-…", "usage: petri rollback"]),
                        (["logs"], ["SANDBOX", "usage: petri logs"]),
                        (["status", "a", "b"], ["unexpected extra argument", "usage: petri status"]),
                        (["fork", "--bogus"], ["--bogus", "`petri fork --help`"])):
        rc, out, err = run_petri(ws, argv)
        message = assert_one_line_error(argv, rc, out, err)
        for w in words:
            assert w in message, (argv, w, message)


def test_an_error_inside_a_nursery_ends_as_itself():
    """trio wraps what a task raised in an ExceptionGroup: at the edge it is the error inside
    (its own line and exit code), not "internal error: ExceptionGroup"."""
    from orchestrator.cli.common import at_the_edge

    def ends(exc: BaseException) -> tuple[int, str]:
        def body():
            raise exc
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = at_the_edge([], lambda: "ls", body, read_only=True)
        return code, err.getvalue()

    code, err = ends(ExceptionGroup("x", [UsageError(detail="bad thing")]))
    assert (code, err) == (2, "petri: bad thing\n")
    code, err = ends(ExceptionGroup("x", [ExceptionGroup("y", [ConfigError(path="/c", detail="k")])]))
    assert (code, err) == (2, "petri: /c: k\n")
    code, err = ends(BaseExceptionGroup("x", [KeyboardInterrupt()]))
    assert (code, err) == (130, "petri: interrupted\n")
    code, err = ends(ExceptionGroup("x", [ValueError("v"), UsageError(detail="u")]))
    assert (code, err) == (2, "petri: u\n")
    code, err = ends(ExceptionGroup("x", [ValueError("v"), KeyError("k")]))
    assert code == 1 and err.startswith("petri: internal error: ExceptionGroup") and err.count("\n") == 1
