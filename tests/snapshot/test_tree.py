"""snapshot/tree.py on real files: what a copy does when the tree moves under it."""
from __future__ import annotations

import os
import threading

import pytest

from snapshot.errors import TreeChangedDuringCopy
from snapshot.tree import TreeCopier, copy_file_at

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def test_a_file_swapped_for_a_fifo_fails_the_copy_instead_of_hanging(tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    st = os.lstat(tmp_path / "f")
    os.unlink(tmp_path / "f")
    os.mkfifo(tmp_path / "f")  # nobody will ever write it: a blocking open would hang
    done = threading.Event()
    err: list[BaseException] = []

    def copy() -> None:
        try:
            copy_file_at(None, bytes(tmp_path / "f"), None, bytes(tmp_path / "out"), reflink=False)
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            err.append(e)
        done.set()

    threading.Thread(target=copy, daemon=True).start()
    assert done.wait(10), "copying a fifo hung"
    assert len(err) == 1 and isinstance(err[0], TreeChangedDuringCopy), err
    assert not (tmp_path / "out").exists()
    assert st.st_size == 4


@pytest.mark.parametrize("workers", [0, 4])
def test_copier_records_what_it_copied_inline_and_on_threads(tmp_path, workers):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "d").mkdir(parents=True)
    small = {f"d/s{i}".encode(): os.urandom(100 + i) for i in range(300)}  # more than one batch
    big = {b"big1": os.urandom(TreeCopier.BIG_FILE), b"d/big2": os.urandom(TreeCopier.BIG_FILE + 7)}
    for rel, data in {**small, **big}.items():
        (src / os.fsdecode(rel)).write_bytes(data)
    os.chmod(src / "big1", 0o751)
    dst.mkdir()
    copier = TreeCopier(reflink=False, workers=workers)
    copier.copy(bytes(src), bytes(dst))
    for rel, data in {**small, **big}.items():
        assert (dst / os.fsdecode(rel)).read_bytes() == data
        st = os.lstat(src / os.fsdecode(rel))
        assert copier.manifest[rel].size == st.st_size and copier.manifest[rel].ino == st.st_ino
        assert os.lstat(dst / os.fsdecode(rel)).st_mtime_ns == st.st_mtime_ns
    assert os.lstat(dst / "big1").st_mode & 0o7777 == 0o751
    assert set(copier.manifest) == set(small) | set(big)
