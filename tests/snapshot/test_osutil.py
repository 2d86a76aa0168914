"""snapshot/osutil.py, the shared OS plumbing: on real mounts (tmpfs as root), real renames,
real read-only trees."""
from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

from snapshot import osutil as O
from snapshot.conformance import mounted_under

SAMPLE = (b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
          b"90 22 0:50 /sub /srv/a\\040b\\011c\\012d\\134e rw,nosuid master:3 shared:4 - xfs /dev/x rw,prjquota\n"
          b"91 22 0:51 / /srv/caf\xc3\xa9 ro - tmpfs none rw,size=1k\n"
          b"not a mountinfo line\n")


def test_parse_mountinfo_undoes_escapes_and_skips_optional_fields():
    root, odd, cafe = O.parse_mountinfo(SAMPLE)
    assert root.mountpoint == b"/" and root.fstype == "ext4" and root.source == "/dev/sda1"
    assert odd.mountpoint == b"/srv/a b\tc\nd\\e" and odd.root == b"/sub"
    assert (odd.mount_id, odd.parent_id, odd.major, odd.minor) == (90, 22, 0, 50)
    assert odd.options == {"rw", "nosuid"} and odd.super_options == {"rw", "prjquota"}
    assert "prjquota" in odd.all_options and odd.fstype == "xfs"
    assert cafe.mountpoint == "/srv/café".encode() and cafe.options == {"ro"}


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting tmpfs needs root")


@pytest.fixture
def odd_mount(tmp_path):
    """A tmpfs at a mount point whose name mountinfo has to escape (and is not ASCII)."""
    mp = tmp_path / "wé s\tx\\y"
    mp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "petri-test", str(mp)], check=True)
    try:
        yield mp
    finally:
        subprocess.run(["umount", "-l", str(mp)], check=False)


@root_only
def test_a_mount_with_an_odd_name_is_found(odd_mount, tmp_path):
    (odd_mount / "d").mkdir()
    m = O.mount_of(odd_mount / "d")
    assert m.mountpoint == os.fsencode(odd_mount) and m.fstype == "tmpfs" and m.source == "petri-test"
    assert [x.mountpoint for x in O.mounts_under(tmp_path)] == [os.fsencode(odd_mount)]
    assert O.fs_type(odd_mount) == "tmpfs"
    # The conformance checker's "nothing left mounted" must see it (it decoded mountinfo
    # with unicode_escape, which turns UTF-8 names into something else).
    assert mounted_under(tmp_path) == [str(odd_mount)]


def test_rmtree_read_only_dirs_and_never_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("1")
    (top / "g").write_text("2")
    (top / "link").symlink_to(outside)
    os.chmod(top / "a" / "b", 0o500)
    os.chmod(top / "a", 0o500)
    removed = []
    O.rmtree(top, each=lambda: removed.append(1))
    assert not top.exists() and (outside / "keep").read_text() == "x"
    assert len(removed) == 3  # f, g and the symlink itself
    O.rmtree(top)  # missing: not an error
    f = tmp_path / "file"
    f.write_text("z")
    O.rmtree(os.fsencode(f))
    assert not f.exists()


def test_atomic_write_is_whole_or_nothing(tmp_path):
    p = tmp_path / "rec.json"
    O.atomic_write(p, b"one", mode=0o600)
    assert p.read_bytes() == b"one" and stat.S_IMODE(os.stat(p).st_mode) == 0o600

    def crash() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        O.atomic_write(p, b"two", before_rename=crash)
    assert p.read_bytes() == b"one"
    O.atomic_write(p, b"three")
    assert p.read_bytes() == b"three"
    assert [x.name for x in tmp_path.iterdir()] == ["rec.json"]  # no temp file left


def test_renameat2_noreplace_and_exchange(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    with pytest.raises(OSError) as e:
        O.rename_noreplace(os.fsencode(a), os.fsencode(b))
    assert e.value.errno == errno.EEXIST and b.read_text() == "B"
    O.rename_exchange(os.fsencode(a), os.fsencode(b))
    assert (a.read_text(), b.read_text()) == ("B", "A")
    with pytest.raises(OSError) as e:
        O.rename_exchange(os.fsencode(a), os.fsencode(tmp_path / "missing"))
    assert e.value.errno == errno.ENOENT


def test_fs_type_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        O.fs_type(tmp_path / "missing")
    assert e.value.filename == str(tmp_path / "missing")
