"""The unprivileged paths: `petri` run by a normal user (setpriv, no capabilities) on the
host filesystem, on a btrfs subvolume the user owns, and on XFS."""
from __future__ import annotations

import json
import os
from pathlib import Path


from snapshot import conformance as C
from tests.helpers.loopfs import run_as
from tests.helpers.rootless import own, petri_as, sample_ws_owned_by
from tests.helpers.rootless import dev_fuse_like_a_distribution  # noqa: F401 - fixtures


def lifecycle(user, ws: Path, expect_backend: str | None) -> dict:
    r = petri_as(user, "init", "--json", cwd=ws)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    if expect_backend:
        assert doc["backend"] == expect_backend, doc
    st = os.stat(ws / ".petri/registry.db")
    assert st.st_uid == user.uid, "the store belongs to the user who ran init"
    r = petri_as(user, "fork", "-n", "2", "--json", cwd=ws)
    assert r.returncode == 0, r.stderr
    sbs = json.loads(r.stdout)["sandboxes"]
    for sb in sbs:
        # Read as the user: a user's FUSE mount is closed even to root (no allow_other).
        cat = run_as(user, ["cat", str(Path(sb["path"]) / ".env")])
        assert cat.returncode == 0 and cat.stdout == "SECRET=1\n", cat.stderr
    r = petri_as(user, "rm", "--all", "--json", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert all(not os.path.lexists(sb["path"]) for sb in sbs)
    from snapshot.conformance import mounted_under
    assert mounted_under(ws / ".petri") == []
    r = petri_as(user, "gc", "--json", cwd=ws)
    assert r.returncode == 0, r.stderr
    r = petri_as(user, "deinit", "--json", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert not (ws / ".petri").exists()
    return doc


def test_rootless_on_host_filesystem(unprivileged_user, user_tmp):
    ws = sample_ws_owned_by(unprivileged_user, user_tmp / "home")
    doc = lifecycle(unprivileged_user, ws, None)
    assert doc["backend"] in ("fuse", "reflink", "copy")
    if doc["backend"] != "fuse":
        assert "fuse" in doc["reason"], "auto must say why fuse was not chosen"


def test_rootless_on_owned_btrfs_subvolume(unprivileged_user, btrfs_dir):
    import btrfsutil
    ws = btrfs_dir / "proj"
    btrfsutil.create_subvolume(str(ws))
    C.make_sample_tree(ws)
    own(ws, unprivileged_user)
    lifecycle(unprivileged_user, ws, "btrfs")


def test_rootless_on_xfs_uses_reflink_or_fuse(unprivileged_user, xfs_dir):
    ws = xfs_dir / "proj"
    ws.mkdir()
    C.make_sample_tree(ws)
    own(ws, unprivileged_user)
    doc = lifecycle(unprivileged_user, ws, None)
    assert doc["backend"] in ("fuse", "reflink")


def test_overlay_refused_for_a_normal_user(unprivileged_user, user_tmp):
    ws = user_tmp / "proj"
    ws.mkdir()
    (ws / "f").write_text("x")
    own(ws, unprivileged_user)
    r = petri_as(unprivileged_user, "init", "--backend", "overlay", cwd=ws)
    assert r.returncode == 4, r.stderr
    assert "root" in r.stderr and "--backend" in r.stderr
    assert not (ws / ".petri").exists()


def test_rootless_auto_picks_fuse_where_dev_fuse_is_open(unprivileged_user, user_tmp,
                                                         dev_fuse_like_a_distribution):  # noqa: F811 - the fixture imported from tests.helpers
    ws = sample_ws_owned_by(unprivileged_user, user_tmp / "home")
    doc = lifecycle(unprivileged_user, ws, "fuse")
    assert "rootless" in doc["reason"]
