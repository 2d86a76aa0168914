"""The MCP ``promote`` tool's ``watch``/``for``/``every`` (as ``petri promote --watch CMD --for D
--every D``), through a real ``petri mcp --allow-live`` session on a real workspace (the copy
backend; the watch's checks run isolated against live): a watch whose check starts failing
rolls the promotion back (live byte-identical to before), bad arguments are one error line
with exit 2 and nothing promoted, and without ``--allow-live`` the tool is not there."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.conftest import petri
from tests.helpers.mcp_client import client
from tests.helpers.promote_ws import fork, manifest, w
from tests.helpers.watch_ws import promotion, watched_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (cgroups) and bwrap")

anyio = pytest.importorskip("anyio")
pytest.importorskip("mcp_types")


@pytest.fixture
def ws(tmp_path):
    with watched_workspace(tmp_path) as root:
        yield root


def test_a_watch_that_fails_rolls_the_promotion_back(ws):
    before = manifest(ws)
    sb, tree = fork(ws)
    w(tree / "README.md", "# watched\n")
    flag = ws / "down"  # not a promoted path: the rollback is not refused for it

    async def main():
        async with client(ws, "--allow-live") as c:
            p = await c.call("promote", {"sandbox": sb, "watch": f"test ! -e {flag}", "for": "60s", "every": 1})
            assert p["applied"] == ["README.md"] and p["promotion"].startswith("p-")
            assert p["watch"]["command"] == f"test ! -e {flag}" and p["watch"]["every_s"] == 1
            return p["promotion"]

    promo = anyio.run(main, backend="trio")
    # the watch outlives the MCP session: a detached watcher runs it
    assert (ws / "README.md").read_text() == "# watched\n"
    wd = promotion(ws, promo)["watch"]
    assert wd["state"] == "watching", wd
    deadline = time.monotonic() + 3
    while promotion(ws, promo)["watch"]["checks"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert promotion(ws, promo)["watch"]["checks"] >= 1  # checks passed before the failure
    flag.write_text("")
    deadline = time.monotonic() + 30
    while promotion(ws, promo)["watch"]["state"] == "watching" and time.monotonic() < deadline:
        time.sleep(0.2)
    flag.unlink()
    got = promotion(ws, promo)
    assert got["state"] == "undone" and got["watch"]["state"] == "rolled_back", got
    assert got["watch"]["failed"]["exit_code"] == 1
    assert manifest(ws) == before  # byte-identical to before the promotion


def test_bad_watch_arguments_are_one_error_line_and_nothing_is_promoted(ws):
    before = manifest(ws)
    sb, tree = fork(ws)
    w(tree / "README.md", "# watched\n")

    async def main():
        async with client(ws, "--allow-live") as c:
            for args, words in (({"watch": "true"}, "watch needs for"),
                                ({"for": "10s"}, "for and every go with watch"),
                                ({"watch": "true", "for": "2s", "every": "5s"}, "every 5s is longer than for 2s"),
                                ({"watch": "true", "for": "soon"}, "for"),
                                ({"watch": "true", "for": 0}, "positive duration"),
                                ({"watch": "true", "for": "10s", "dry_run": True}, "watch goes with a plain")):
                err = await c.call("promote", {"sandbox": sb, **args}, error=True)
                assert err["exit_code"] == 2 and words in err["error"], (args, err)
            err = await c.call("promote", {"sandbox": sb, "watch": "", "for": "10s"}, error=True)
            assert err["exit_code"] == 2 and "watch" in err["error"], err
        async with client(ws) as c:  # without --allow-live the tool is not offered, watch or not
            err = await c.call("promote", {"sandbox": sb, "watch": "true", "for": "10s"}, error=True)
            assert "promote" in err["error"], err

    anyio.run(main, backend="trio")
    assert manifest(ws) == before
    r = petri("--json", "promotions", cwd=ws)
    assert r.rc == 0 and r.json["promotions"] == [], r
