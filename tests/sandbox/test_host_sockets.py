"""The pure parts of hiding host sockets (``orchestrator.sandbox.host_sockets``) and how the plan
(``isolation.build_plan``) renders them: no root, no bwrap, milliseconds."""
from __future__ import annotations

import os
import socket

import pytest

from orchestrator.sandbox import host_sockets as H
from orchestrator.sandbox import isolation as I

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

LISTING = (b"Num       RefCount Protocol Flags    Type St Inode Path\n"
           b"0000000000000000: 00000002 00000000 00010000 0001 01 20001 /run/dbus/system_bus_socket\n"
           b"0000000000000000: 00000002 00000000 00010000 0001 01 20002 @/tmp/.X11-unix/X0\n"
           b"0000000000000000: 00000003 00000000 00000000 0001 03 20003\n"
           b"0000000000000000: 00000002 00000000 00010000 0001 01 20004 /srv/my app/agent.sock\n"
           b"0000000000000000: 00000002 00000000 00010000 0001 01 20005 relative.sock\n")


def test_the_listing_gives_pathname_sockets_only():
    assert H.parse_proc_net_unix(LISTING) == [b"/run/dbus/system_bus_socket", b"/srv/my app/agent.sock"]


def test_only_sockets_that_exist_are_kept(tmp_path):
    live = tmp_path / "live.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(live))
    try:
        (tmp_path / "plain").write_text("not a socket")
        listing = b"h\n" + b"".join(b"0: 2 0 10000 0001 01 1 %s\n" % os.fsencode(p)
                                     for p in (live, tmp_path / "plain", tmp_path / "gone.sock"))
        assert H.host_sockets(listing) == [os.fsencode(live)]
    finally:
        s.close()


def test_the_socket_plan_masks_all_but_the_tree_and_allows_only_with_net():
    socks = [b"/srv/a.sock", b"/ws/own.sock", b"/run/docker.sock"]
    masks, binds = H.socket_plan(workspace=b"/ws", net=False, allowed=[b"/srv/a.sock"], private=[b"/run"],
                                 sockets=socks)
    assert masks == [b"/srv/a.sock", b"/run/docker.sock"] and binds == []
    masks, _ = H.socket_plan(workspace=b"/ws", net=True, allowed=[b"/srv/a.sock"], private=[b"/run"], sockets=socks)
    assert masks == [b"/run/docker.sock"]


def test_the_plan_makes_run_and_var_tmp_private_and_binds_after_masks():
    plan = I.build_plan(workspace="/ws", tree="/t", argv=["true"], cwd="/ws", env={}, uid=0, gid=0,
                        masks=[I.Mask(b"/run/docker.sock", "file"), I.Mask(b"/srv/a.sock", "file"),
                               I.Mask(b"/home/u/.ssh", "dir")],
                        private=[b"/run", b"/var/tmp"], binds=[(b"/home/u/.ssh/agent", b"/home/u/.ssh/agent")])
    ops = [(op.verb, op.dest) for op in plan.mounts]
    assert ("tmpfs", b"/run") in ops and ("tmpfs", b"/var/tmp") in ops
    assert ("mask-file", b"/run/docker.sock") not in ops  # the private /run hides it already
    assert ("mask-file", b"/srv/a.sock") in ops
    assert ops.index(("ro-bind", b"/home/u/.ssh/agent")) > ops.index(("mask-dir", b"/home/u/.ssh"))
    sizes = {op.dest: op.size for op in plan.mounts if op.verb == "tmpfs"}
    assert sizes[b"/run"] == I.RUN_BYTES
