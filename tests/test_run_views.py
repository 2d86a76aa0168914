"""Per-run views (orchestrator.sandbox.run_view) against other petris' views coming and going:
bwrap binds the host's ``/`` recursively and remounts each copied mount read-only, so a view
unmounted in between used to fail a run's setup (exit 125, "Can't bind mount /oldroot/...").
A real root-owned workspace (runs go through views), real bwrap, real mounts."""
from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.conftest import api_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (views are root's) and bwrap")

VIEWS = Path("/run/petri")
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


N_RUNS = 40  # per sandbox; three sandboxes run at once, as a race's checks do


def test_views_coming_and_going_never_fail_a_run(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    stop = threading.Event()
    churned = [0]
    errors: list[str] = []

    def churn(d: Path) -> None:
        """Another petri's runs: a view made, mounted, unmounted and its directory removed,
        again and again."""
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

    with api_workspace(proj) as ws:
        with ws.fork(n=3) as sandboxes:
            first = sandboxes[0].run(["true"])  # makes /run/petri as petri keeps it
            assert first.exit_code == 0, first.to_json()
            assert first.to_json()["run_as"]["user"] != "root"  # runs go through views
            results: list = []

            def runs(sb) -> None:
                results.extend(sb.run(["true"]) for _ in range(N_RUNS))

            churners = [threading.Thread(target=churn, args=(VIEWS / "0" / f"churn-{os.getpid()}-{i}",))
                        for i in range(3)]
            runners = [threading.Thread(target=runs, args=(sb,)) for sb in sandboxes]
            for t in churners + runners:
                t.start()
            try:
                for t in runners:
                    t.join()
            finally:
                stop.set()
                for t in churners:
                    t.join()
            assert not errors, errors
            assert churned[0] > N_RUNS  # the mounts really came and went while the runs started
            assert len(results) == 3 * N_RUNS
            bad = [(r.exit_code, r.to_json().get("setup_error")) for r in results if r.exit_code != 0]
            assert bad == [], bad[:2]
