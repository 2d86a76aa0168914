"""Per-run views (orchestrator.sandbox.run_view) against other petris' views coming and going:
bwrap binds the host's ``/`` recursively and remounts each copied mount read-only, so a view
unmounted in between used to fail a run's setup (exit 125, "Can't bind mount /oldroot/...").
A real root-owned workspace (runs go through views), real bwrap, real mounts."""
from __future__ import annotations

import ctypes
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import api_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (views are root's) and bwrap")

VIEWS = Path("/run/petri")
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


N_RUNS = 40  # per sandbox; three sandboxes run at once, as a race's checks do


def beside_churn(work: list, name: str) -> int:
    """Run the threads' bodies ``work`` while three threads play other petris' runs (a view
    made, mounted, unmounted and its directory removed, again and again); how many views
    came and went meanwhile."""
    stop = threading.Event()
    churned = [0]
    errors: list[str] = []

    def churn(d: Path) -> None:
        try:
            while not stop.is_set():
                d.mkdir(parents=True)
                if libc.mount(b"churn", bytes(d), b"tmpfs", 0, None) or libc.umount2(bytes(d), 0):
                    errors.append(os.strerror(ctypes.get_errno()))
                    return
                d.rmdir()
                churned[0] += 1
        finally:
            libc.umount2(bytes(d), 2)  # MNT_DETACH
            if d.exists():
                d.rmdir()

    churners = [threading.Thread(target=churn, args=(VIEWS / "0" / f"{name}-{os.getpid()}-{i}",)) for i in range(3)]
    workers = [threading.Thread(target=w) for w in work]
    for t in churners + workers:
        t.start()
    try:
        for t in workers:
            t.join()
    finally:
        stop.set()
        for t in churners:
            t.join()
    assert not errors, errors
    return churned[0]


def test_views_coming_and_going_never_fail_a_run(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    with api_workspace(proj) as ws:
        with ws.fork(n=3) as sandboxes:
            first = sandboxes[0].run(["true"])  # makes /run/petri as petri keeps it
            assert first.exit_code == 0, first.to_json()
            assert first.to_json()["run_as"]["user"] != "root"  # runs go through views
            results: list = []

            def runs(sb) -> None:
                results.extend(sb.run(["true"]) for _ in range(N_RUNS))

            churned = beside_churn([lambda sb=sb: runs(sb) for sb in sandboxes], "churn")
            assert churned > N_RUNS  # the mounts really came and went while the runs started
            assert len(results) == 3 * N_RUNS
            bad = [(r.exit_code, r.to_json().get("setup_error")) for r in results if r.exit_code != 0]
            assert bad == [], bad[:2]



def test_views_coming_and_going_never_fail_a_shell(tmp_path):
    """``petri shell`` starts as a run does and met the same moved mount (a full run's shell
    exited 1 with bwrap's "Can't bind mount /oldroot/..."): it starts again too, and loses
    none of the user's input on the way (what was typed into a failed start is typed again)."""
    from tests.conftest import petri

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    assert petri("init", "--backend", "copy", cwd=proj).rc == 0
    ids = [s["id"] for s in petri("--json", "fork", "-n", "3", cwd=proj).json["sandboxes"]]
    assert petri("run", ids[0], "true", cwd=proj).rc == 0  # makes /run/petri as petri keeps it
    results: list = []

    def shells(sb: str) -> None:
        for i in range(N_SHELLS):
            results.append(petri("shell", sb, cwd=proj, input=f"cat a.txt; echo shell-{i}-ok; exit 3\n"))

    try:
        churned = beside_churn([lambda sb=sb: shells(sb) for sb in ids], "churn-sh")
    finally:
        petri("deinit", "--force", cwd=proj)
    assert churned > N_SHELLS  # the mounts really came and went while the shells started
    assert len(results) == 3 * N_SHELLS
    bad = [(r.rc, r.out) for r in results if r.rc != 3 or "a\n" not in r.out or "-ok" not in r.out]
    assert bad == [], bad[:2]


N_SHELLS = 8  # per sandbox, three at once


def test_a_view_made_during_a_run_never_reaches_its_sandbox(tmp_path):
    """/run/petri is a private mount: another run's view, mounted and removed while a
    sandbox runs, never propagates into it (it would land in the middle of a setup too)."""
    from orchestrator.sandbox.run_view import views_mount

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    with api_workspace(proj) as ws:
        with ws.fork(n=2) as (a, b):
            watch = (f"for i in $(seq 40); do grep -c '[.]{a.id}[.]' /proc/self/mountinfo; sleep 0.1; done; true")
            box: list = []
            watcher = threading.Thread(target=lambda: box.append(b.run(["sh", "-c", watch])))
            watcher.start()
            try:
                deadline = time.monotonic() + 20
                while not any(f".{b.id}." in p.name for p in VIEWS.glob("*/*")):
                    assert time.monotonic() < deadline, "the watcher's view never appeared"
                    time.sleep(0.05)
                time.sleep(0.5)
                runs = [a.run(["true"]) for _ in range(3)]  # views of a come and go meanwhile
                assert all(r.exit_code == 0 for r in runs)
            finally:
                watcher.join()
            (res,) = box
            counts = Path(res.to_json()["stdout_path"]).read_text().split()
            assert res.exit_code == 0 and len(counts) == 40 and set(counts) == {"0"}, counts
            with open("/proc/self/mountinfo", "rb") as f:
                assert views_mount(f.read()) == ()  # a mount of its own, in no peer group


FENCE = r"""
import os, subprocess, sys
sys.path.insert(0, REPO)
from orchestrator.sandbox import run_view
view = run_view.VIEWS / "0" / NAME
while os.path.ismount(run_view.VIEWS):  # this namespace's copy of the host's state: start plain
    subprocess.run(["umount", "-l", str(run_view.VIEWS)], check=True)
view.mkdir(parents=True)
subprocess.run(["mount", "-t", "tmpfs", "petri-test-view", str(view)], check=True)
(view / "inside").write_text("x")
fenced = run_view.fence_views()
with open("/proc/self/mountinfo", "rb") as f:
    info = f.read()
at_view = [ln for ln in info.splitlines() if ln.split()[4] == bytes(view)]
print(fenced, run_view.views_mount(info) == (), len(at_view), (view / "inside").exists())
subprocess.run(["umount", str(view)], check=True)
with open("/proc/self/mountinfo", "rb") as f:
    print(sum(1 for ln in f.read().splitlines() if ln.split()[4] == bytes(view)))
view.rmdir()
"""


def test_fencing_carries_the_views_already_there_and_leaves_no_shadowed_copy(tmp_path):
    """The first fence of a boot may find views already mounted in the plain directory
    (petris of an older version): they stay usable at their paths, and the originals the
    new mount shadows are gone (else they would pin their trees, unreachable). Done in a
    mount namespace of the test's own."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = tmp_path / "fence.py"
    script.write_text(FENCE.replace("REPO)", repr(str(REPO)) + ")", 1).replace("NAME", repr(f"fence-{os.getpid()}")))
    cp = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(script)],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["True", "True", "1", "True", "0"], cp.stdout
