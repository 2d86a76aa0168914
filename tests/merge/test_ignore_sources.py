"""Every source of ignore rules git has, against git itself: .gitignore files a tool writes
inside the sandbox (``.pytest_cache/.gitignore`` is ``*``), the workspace's
``.git/info/exclude``, git's ``core.excludesFile`` (set, or git's XDG default), and
directories whose every entry is ignored (a ``__pycache__`` under a ``*.pyc`` rule), which
git never shows and a promotion must never create."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from merge.changes import tree_changes
from merge.ignore import IgnoreRules, core_excludes_file
from merge.promote import plan_promotion


def write(root: Path, rel: str, data: bytes = b"x\n") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def git(cwd: Path, *args: str, home: Path) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LC_ALL": "C",
           "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=True).stdout


def git_untracked(tree: Path, home: Path) -> set[str]:
    """What `git status` lists as new or modified in ``tree`` (ignored files left out)."""
    out = git(tree, "status", "--porcelain=v1", "-z", "--untracked-files=all", home=home)
    return {e[3:] for e in out.split("\0") if e}


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for k in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(k)
    return h


def _workspace(root: Path, home: Path) -> Path:
    root.mkdir()
    git(root, "init", "-q", home=home)
    write(root, ".gitignore", b"*.pyc\n")  # not __pycache__/: its directory is left to the rule below
    write(root, "pkg/__init__.py", b"")
    write(root, "pkg/mod.py", b"x = 1\n")
    write(root, "tests/test_mod.py", b"def test_x():\n    assert True\n")
    git(root, "add", "-A", home=home)
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base", home=home)
    write(root, ".git/info/exclude", b"local.env\n")
    return root


def _tool_outputs(tree: Path) -> None:
    """What running tests and an editor leave in a sandbox, besides the real change."""
    write(tree, ".pytest_cache/.gitignore", b"# Created by pytest automatically.\n*\n")
    write(tree, ".pytest_cache/CACHEDIR.TAG", b"Signature: 8a477f597d28d172789f06886806bc55\n")
    write(tree, ".pytest_cache/v/cache/nodeids", b"[]\n")
    write(tree, "pkg/__pycache__/mod.cpython-311.pyc", b"\0\0pyc")
    write(tree, "tests/__pycache__/test_mod.cpython-311-pytest-8.pyc", b"\0\0pyc")
    write(tree, "local.env", b"TOKEN=1\n")
    write(tree, "pkg/.mod.py.swp", b"vim swap\n")
    write(tree, "pkg/mod.py.orig", b"x = 1\n")


@pytest.mark.parametrize("excludes", ["config", "xdg-default", "home-default"])
def test_change_set_leaves_out_what_git_ignores(tmp_path, home, excludes, monkeypatch):
    live = _workspace(tmp_path / "live", home)
    if excludes == "config":
        write(tmp_path, "global-ignore", b"*.swp\n*.orig\n")
        git(live, "config", "core.excludesFile", str(tmp_path / "global-ignore"), home=home)
    elif excludes == "xdg-default":
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
        write(tmp_path, "xdg/git/ignore", b"*.swp\n*.orig\n")
    else:
        write(home, ".config/git/ignore", b"*.swp\n*.orig\n")
    base = tmp_path / "base"
    shutil.copytree(live, base, symlinks=True)
    sb = tmp_path / "sb"
    shutil.copytree(live, sb, symlinks=True)
    _tool_outputs(sb)
    write(sb, "pkg/mod.py", b"x = 2\n")
    write(sb, "pkg/new.py", b"y = 1\n")

    got = {c.path.decode() for c in tree_changes(base, sb, ignore_root=live)}
    env_git = os.environ.get("XDG_CONFIG_HOME")
    if env_git:  # the oracle's git reads the same XDG file
        out = subprocess.run(["git", "-c", "safe.directory=*", "status", "--porcelain=v1", "-z",
                              "--untracked-files=all"], cwd=sb, capture_output=True, text=True, check=True,
                             env={"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": env_git,
                                  "GIT_CONFIG_NOSYSTEM": "1"}).stdout
        oracle = {e[3:] for e in out.split("\0") if e}
    else:
        oracle = git_untracked(sb, home)
    assert oracle == {"pkg/mod.py", "pkg/new.py"}  # the oracle itself: git ignores all the rest
    assert got == oracle
    # and a promotion plans exactly those, with no directory to make
    plan = plan_promotion(base, live, sb)
    assert sorted((o.action, o.path.decode()) for o in plan.ops) == [("put", "pkg/mod.py"), ("put", "pkg/new.py")]


def test_sandbox_gitignore_cannot_hide_changes_to_files_the_base_has(tmp_path, home):
    live = _workspace(tmp_path / "live", home)
    shutil.rmtree(live / ".git")  # no index to say what is tracked: the base decides
    base = tmp_path / "base"
    shutil.copytree(live, base)
    sb = tmp_path / "sb"
    shutil.copytree(live, sb)
    write(sb, "pkg/.gitignore", b"*\n")  # the workspace has none in pkg/
    write(sb, "pkg/mod.py", b"x = 2\n")
    write(sb, "pkg/brand_new.py", b"hidden\n")
    got = {c.path.decode() for c in tree_changes(base, sb, ignore_root=live)}
    assert got == {"pkg/mod.py"}
    # the workspace's own .gitignore is never overridden by the sandbox's copy
    write(sb, ".gitignore", b"*\n")
    write(sb, "top_new.py", b"1\n")
    got = {c.path.decode() for c in tree_changes(base, sb, ignore_root=live)}
    assert got == {".gitignore", "pkg/mod.py", "top_new.py"}


def test_directory_of_only_ignored_files_is_neither_created_nor_removed(tmp_path, home):
    live = _workspace(tmp_path / "live", home)
    write(live, "pkg/__pycache__/old.cpython-311.pyc", b"\0")
    base = tmp_path / "base"
    shutil.copytree(live, base)
    sb = tmp_path / "sb"
    shutil.copytree(live, sb)
    shutil.rmtree(sb / "pkg" / "__pycache__")  # the sandbox cleaned it
    write(sb, "tests/__pycache__/t.pyc", b"\0")  # and made another
    (sb / "emptied").mkdir()  # a really empty new directory is the sandbox's to make
    got = {c.path.decode(): c.status for c in tree_changes(base, sb, ignore_root=live)}
    assert got == {"emptied": "added"}
    # git agrees that nothing but that (which it cannot show) changed
    assert git_untracked(sb, home) == set()


def test_core_excludes_file_of_another_owner_is_read_from_their_home(tmp_path, home, monkeypatch,
                                                                      unprivileged_user):
    import pwd

    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, unprivileged_user.uid, unprivileged_user.gid)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "roots-xdg"))  # root's, not the owner's
    want = os.path.join(pwd.getpwuid(unprivileged_user.uid).pw_dir, ".config", "git", "ignore")
    assert core_excludes_file(ws) == os.fsencode(want)
    # root's own workspace: root's environment, as git would read it
    mine = tmp_path / "mine"
    mine.mkdir()
    assert core_excludes_file(mine) == os.fsencode(str(tmp_path / "roots-xdg" / "git" / "ignore"))


def test_symlinked_sandbox_gitignore_is_not_read(tmp_path, home):
    live = _workspace(tmp_path / "live", home)
    sb = tmp_path / "sb"
    shutil.copytree(live, sb)
    write(tmp_path, "evil", b"*\n")
    (sb / "pkg" / ".gitignore").symlink_to(tmp_path / "evil")
    write(sb, "pkg/new.py", b"1\n")
    rules = IgnoreRules(live, sandbox=sb)
    assert not rules.path_ignored(b"pkg/new.py", False)


# ---------------------------------------------------------------------------- end to end


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(), reason="needs root (cgroups) and bwrap")
def test_cli_diff_and_promote_agree_with_git_after_real_tools_ran(tmp_path, home):
    """pytest and python run in a sandbox; `petri diff`, `promote --dry-run` and `promote`
    carry what `git status` in the sandbox shows, and nothing else."""
    from tests.conftest import petri, project_venv

    live = _workspace(tmp_path / "live", home)
    write(tmp_path, "global-ignore", b"*.swp\n")
    git(live, "config", "core.excludesFile", str(tmp_path / "global-ignore"), home=home)
    # The project's own venv runs pytest (this checkout's may sit under the host's /tmp,
    # which no sandbox sees); git ignores it through the workspace's exclude file.
    py = project_venv(live)
    write(live, ".git/info/exclude", b"local.env\n.venv/\n")
    assert petri("init", "--backend", "copy", cwd=live).rc == 0
    try:
        sb = petri("fork", "--json", cwd=live).json["sandboxes"][0]
        cmd = (f"{py} -m pytest -q tests && /usr/bin/python3 -c 'import pkg.mod' "
               "&& echo 'x = 2' > pkg/mod.py && echo TOKEN=1 > local.env && echo swap > pkg/.mod.py.swp")
        r = petri("run", sb["id"], "--", "/bin/sh", "-c", cmd, cwd=live)
        assert r.rc == 0, r
        tree = Path(sb["path"])
        assert (tree / ".pytest_cache" / ".gitignore").exists() and (tree / "pkg" / "__pycache__").is_dir()
        oracle = git_untracked(tree, home)
        assert oracle == {"pkg/mod.py"}
        diff = petri("diff", "--json", sb["id"], cwd=live).json
        assert {f["path"] for f in diff["files"]} == oracle
        dry = petri("promote", "--dry-run", "--json", sb["id"], cwd=live).json
        assert [(op["action"], op["path"]) for op in dry["plan"]["ops"]] == [("put", "pkg/mod.py")]
        r = petri("promote", "--json", sb["id"], cwd=live)
        assert r.rc == 0 and r.json["applied"] == ["pkg/mod.py"], r
        status = git(live, "status", "--porcelain=v1", "--ignored", "--untracked-files=all", home=home)
        changed = [ln for ln in status.splitlines() if not ln.startswith(("!! .petri/", "!! .venv/"))]
        assert changed == [" M pkg/mod.py"], status
        assert not (live / "pkg" / "__pycache__").exists() and not (live / ".pytest_cache").exists()
    finally:
        petri("deinit", "--force", cwd=live)
