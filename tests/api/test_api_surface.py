"""What a user of ``import petri`` reads: signatures ``help()`` and completion can show,
docstrings on every record, attributes for what the JSON has, types a type checker sees
(``py.typed`` in the wheel), text paths on a ``Conflict``, and error messages that name the
API's parameters (the CLI's flags only when the CLI calls)."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import petri
import petri.aio
from tests.conftest import api_workspace, petri as petri_cli

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("cls", [petri.Sandbox, petri.aio.Sandbox], ids=["sync", "aio"])
@pytest.mark.parametrize("meth", ["run", "diff", "promote", "fork"])
def test_sandbox_methods_take_named_typed_documented_keywords(cls, meth):
    sig = inspect.signature(getattr(cls, meth))
    assert not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()), sig
    assert all(p.annotation is not inspect.Parameter.empty for n, p in sig.parameters.items() if n != "self"), sig
    assert (getattr(cls, meth).__doc__ or "").strip(), meth
    # the same options as the Workspace method it stands for (less the sandbox; fork less its source)
    ws_cls = petri.Workspace if cls is petri.Sandbox else petri.aio.Workspace
    ws_sig = inspect.signature(getattr(ws_cls, meth))
    want = [n for n in ws_sig.parameters if n not in ("self", "sandbox", "source")]
    if cls is petri.Sandbox and meth != "diff":
        want.append("reason")  # added by the audit wrapper of the sync Workspace method
    assert sorted(n for n in sig.parameters if n != "self") == sorted(set(want)), (meth, sig, ws_sig)


def test_help_shows_the_options_of_run():
    import pydoc

    text = pydoc.render_doc(petri.Sandbox.run, renderer=pydoc.plaintext)
    for name in ("timeout", "env", "cwd", "stdin", "on_output"):
        assert name in text


# ---------------------------------------------------------------------------- records


def test_every_record_has_a_docstring_of_its_own():
    for name in petri.__all__:
        obj = getattr(petri, name)
        if isinstance(obj, type) and issubclass(obj, petri.Record) and obj is not petri.Record:
            doc = obj.__dict__.get("__doc__") or ""
            assert doc.strip() and not doc.startswith(f"{name}("), name  # not dataclass's generated signature


def test_a_run_record_has_the_json_fields_as_attributes():
    doc = {"id": "sb-1", "run": 2, "argv": ["true"], "exit_code": 137, "duration_s": 0.5, "killed_by": None,
           "ended_by": "destroyed", "limits_hit": [], "stdout_path": None, "stderr_path": None,
           "peak_memory_bytes": None, "started_at": "2025-01-01T00:00:00Z", "finished_at": "2025-01-01T00:00:01Z",
           "pid": 7}
    r = petri.RunResult.from_doc(doc)
    assert r.ended_by == "destroyed" and r.argv == ["true"] and r.finished_at == "2025-01-01T00:00:01Z"
    assert r.to_json() == {"schema": 1, **doc}  # the document is unchanged


# ---------------------------------------------------------------------------- types


def test_the_wheel_ships_py_typed(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and ("Could not find a version" in r.stderr or "connection" in r.stderr.lower()):
        pytest.skip(f"pip cannot fetch the build backend here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    wheel, = tmp_path.glob("petridish-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # petri's own marker, and those of the packages its types come from
    assert {"petri/py.typed", "orchestrator/py.typed", "snapshot/py.typed", "merge/py.typed"} <= names


@pytest.mark.skipif(__import__("importlib").util.find_spec("mypy") is None, reason="mypy is not installed")
def test_a_type_checker_sees_the_types_of_the_api(tmp_path):
    snippet = tmp_path / "use_petri.py"
    snippet.write_text(
        "import petri\n"
        "ws = petri.open('.')\n"
        "sets = ws.fork()\n"
        "reveal_type(sets)\n"
        "reveal_type(sets[0].fork())\n"
        "reveal_type(sets[0].fork(3))\n"
        "reveal_type(sets[0].run(['true']).ended_by)\n"
        "sets[0].run(['true'], timout=3)\n")  # a misspelt option is caught
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                        "--ignore-missing-imports", str(snippet)], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout
    assert 'Revealed type is "orchestrator.api.sandbox.SandboxSet"' in out, out
    assert 'Revealed type is "orchestrator.api.sandbox.Sandbox"' in out, out
    assert 'Revealed type is "orchestrator.api.sandbox.Sandbox | orchestrator.api.sandbox.SandboxSet"' in out, out
    assert 'Revealed type is "str | None"' in out or 'Revealed type is "builtins.str | None"' in out, out
    assert 'Unexpected keyword argument "timout"' in out, out


# ---------------------------------------------------------------------------- fork: n=1


def test_workspace_fork_is_always_a_set_and_sandbox_fork_of_one_is_the_sandbox(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "f").write_text("x\n")
    with api_workspace(tmp_path / "p") as ws:
        with ws.fork() as one:
            assert isinstance(one, petri.SandboxSet) and len(one) == 1  # as the documented `sandboxes[0]` wants
            child = one[0].fork()
            assert isinstance(child, petri.Sandbox) and child.parent == one[0].id and child.generation == 1
            kids = one[0].fork(2)
            assert isinstance(kids, petri.SandboxSet) and len(kids) == 2
            assert "Always a ``SandboxSet``" in (petri.Workspace.fork.__doc__ or "")
            assert "For ``n=1`` the new ``Sandbox`` itself" in (petri.Sandbox.fork.__doc__ or "")
            ws.remove(child, *kids)


# ---------------------------------------------------------------------------- Conflict.conflicts


def test_a_conflict_lists_text_paths_with_the_exact_bytes_beside(tmp_path):
    proj = tmp_path / "p"
    proj.mkdir()
    odd = os.fsdecode(b"caf\xe9.txt")
    (proj / "notes.txt").write_text("one\ntwo\n")
    (proj / odd).write_text("a\n")
    with api_workspace(proj) as ws:
        sb = ws.fork().keep()[0]
        ws.write_file(sb, "notes.txt", "one\nTWO\n")
        ws.write_file(sb, b"caf\xe9.txt", "b\n")
        (proj / "notes.txt").write_text("one\nzwei\n")
        (proj / odd).write_text("c\n")
        with pytest.raises(petri.Conflict) as e:
            sb.promote()
        rows = {c.path: c for c in e.value.conflicts}
        assert set(rows) == {"notes.txt", "caf\\xe9.txt"}
        assert all(isinstance(c, petri.PathConflict) and c.reason for c in rows.values())
        assert rows["caf\\xe9.txt"].path_bytes == b"caf\xe9.txt" and rows["notes.txt"].path_bytes == b"notes.txt"
        row = rows["notes.txt"].to_json()  # what the CLI and MCP print: the merge layer's row, unchanged
        assert row["path"] == "notes.txt" and "schema" not in row and row["resolution"] == "failed"
        assert rows["caf\\xe9.txt"].to_json()["path_b64"] == "Y2Fm6S50eHQ="
        cli = petri_cli("promote", sb.id, "--json", cwd=proj)
        assert cli.rc == 3 and {c["path"] for c in cli.json["conflicts"]} == set(rows)
        assert all("schema" not in c for c in cli.json["conflicts"])


# ---------------------------------------------------------------------------- error words


def test_api_errors_name_the_api_parameters_and_the_cli_keeps_its_flags(tmp_path):
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "f").write_text("x\n")
    with api_workspace(proj) as ws:
        with pytest.raises(petri.UsageError) as e:
            ws.fork(n=0)
        assert str(e.value) == "n must be at least 1, not 0"
        with pytest.raises(petri.UsageError, match="^bad label: empty$"):
            ws.fork(label=" ")
        with pytest.raises(petri.UsageError, match="^bad label '-x': must not start with '-'$"):
            ws.fork(label="-x")
        with pytest.raises(petri.UsageError, match="^bad message '.*': control characters"):
            ws.snapshot("a\x1bb")
        with pytest.raises(petri.UsageError, match="^bad reason '.*': control characters"):
            ws.snapshot("ok", reason="a\x07")
        with pytest.raises(petri.UsageError, match="^bad since '2025-01-01T00:00:00': give a time zone"):
            ws.log(since="2025-01-01T00:00:00")
        with pytest.raises(petri.UsageError, match="^remove needs ids, all=True or expired=True$"):
            ws.remove()
        assert "-n" not in str(e.value) and "--" not in str(e.value)
        cli = petri_cli("fork", "-n", "0", cwd=proj)
        assert cli.rc == 2 and cli.err.strip() == "petri: -n must be at least 1, not 0"
        cli = petri_cli("fork", "--label", "a\x1bb", cwd=proj)
        assert cli.rc == 2 and "bad --label" in cli.err
