"""The Python API (``import petri``) on real workspaces: real bwrap, cgroups, git as the
oracle for patches, the CLI's own --json as the oracle for records."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

import petri
from tests.conftest import petri as petri_cli
from tests.helpers import api_project
from tests.helpers.api_project import FIX, needs_sandbox

ws = api_project.ws  # the copy-backend workspace fixture (tests/helpers/api_project.py)


def test_init_open_snapshot_and_records_match_the_cli(ws):
    assert ws.init_result is not None and ws.init_result.backend == "copy"
    assert ws.init_result.to_json()["schema"] == 1
    again = petri.open(ws.root / "pkg")  # found by walking up, like git
    assert again.root == ws.root
    snap = ws.snapshot("before")
    assert snap.id.startswith("s-") and snap.message == "before"
    ids = [s.id for s in ws.snapshots()]
    assert snap.id in ids
    cli = petri_cli("snapshots", "--json", cwd=ws.root).json
    assert [s["id"] for s in cli["snapshots"]] == ids
    api_doc = ws.snapshot_list().to_json()
    for a, b in zip(api_doc["snapshots"], cli["snapshots"], strict=True):
        assert {k: v for k, v in a.items()} == b


@needs_sandbox
def test_fork_with_block_run_diff_promote_rollback(ws):
    with ws.fork(n=2, label="try", limits=petri.Limits(mem="256M", pids=64, ttl="1h")) as sbs:
        assert [s.label for s in sbs] == ["try-1", "try-2"]
        assert sbs[0].limits["mem_bytes"] == 256 << 20 and sbs[0].limits["ttl_s"] == 3600
        bad = sbs[0].run(["python3", "test_calc.py"])
        assert bad.exit_code == 1 and bad.killed_by is None  # a failing command is a result
        assert "AssertionError" in bad.stderr()
        # (a fix of another size: a same-size edit in the same second would leave __pycache__ stale)
        fixed = sbs[0].run("sed -i 's/a - b/a + b  # fixed/' pkg/calc.py && python3 test_calc.py && echo ok")
        assert fixed.exit_code == 0 and fixed.stdout().strip() == "ok"
        d = sbs[0].diff()
        assert [f.path for f in d.files] == ["pkg/calc.py"] and d.files[0].status == "modified"
        assert d.files[0].lines_added == 1 and d.files[0].lines_removed == 1
        # git is the oracle: the patch applies to the base
        check = subprocess.run(["git", "apply", "--check", "-"], input=d.patch_bytes, cwd=ws.root, capture_output=True)
        assert check.returncode == 0, check.stderr
        p = sbs[0].promote()
        assert p.promotion and p.applied == ["pkg/calc.py"]
        assert "a + b" in (ws.root / "pkg" / "calc.py").read_text()
        assert any(pr.id == p.promotion and pr.state == "done" for pr in ws.promotions())
        rb = p.rollback()
        assert rb.kind == "promotion" and "a - b" in (ws.root / "pkg" / "calc.py").read_text()
        sbs[1].keep()
    states = {s.id: s.state for s in ws.sandboxes(all=True)}
    assert states[sbs[0].id] == "destroyed" and states[sbs[1].id] == "ready"


@needs_sandbox
def test_records_to_json_are_the_cli_documents(ws):
    sb = ws.fork(label="same").keep()[0]
    r = sb.run(["sh", "-c", "echo hi; exit 3"])
    assert r.exit_code == 3
    cli_status = petri_cli("status", "--json", "same", cwd=ws.root).json
    api_status = ws.status("same").to_json()
    a, c = api_status["sandboxes"][0], cli_status["sandboxes"][0]
    assert set(a) == set(c)
    for k in ("id", "label", "state", "base", "path", "limits", "last_exit_code", "runs"):
        assert a[k] == c[k], k
    cli_diff = petri_cli("diff", "--json", "same", cwd=ws.root).json
    assert sb.diff().to_json() == cli_diff


@needs_sandbox
def test_conflict_raises_and_writes_nothing_markers_carry_the_result(ws):
    sb = ws.fork().keep()[0]
    Path(sb.path, "notes.txt").write_text("one\nTWO-sandbox\nthree\n")
    (ws.root / "notes.txt").write_text("one\nTWO-live\nthree\n")
    with pytest.raises(petri.Conflict) as ei:
        sb.promote()
    assert ei.value.exit_code == 3
    assert (ws.root / "notes.txt").read_text() == "one\nTWO-live\nthree\n"
    with pytest.raises(petri.MarkersWritten) as mi:
        sb.promote(on_conflict="markers")
    assert mi.value.exit_code == 5 and mi.value.result.promotion
    assert "<<<<<<<" in (ws.root / "notes.txt").read_text()
    mi.value.result.rollback()
    assert (ws.root / "notes.txt").read_text() == "one\nTWO-live\nthree\n"


def test_errors_carry_exit_codes(ws, tmp_path):
    with pytest.raises(petri.NotFound) as e1:
        ws.sandbox("sb-nope")
    assert e1.value.exit_code == 2
    with pytest.raises(petri.UsageError):
        petri.Limits(mem="lots")
    with pytest.raises(petri.Unsupported) as e2:
        ws.fork(limits=petri.Limits(disk="10M"))  # copy backend: no real disk cap
    assert e2.value.exit_code == 4
    assert ws.sandboxes() == []  # nothing was made
    with pytest.raises(petri.Unsupported) as e3:
        petri.open(tmp_path)  # not a workspace
    assert e3.value.exit_code == 4


@needs_sandbox
def test_race_with_patch_text_and_commands(ws):
    race = ws.race("python3 test_calc.py", [petri.Cmd("echo broken > pkg/calc.py"),
                                             petri.Patch(text=FIX, name="fix"),
                                             petri.Cmd("true")])
    by = {c.candidate: c for c in race.candidates}
    assert race.winner == by["fix"].sandbox and by["fix"].rank == 1
    assert by["fix"].applied and by["fix"].exit_code == 0
    assert by["echo broken > pkg/calc.py"].exit_code != 0 and by["true"].exit_code == 1, race.to_json()
    assert race.to_json()["winner"] == race.winner
    kept = {s.id for s in ws.sandboxes()}
    assert kept == {race.winner}


@needs_sandbox
def test_one_workspace_from_several_threads(ws):
    sbs = ws.fork(n=3).keep()
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            r = sbs[i].run(["sh", "-c", f"sleep 1; echo {i} > out.txt; exit {i}"])
            results[i] = r.exit_code
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == {0: 0, 1: 1, 2: 2}
    for i, sb in enumerate(sbs):
        assert Path(sb.path, "out.txt").read_text() == f"{i}\n"


@needs_sandbox
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_aio_runs_and_cancelling_kills_the_run(ws, backend):
    import anyio

    import petri.aio as pa

    marker = f"petri-aio-{backend}-{os.getpid()}"

    async def main() -> None:
        aws = await pa.open(ws.root)
        sbs = await aws.fork(n=1)
        async with sbs:
            r = await sbs[0].run(["sh", "-c", "echo async"])
            assert r.exit_code == 0 and r.stdout() == "async\n"
            with anyio.move_on_after(3):
                await sbs[0].run(["sh", "-c", f"sleep 60; : {marker}"])
            raise_if_alive(marker)
            runs = await sbs[0].logs()
            # stopped on request: 143 (SIGTERM's), ended_by "killed", its duration; not 125 (petri failed)
            end = runs[-1].to_json()
            assert (end["exit_code"], end["ended_by"], end["killed_by"]) == (143, "killed", None), end
            assert 2.5 < end["duration_s"] < 10, end
            # a command that ignores SIGTERM: killed after the grace period, reported the same
            with anyio.move_on_after(3):
                await sbs[0].run(["sh", "-c", f"trap '' TERM; sleep 60; : {marker}"])
            raise_if_alive(marker)
            end = (await sbs[0].logs())[-1].to_json()
            assert (end["exit_code"], end["ended_by"]) == (143, "killed") and 4.5 < end["duration_s"] < 12, end
            state = (await aws.sandbox(sbs[0].info.id)).info.state
            assert state == "exited", state  # not left "running"
        assert (await aws.sandboxes()) == []
        cancelled = [e for e in petri_cli("log", "--json", cwd=ws.root).json["entries"] if e["op"] == "run"][-1]
        assert (cancelled["exit_code"], cancelled["result"]) == (143, "cancelled"), cancelled

    anyio.run(main, backend=backend)


def raise_if_alive(marker: str) -> None:
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and b"python" not in cmd:
            raise AssertionError(f"process {p.name} of the cancelled run is alive: {cmd!r}")


@needs_sandbox
def test_events_read_back(ws):
    sb = ws.fork().keep()[0]
    sb.run(["true"])
    names = [e.event for e in ws.events()]
    assert "sandbox.created" in names and "run.started" in names and "run.finished" in names
    assert all(e.to_json()["schema"] == 1 for e in ws.events())


@needs_sandbox
def test_failed_fork_of_n_removes_the_clones_it_made(tmp_path):
    """A fork(n) that fails part-way (the filesystem fills up) leaves no clone behind."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], check=True)
    try:
        proj = mnt / "proj"
        proj.mkdir()
        (proj / "blob").write_bytes(os.urandom(3 << 20))
        w = petri.init(proj, backend="copy")
        with pytest.raises(petri.PetriError):
            w.fork(n=3, source=w.snapshots()[0].id)
        assert all(s.state == "failed" for s in w.sandboxes(all=True))
        assert not any((proj / ".petri" / "sandboxes").glob("*/tree/blob"))
        w.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_file_tools_read_write_edit_and_never_follow_a_symlink_out(ws, tmp_path):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    got = ws.read_file(sb, "notes.txt")
    assert got.encoding == "utf-8" and got.content == "one\ntwo\nthree\n" and not got.truncated
    assert ws.read_file(sb, "notes.txt", max_bytes=4).truncated
    w = ws.write_file(sb, "new/dir/f.bin", b"\xff\x00x")
    assert w.bytes_written == 3 and (tree / "new/dir/f.bin").read_bytes() == b"\xff\x00x"
    assert ws.read_file(sb, "new/dir/f.bin").encoding == "base64"
    os.chmod(tree / "notes.txt", 0o640)
    e = ws.edit_file(sb, "notes.txt", "two", "TWO")
    assert e.replacements == 1 and (tree / "notes.txt").read_text() == "one\nTWO\nthree\n"
    assert (tree / "notes.txt").stat().st_mode & 0o777 == 0o640  # mode kept
    with pytest.raises(petri.UsageError):
        ws.edit_file(sb, "notes.txt", "absent", "x")
    assert ws.read_file(sb, "notes.txt", base=True).content == "one\ntwo\nthree\n"  # the base is untouched
    # attacks: a symlink to a host directory and one to a host file
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    os.symlink(outside, tree / "link")
    os.symlink(outside / "secret", tree / "leaf")
    for bad in ("link/secret", "leaf", "../outside/secret", "/etc/passwd"):
        with pytest.raises(petri.PetriError):
            ws.read_file(sb, bad)
    for bad in ("link/planted", "leaf"):
        with pytest.raises(petri.PetriError):
            ws.write_file(sb, bad, "x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "host secret\n"
