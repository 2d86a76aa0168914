"""The demo project for races through the real CLI, its fixes, and a race workspace that
leaves no cgroup behind."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

from orchestrator.sandbox import cgroups
from tests.conftest import REPO, petri


FIXES = REPO / "demo" / "fixes"


def make_project(root: Path, git: bool = False, gitignore: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", str(REPO / "demo" / "sample_project.sh"), str(root)], check=True)
    if gitignore is not None:
        (root / ".gitignore").write_text(gitignore)
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "-A"], cwd=root, check=True)
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"],
                       cwd=root, check=True)
    return root


@contextlib.contextmanager
def race_workspace(w: Path) -> Iterator[Path]:
    """An initialised workspace for races: on the way out no cgroup of its sandboxes is
    left, and it is deinit'ed whatever happened."""
    try:
        yield w
        ids = [s["id"] for s in petri("ls", "--all", "--json", cwd=w).json["sandboxes"]]
        assert [str(d) for _, d in cgroups.list_cgroups("petri") if any(i in str(d) for i in ids)] == []
    finally:
        petri("deinit", "--force", cwd=w)
