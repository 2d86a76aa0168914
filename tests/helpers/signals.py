"""A real ``petri`` in the background, signalled when its events say a point was reached,
and what must be left (nothing) after it settled."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.sandbox import cgroups
from tests.conftest import REPO, petri


def start_petri(args: list[str], cwd: Path) -> subprocess.Popen:
    """A real `petri` process in the background (SIGINT not ignored: tests send it one)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PETRI_WORKSPACE", None)
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def petri_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PETRI_WORKSPACE", None)
    return env


def start_signalled(args: list[str], cwd: Path, *, prefix: list[str] = ()) -> subprocess.Popen:
    """A real `petri` in the background, started with SIGINT ignored (a script's `petri ... &`)."""
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return subprocess.Popen([*prefix, sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=petri_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore_sigint)


def signal_when(proc: subprocess.Popen, ready, sig: int, what: str) -> tuple[str, str]:
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                # its stdout too: a shell's terminal (and what failed in it) goes there, not to stderr
                raise AssertionError(f"never saw {what}: rc={proc.returncode} stdout={out[-800:]!r} "
                                     f"stderr={err[-800:]!r}")
            time.sleep(0.005)
        proc.send_signal(sig)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def events_of(ws: Path) -> list[dict]:
    f = ws / ".petri" / "events.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines()] if f.exists() else []


def run_started(ws: Path, token: str, n: int = 1) -> bool:
    return sum(1 for e in events_of(ws) if e["event"] == "run.started" and token in " ".join(e.get("argv", []))) >= n


def command_running(argv0: bytes, token: str) -> bool:
    """Whether a process whose command line starts with ``argv0`` and holds ``token`` is alive:
    the sandboxed command itself, not its wrapper or bwrap (whose command lines hold the same
    words after their own): a signal sent before bwrap arms its parent-death signal and the
    command joins its cgroup meets a run still being set up, which is another case."""
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(argv0) and token.encode() in cmd:
            return True
    return False


def tree_bytes(root: Path) -> dict[str, bytes]:
    out = {}
    for dp, dns, fns in os.walk(root):
        rel = os.path.relpath(dp, root)
        if rel == ".":
            dns[:] = [d for d in dns if d != ".petri"]
        for f in fns:
            out[os.path.normpath(os.path.join(rel, f))] = Path(dp, f).read_bytes()
    return out


def nothing_left(ws: Path, live_before: list[str], token: str | None = None) -> None:
    """No sandbox but those there before, no mount under the workspace, no cgroup of any of
    its sandboxes, no process of the command."""
    rows = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    live = [s["id"] for s in rows if s["state"] in ("creating", "ready", "running", "exited")]
    assert live == live_before, rows
    assert not [s for s in rows if s["state"] == "creating"], rows
    on_disk = sorted(p.name for p in (ws / ".petri" / "sandboxes").iterdir()) if \
        (ws / ".petri" / "sandboxes").is_dir() else []
    assert on_disk == sorted(live_before), on_disk
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split()[4] for ln in f if str(ws) in ln.split()[4]]
    assert mounts == [], mounts
    ids = {s["id"] for s in rows}
    assert [str(d) for _, d in cgroups.list_cgroups("petri") if d.name in ids or d.parent.name in ids] == []
    if token:
        assert subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 1


def audit_row(ws: Path, op: str) -> dict:
    rows = [e for e in petri("log", "--json", cwd=ws).json["entries"] if e["op"] == op]
    assert rows, f"no audit row for {op}"
    return rows[-1]
