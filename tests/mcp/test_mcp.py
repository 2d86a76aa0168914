"""``petri mcp`` with the MCP SDK's own client, over real stdio, on real workspaces: a btrfs
loop image (``init --convert``) and kernel overlayfs (root, a plain tmp dir). Real bwrap and
cgroups run the commands; git is the oracle for the patches.

One test speaks raw JSON-RPC instead of the SDK, to check every byte the server writes on
stdout, and to disconnect in the middle of runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.mcp_client import Raw, alive_with, client

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (cgroups, overlay, btrfs loop image) and bwrap")

anyio = pytest.importorskip("anyio")
mcp_types = pytest.importorskip("mcp_types")

DOC_TOOLS = {"workspace_status", "snapshot_create", "sandbox_fork", "sandbox_list", "sandbox_status", "sandbox_run",
              "sandbox_run_start", "sandbox_run_poll", "sandbox_run_kill", "sandbox_read_file", "sandbox_write_file",
              "sandbox_edit_file", "sandbox_diff", "race", "race_status", "sandbox_remove", "sandbox_list_files",
              "sandbox_grep", "sandbox_delete_file", "sandbox_move_file", "sandbox_service_start",
              "sandbox_service_list", "sandbox_service_stop", "sandbox_port", "try", "review", "reject"}
LIVE_TOOLS = {"promote", "rollback"}

FIX = """--- a/pkg/calc.py
+++ b/pkg/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def make_project(ws: Path) -> Path:
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "test_calc.py").write_text("from pkg.calc import add\nassert add(2, 3) == 5, add(2, 3)\n")
    (ws / ".gitignore").write_text("__pycache__/\n")
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    return ws


@contextlib.contextmanager
def workspace(root: Path, *init_args: str):
    ws = make_project(root / "proj")
    r = petri("init", "--json", *init_args, cwd=ws)
    assert r.rc == 0, r
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", "--yes", cwd=ws)


@pytest.fixture
def btrfs_ws(btrfs_dir):
    with workspace(btrfs_dir, "--convert") as ws:
        assert petri("ls", "--json", cwd=ws).rc == 0
        yield ws


@pytest.fixture
def overlay_ws(tmp_path):
    with workspace(tmp_path, "--backend", "overlay") as ws:
        yield ws


@pytest.fixture(params=["btrfs", "overlay"])
def any_ws(request):
    return request.getfixturevalue(f"{request.param}_ws")


# ---------------------------------------------------------------------------- an SDK client


def run(fn, *args):
    return anyio.run(fn, *args, backend="trio")


def cgroups_of(sb: str) -> list[str]:
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/petri/{sb}*")]


def wait_gone(marker: str, sb: str, timeout: float = 10.0) -> None:
    """Processes are reaped and cgroups removed right after the kill; allow the kernel a
    moment to finish tearing the namespace down."""
    deadline = time.monotonic() + timeout
    while (alive_with(marker) or cgroups_of(sb)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive_with(marker), alive_with(marker)
    assert not cgroups_of(sb), cgroups_of(sb)


def wait_armed(marker: str, timeout: float = 30.0) -> None:
    """Until the sandboxed ``sh -c "trap '' TERM; sleep 300; : MARKER"`` has started its
    ``sleep``: its trap is set from then on (a kill sent before would meet a shell that still
    takes SIGTERM: seen once under a full run's load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (p / "cmdline").read_bytes()
                if cmd.startswith(b"/bin/sh\0-c\0trap") and marker.encode() in cmd and \
                        (p / "task" / p.name / "children").read_text().split():
                    return
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"the command with {marker} never started its sleep")


# ---------------------------------------------------------------------------- tests


def test_tools_schemas_annotations_and_live_tools_only_with_the_flag(overlay_ws):
    async def main():
        async with client(overlay_ws) as c:
            tools = {t.name: t for t in (await c.s.list_tools()).tools}
            assert set(tools) == DOC_TOOLS  # promote and rollback are not even listed
            for t in tools.values():
                assert t.input_schema["type"] == "object" and t.output_schema["type"] == "object", t.name
                assert t.description and len(t.description) < 300, t.name
                assert t.annotations is not None and t.annotations.read_only_hint is not None, t.name
            assert tools["sandbox_run"].input_schema["required"] == ["sandbox"]
            assert tools["sandbox_run"].input_schema["properties"]["timeout_s"]["default"] == 120
            assert tools["sandbox_run"].input_schema["properties"]["max_output_bytes"]["default"] == 16384
            assert tools["sandbox_run_poll"].input_schema["properties"]["wait_s"]["maximum"] == 25
            assert {n for n, t in tools.items() if t.annotations.read_only_hint} == {
                "workspace_status", "sandbox_list", "sandbox_status", "sandbox_run_poll", "sandbox_read_file",
                "sandbox_diff", "race_status", "sandbox_list_files", "sandbox_grep", "sandbox_service_list", "review"}
            assert tools["sandbox_remove"].annotations.destructive_hint
            assert not tools["sandbox_fork"].annotations.destructive_hint
            # refused: a tool error naming the flag, nothing written
            err = await c.call("promote", {"sandbox": "x"}, error=True)
            assert "--allow-live" in err["error"] and err["exit_code"] == 2
            st = await c.call("workspace_status")
            assert st["via"] == "mcp" and st["client"] == "petri-tests" and st["allow_live"] is False
        async with client(overlay_ws, "--allow-live") as c:
            tools = {t.name: t for t in (await c.s.list_tools()).tools}
            assert set(tools) == DOC_TOOLS | LIVE_TOOLS
            assert tools["promote"].annotations.destructive_hint and not tools["promote"].annotations.read_only_hint

    run(main)


def test_a_session_fork_write_run_diff_race_promote_rollback(any_ws):
    ws = any_ws

    async def main():
        async with client(ws) as c:
            forked = await c.call("sandbox_fork", {"label": "try", "mem": "256M", "ttl": "1h"})
            sb = forked["sandboxes"][0]
            assert sb["label"] == "try" and sb["limits"]["mem_bytes"] == 256 << 20
            # a failing command is a normal result, with its output tails
            bad = await c.call("sandbox_run", {"sandbox": "try", "command": "python3 test_calc.py"})
            assert bad["exit_code"] == 1 and bad["killed_by"] is None and "AssertionError" in bad["stderr_tail"]
            assert bad["truncated"] == {"stdout": 0, "stderr": 0}
            # (a fix of another size: a same-size edit within the second would leave __pycache__ stale)
            fixed = "def add(a, b):\n    return a + b  # fixed\n"
            w = await c.call("sandbox_write_file", {"sandbox": "try", "path": "pkg/calc.py", "content": fixed})
            assert w["bytes_written"] == len(fixed)
            good = await c.call("sandbox_run", {"sandbox": "try", "argv": ["python3", "test_calc.py"]})
            assert good["exit_code"] == 0 and good["run"] == bad["run"] + 1
            # tails are capped and say how much was cut
            big = await c.call("sandbox_run", {"sandbox": "try", "command": "seq 1 20000", "max_output_bytes": 100})
            assert len(big["stdout_tail"]) == 100 and big["stdout_tail"].endswith("20000\n")
            assert big["truncated"]["stdout"] == len("".join(f"{i}\n" for i in range(1, 20001))) - 100
            edit = await c.call("sandbox_edit_file", {"sandbox": "try", "path": "test_calc.py", "old": "== 5",
                                                      "new": "== 5  # checked"})
            assert edit["replacements"] == 1
            got = await c.call("sandbox_read_file", {"sandbox": "try", "path": "test_calc.py"})
            assert "# checked" in got["content"] and got["encoding"] == "utf-8"
            # a symlink in the sandbox never leads a file tool outside it
            outside = ws.parent / "outside"
            outside.mkdir()
            (outside / "secret").write_text("host\n")
            os.symlink(outside, Path(sb["path"]) / "link")
            for tool, extra in (("sandbox_read_file", {}), ("sandbox_write_file", {"content": "pwned"}),
                                ("sandbox_edit_file", {"old": "host", "new": "pwned"})):
                for path in ("link/secret", "link/new", "link", "../outside/secret"):
                    err = await c.call(tool, {"sandbox": "try", "path": path, **extra}, error=True)
                    assert err["exit_code"] in (2, 3), err
            assert sorted(os.listdir(outside)) == ["secret"] and (outside / "secret").read_text() == "host\n"
            os.unlink(Path(sb["path"]) / "link")
            # the diff; git is the oracle
            d = await c.call("sandbox_diff", {"sandbox": "try"})
            assert sorted(f["path"] for f in d["files"]) == ["pkg/calc.py", "test_calc.py"]
            check = subprocess.run(["git", "apply", "--check", "-"], input=d["patch"].encode(), cwd=ws,
                                   capture_output=True)
            assert check.returncode == 0, check.stderr
            stat = await c.call("sandbox_diff", {"sandbox": "try", "stat_only": True, "paths": ["pkg/calc.py"]})
            assert stat["patch"] == "" and [f["path"] for f in stat["files"]] == ["pkg/calc.py"]
            # petri errors are tool errors with the CLI's line and exit code
            nf = await c.call("sandbox_status", {"sandbox": "sb-nope"}, error=True)
            assert nf["exit_code"] == 2 and "sb-nope" in nf["error"]
            assert nf["error"] == petri("status", "sb-nope", cwd=ws).err.strip()[len("petri: "):]
            bad_args = await c.call("sandbox_run", {"sandbox": "try", "command": "true", "timeout_s": "soon"},
                                    error=True)
            assert bad_args["exit_code"] == 2 and "timeout_s" in bad_args["error"]
            # race three candidates
            r = await c.call("race", {"check": "python3 test_calc.py", "wait_s": 25, "label": "best", "candidates": [
                {"cmd": "echo broken > pkg/calc.py"}, {"patch_text": FIX}, {"cmd": "true"}]})
            while not r["done"]:
                r = await c.call("race_status", {"race": r["race"], "wait_s": 25})
            by = {x["candidate"]: x for x in r["candidates"]}
            assert r["winner"] == by["patch_text#2"]["sandbox"] and by["patch_text#2"]["rank"] == 1
            assert r["winner_label"] == "best"  # the winner is reachable by that name
            assert (await c.call("sandbox_status", {"sandbox": "best"}))["sandboxes"][0]["id"] == r["winner"]
            assert by["echo broken > pkg/calc.py"]["exit_code"] != 0 and by["true"]["exit_code"] == 1
            listed = {s["id"] for s in (await c.call("sandbox_list"))["sandboxes"]}
            assert listed == {sb["id"], r["winner"]}  # losers removed, winner kept
            rm = await c.call("sandbox_remove", {"ids": [r["winner"]]})
            assert rm["removed"] == [r["winner"]]
            # without --allow-live the live tree cannot be touched
            await c.call("promote", {"sandbox": "try"}, error=True)
            assert "a - b" in (ws / "pkg" / "calc.py").read_text()
        async with client(ws, "--allow-live") as c:
            p = await c.call("promote", {"sandbox": "try"})
            assert sorted(p["applied"]) == ["pkg/calc.py", "test_calc.py"] and p["promotion"].startswith("p-")
            assert "a + b" in (ws / "pkg" / "calc.py").read_text()
            rb = await c.call("rollback", {"id": p["promotion"]})
            assert rb["kind"] == "promotion" and "a - b" in (ws / "pkg" / "calc.py").read_text()
            again = await c.call("rollback", {"id": p["promotion"]}, error=True)
            assert again["exit_code"] != 0

    run(main)


def test_long_command_through_start_and_poll_with_progress(btrfs_ws):
    """A 40 s command: started, polled (each poll waits up to 25 s for output and sends
    progress while it waits), its output read exactly once by cursor and in the order it was
    written, its exit code seen. Also a short blocking sandbox_run reports progress while it
    runs."""
    async def main():
        async with client(btrfs_ws) as c:
            sb = (await c.call("sandbox_fork"))["sandboxes"][0]["id"]
            progress = []

            async def on_progress(p, total, message):
                progress.append((p, message))

            short = await c.call("sandbox_run", {"sandbox": sb, "command": "sleep 5; echo slept"},
                                 progress_callback=on_progress)
            assert short["stdout_tail"] == "slept\n"
            assert len(progress) >= 1 and all(sb in m for _, m in progress)
            progress.clear()
            slow = "sleep 12; echo a; sleep 14; echo b >&2; sleep 14; echo done; exit 7"
            started = await c.call("sandbox_run_start", {"sandbox": sb, "command": slow})
            assert started == {"schema": 1, "sandbox": sb, "run": 2}
            cursor, lines, polls = 0, [], 0
            while True:
                got = await c.call("sandbox_run_poll", {"sandbox": sb, "run": 2, "cursor": cursor, "wait_s": 25},
                                   progress_callback=on_progress)
                polls += 1
                lines += [(e["stream"], e["text"]) for e in got["events"]]
                cursor = got["next_cursor"]
                if got["done"]:
                    break
            assert lines == [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "done\n")]
            # a poll returns at wait_s, at min_bytes (16 KiB by default) or at the end: not on the
            # first line (issue 20 #16), so two polls: at 25 s ("a") and at the end
            assert got["exit_code"] == 7 and got["killed_by"] is None and polls == 2
            # the polls waited 40 s in all: the heartbeat spoke during each wait
            assert len(progress) >= 6 and all("run 2" in m for _, m in progress)
            again = await c.call("sandbox_run_poll", {"sandbox": sb, "run": 2, "cursor": 0, "wait_s": 0})
            assert [e["text"] for e in again["events"]] == ["a\n", "b\n", "done\n"] and again["done"]

    run(main)


def test_a_poll_of_a_slow_command_waits_for_many_lines(overlay_ws):
    """A command printing a line a second: one poll with wait_s returns many lines, not the
    first one (issue 20 #16); min_bytes returns as soon as that much is there; a re-poll
    from an old cursor reads the same bytes again, from the log files."""
    async def main():
        async with client(overlay_ws) as c:
            sb = (await c.call("sandbox_fork"))["sandboxes"][0]["id"]
            cmd = "for i in 1 2 3 4 5 6; do echo line-$i; sleep 1; done; echo oops >&2"
            st = await c.call("sandbox_run_start", {"sandbox": sb, "command": cmd})
            t0 = time.monotonic()
            first = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "wait_s": 4})
            took = time.monotonic() - t0
            text = "".join(e["text"] for e in first["events"])
            assert 3.5 < took < 8 and not first["done"], (took, first)
            assert text.startswith("line-1\nline-2\nline-3\n") and text.count("\n") >= 3, text
            quick = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "wait_s": 25, "min_bytes": 1,
                                                      "cursor": first["next_cursor"]})
            assert quick["events"] and not quick["done"] and time.monotonic() - t0 < 8, quick
            rest = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "wait_s": 25,
                                                     "cursor": quick["next_cursor"]})
            assert rest["done"] and rest["exit_code"] == 0, rest
            everything = "".join(e["text"] for e in first["events"] + quick["events"] + rest["events"])
            assert everything == "".join(f"line-{i}\n" for i in range(1, 7)) + "oops\n"
            assert rest["events"][-1] == {"cursor": len(everything) - 5, "stream": "stderr", "text": "oops\n"}
            again = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "cursor": 7, "wait_s": 0})
            assert "".join(e["text"] for e in again["events"]) == everything[7:] and again["done"]

    run(main)


def test_polls_read_every_byte_of_a_big_output_in_order_while_it_runs(overlay_ws):
    """200k lines (1.3 MB) with pauses: the polls, each at most 64 KiB, read every byte of
    both streams once and in order while the run goes, then its end."""
    async def main():
        async with client(overlay_ws) as c:
            sb = (await c.call("sandbox_fork"))["sandboxes"][0]["id"]
            cmd = "seq 1 100000; sleep 1; echo err >&2; seq 100001 200000; sleep 1; echo done"
            st = await c.call("sandbox_run_start", {"sandbox": sb, "command": cmd})
            cursor, text, live = 0, {"stdout": "", "stderr": ""}, 0
            for _ in range(200):
                got = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "cursor": cursor,
                                                        "wait_s": 5})
                assert got["dropped"] == 0
                for e in got["events"]:
                    assert e["cursor"] == cursor  # contiguous: every byte once, in order
                    text[e["stream"]] += e["text"]
                    cursor += len(e["text"].encode())
                assert got["next_cursor"] == cursor
                live += bool(got["events"]) and not got["done"]
                if got["done"]:
                    break
            assert got["done"] and got["exit_code"] == 0 and live >= 2, (got, live)
            seq = subprocess.run(["seq", "1", "200000"], capture_output=True, text=True).stdout
            assert text == {"stdout": seq + "done\n", "stderr": "err\n"}

    run(main)


def test_cancelled_call_and_killed_run_leave_no_process_or_cgroup(btrfs_ws):
    async def main():
        async with client(btrfs_ws) as c:
            sb = (await c.call("sandbox_fork"))["sandboxes"][0]["id"]
            marker = f"mcp-cancel-{os.getpid()}"
            with anyio.move_on_after(3):  # the SDK sends notifications/cancelled
                await c.s.call_tool("sandbox_run", {"sandbox": sb, "command": f"sleep 300; : {marker}"})
            await anyio.to_thread.run_sync(wait_gone, marker, sb)
            runs = (await c.call("sandbox_status", {"sandbox": sb}))["sandboxes"][0]["runs"]
            # stopped on request, with its duration: not "petri itself failed" (125)
            assert (runs[-1]["exit_code"], runs[-1]["ended_by"], runs[-1]["killed_by"]) == (143, "killed", None)
            assert runs[-1]["finished_at"] and runs[-1]["duration_s"] > 2.5, runs[-1]
            # started, then killed (a command that ignores SIGTERM: SIGKILL after the grace period)
            marker2 = f"mcp-kill-{os.getpid()}"
            st = await c.call("sandbox_run_start", {"sandbox": sb,
                                                    "command": f"trap '' TERM; sleep 300; : {marker2}"})
            assert (await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "wait_s": 0}))["done"] is False
            await anyio.to_thread.run_sync(wait_armed, marker2)
            assert (await c.call("sandbox_run_kill", {"sandbox": sb, "run": st["run"]}))["killed"] is True
            await anyio.to_thread.run_sync(wait_gone, marker2, sb)
            end = await c.call("sandbox_run_poll", {"sandbox": sb, "run": st["run"], "wait_s": 0})
            assert end["done"] and end["killed"] and (end["exit_code"], end["ended_by"]) == (143, "killed"), end
            assert end["killed_by"] is None and end["duration_s"] > 1.5, end
            rec = (await c.call("sandbox_status", {"sandbox": sb}))["sandboxes"][0]["runs"][-1]
            assert (rec["exit_code"], rec["ended_by"]) == (143, "killed"), rec
            assert (await c.call("sandbox_run_kill", {"sandbox": sb, "run": st["run"]}))["killed"] is False
            # the server still serves
            assert (await c.call("sandbox_run", {"sandbox": sb, "command": "echo ok"}))["stdout_tail"] == "ok\n"

    run(main)


# ---------------------------------------------------------------------------- raw JSON-RPC


def test_stdout_is_only_json_rpc_and_a_disconnect_leaves_nothing(overlay_ws):
    raw = Raw(overlay_ws)
    try:
        raw.handshake()
        assert len(raw.answer(raw.send("tools/list"))["result"]["tools"]) == len(DOC_TOOLS)
        sb = raw.call("sandbox_fork", {})["structuredContent"]["sandboxes"][0]["id"]
        # a command that writes lots, binary garbage and on both streams; petri errors; bad input
        noisy = raw.call("sandbox_run", {"sandbox": sb, "command":
                                         "seq 1 5000; printf '\\377\\376bin\\n'; echo err >&2; exit 2"})
        assert noisy["structuredContent"]["exit_code"] == 2 and not noisy.get("isError")
        assert raw.call("sandbox_run", {"sandbox": sb, "command": "true", "bogus": 1})["isError"]
        assert raw.call("no_such_tool", {})["isError"]
        assert raw.call("sandbox_read_file", {"sandbox": sb, "path": "../../etc/passwd"})["isError"]
        bad = raw.answer(raw.send("tools/call", {"name": "sandbox_run"}))  # no arguments at all
        assert bad.get("result", {}).get("isError") or "error" in bad
        # now disconnect with a started run and a blocking run in flight
        marker = f"mcp-gone-{os.getpid()}"
        raw.call("sandbox_run_start", {"sandbox": sb, "command": f"sleep 300; : {marker}-a"})
        raw.send("tools/call", {"name": "sandbox_run", "arguments": {"sandbox": sb,
                                                                     "command": f"sleep 300; : {marker}-b"}})
        deadline = time.monotonic() + 10
        while len(alive_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(alive_with(marker)) >= 2
        raw.p.stdin.close()  # the client is gone
        raw.p.stdin = None
        rest, err = raw.p.communicate(timeout=30)
        assert raw.p.returncode == 0, err
        raw.raw += rest
        for line in raw.raw.split(b"\n"):
            if line:
                msg = json.loads(line)
                assert msg["jsonrpc"] == "2.0", line
        assert b"Traceback" not in err
        wait_gone(marker, sb)
    finally:
        if raw.p.poll() is None:
            raw.p.kill()
            raw.p.wait()


def test_sigterm_kills_the_runs_then_exits(overlay_ws):
    raw = Raw(overlay_ws)
    try:
        raw.handshake()
        sb = raw.call("sandbox_fork", {})["structuredContent"]["sandboxes"][0]["id"]
        marker = f"mcp-term-{os.getpid()}"
        raw.call("sandbox_run_start", {"sandbox": sb, "command": f"sleep 300; : {marker}"})
        deadline = time.monotonic() + 10
        while not alive_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive_with(marker)
        raw.p.terminate()  # the client's host stopping the server, stdin still open
        raw.p.wait(timeout=30)
        assert raw.p.returncode == 128 + 15
        wait_gone(marker, sb)
    finally:
        if raw.p.poll() is None:
            raw.p.kill()
            raw.p.wait()


def test_file_tools_run_options_and_error_words(any_ws):
    """Issue 20 (items 15, 17, 19) through a server: the file tools an agent reaches for,
    run's cwd and a duration for timeout_s, and errors whose words say what to do."""
    ws = any_ws

    async def main():
        async with client(ws) as c:
            sb = (await c.call("sandbox_fork", {"label": "files"}))["sandboxes"][0]
            tree = Path(sb["path"])
            top = await c.call("sandbox_list_files", {"sandbox": "files"})
            names = [e["path"] for e in top["entries"]]
            assert {"pkg", "test_calc.py", ".gitignore"} <= set(names) and ".petri" not in names
            py = await c.call("sandbox_list_files", {"sandbox": "files", "glob": "*.py"})
            assert [e["path"] for e in py["entries"]] == ["pkg/calc.py", "test_calc.py"]
            g = await c.call("sandbox_grep", {"sandbox": "files", "pattern": r"add\(", "glob": "*.py"})
            assert [(m["path"], m["line"]) for m in g["matches"]] == [("pkg/calc.py", 1), ("test_calc.py", 2)]
            part = await c.call("sandbox_read_file", {"sandbox": "files", "path": "test_calc.py", "start_line": 2,
                                                      "end_line": 2})
            assert part["content"] == "assert add(2, 3) == 5, add(2, 3)\n" and part["start_line"] == 2
            mv = await c.call("sandbox_move_file", {"sandbox": "files", "from": "pkg/calc.py", "to": "lib/calc.py"})
            assert mv["path"] == "lib/calc.py" and (tree / "lib" / "calc.py").is_file()
            rm = await c.call("sandbox_delete_file", {"sandbox": "files", "path": "pkg", "recursive": True})
            assert rm["kind"] == "dir" and not (tree / "pkg").exists()
            child = (await c.call("sandbox_fork", {"from": "files"}))["sandboxes"][0]  # from: a label works
            assert child["parent"] == sb["id"]
            await c.call("sandbox_remove", {"ids": [child["id"]]})
            # run: cwd below the root, and a timeout given as a duration
            (tree / "lib" / "sub").mkdir()
            r = await c.call("sandbox_run", {"sandbox": "files", "command": "pwd; ls", "cwd": "lib",
                                             "timeout_s": "10m"})
            assert r["exit_code"] == 0 and r["stdout_tail"] == f"{ws}/lib\ncalc.py\nsub\n"
            bad = await c.call("sandbox_run", {"sandbox": "files", "argv": ["true"], "cwd": "nope"}, error=True)
            assert bad["exit_code"] == 2 and bad["error"] == f"bad cwd: no nope in sandbox {sb['id']}"
            bad = await c.call("sandbox_run", {"sandbox": "files", "argv": ["true"], "timeout_s": "soon"}, error=True)
            assert bad["error"].startswith("timeout_s: bad duration 'soon'")
            # the words of the errors
            outside = ws.parent / "outside-files"
            outside.mkdir()
            (outside / "secret").write_text("host\n")
            os.symlink(outside, tree / "link")
            err = await c.call("sandbox_read_file", {"sandbox": "files", "path": "link/secret"}, error=True)
            assert err["exit_code"] == 2 and "conflict" not in err["error"]
            assert err["error"] == (f"link/secret: link is a symlink to {outside} (outside the sandbox); the file "
                                    "tools never follow a symlink")
            for tool, args in (("sandbox_list_files", {"path": "link"}), ("sandbox_grep", {"pattern": "host",
                                                                                           "path": "link"}),
                               ("sandbox_delete_file", {"path": "link/secret"}),
                               ("sandbox_move_file", {"from": "link/secret", "to": "stolen"})):
                err = await c.call(tool, {"sandbox": "files", **args}, error=True)
                assert "link is a symlink to" in err["error"], (tool, err)
            assert not (await c.call("sandbox_grep", {"sandbox": "files", "pattern": "host"}))["matches"]
            err = await c.call("sandbox_write_file", {"sandbox": "files", "path": ".petri/x", "content": "x"},
                               error=True)
            assert "petri's store" in err["error"] and ".petri-write" not in err["error"]
            assert sorted(os.listdir(outside)) == ["secret"] and (outside / "secret").read_text() == "host\n"

    run(main)
