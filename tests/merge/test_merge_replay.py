"""merge.replay: a clone of the base, given the change set of another clone, ends up holding
exactly what that clone holds (content, kind, mode, times, owner), never following a
symlink either side planted."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from merge.changes import scan_tree, tree_changes
from merge.replay import replay

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def write(root: Path, rel: str, data: bytes = b"x\n", mode: int = 0o644) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.chmod(p, mode)


def full_state(root: Path) -> dict:
    """Kind, mode, content and mtime of every path (directories included)."""
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = Path(dp, n)
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p), st.st_mtime_ns)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("p", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("f", stat.S_IMODE(st.st_mode), p.read_bytes(), st.st_mtime_ns, st.st_uid)
    return out


def test_replay_makes_the_clone_equal(tmp_path):
    base = tmp_path / "base"
    write(base, "keep.txt", b"same\n")
    write(base, "mod.txt", b"old\n")
    write(base, "gone.txt")
    write(base, "olddir/a.txt")
    write(base, "olddir/sub/b.txt")
    write(base, "dir_to_file/x")
    write(base, "file_to_dir", b"f\n")
    write(base, "link_to_file/y")
    os.symlink("keep.txt", base / "relink")
    write(base, ".git/HEAD", b"ref: refs/heads/main\n")
    src, dst = tmp_path / "src", tmp_path / "dst"
    shutil.copytree(base, src, symlinks=True)
    shutil.copytree(base, dst, symlinks=True)
    write(src, "mod.txt", b"new content\n", 0o755)
    os.unlink(src / "gone.txt")
    shutil.rmtree(src / "olddir")
    shutil.rmtree(src / "dir_to_file")
    write(src, "dir_to_file", b"now a file\n")
    os.unlink(src / "file_to_dir")
    write(src, "file_to_dir/inner.txt", b"inside\n")
    shutil.rmtree(src / "link_to_file")
    os.symlink("/etc", src / "link_to_file")  # a symlink out: copied as a symlink
    os.unlink(src / "relink")
    os.symlink("mod.txt", src / "relink")
    write(src, "new/deep/er.txt", b"deep\n", 0o600)
    os.chmod(src / "new" / "deep", 0o750)
    (src / "empty").mkdir()
    os.mkfifo(src / "pipe")
    write(src, ".git/HEAD", b"ref: refs/heads/fix\n")
    write(src, "__pycache__/m.pyc", b"\0")  # ignored or not: the check may need it
    os.utime(src / "mod.txt", ns=(1_000_000_000, 1_500_000_000_123))
    changes = tree_changes(base, src, include_ignored=True, detect_renames=False, exclude_top=())
    replay(changes, src, dst)
    assert full_state(dst) == full_state(src)
    assert scan_tree(dst, exclude_top=()) == scan_tree(src, exclude_top=())
    assert not Path("/etc/inner.txt").exists()


def test_replay_never_writes_through_a_symlink_in_the_clone(tmp_path):
    """A change set that names a path beneath what the clone holds as a symlink is refused,
    not followed out of the tree."""
    import pytest

    from merge.errors import PathThroughSymlink

    base, src, dst = tmp_path / "base", tmp_path / "src", tmp_path / "dst"
    outside = tmp_path / "outside"
    outside.mkdir()
    for t in (base, src, dst):
        t.mkdir()
    os.symlink(outside, dst / "d")
    write(src, "d/evil.txt", b"pwned\n")
    changes = tree_changes(base, src, include_ignored=True, detect_renames=False)
    with pytest.raises(PathThroughSymlink):
        replay([c for c in changes if c.path == b"d/evil.txt"], src, dst)
    assert list(outside.iterdir()) == []
