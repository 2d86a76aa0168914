"""A profile's ``env_pass`` and ``secrets`` reach the runs of ``petri race --profile`` (the
candidates' apply and check runs) and ``petri try --profile``, as they reach ``fork --profile``'s:
the variable from petri's environment, the secret at ``/run/secrets/NAME``, masked as ``***``
in the saved output; its value in no log, event or registry row. Real ``petri`` processes on a
copy-backend workspace, the runs in real sandboxes."""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import petri

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (cgroups) and bwrap: commands run in sandboxes")

SECRET = "s3cr3t-race-value"
ENV = {"RACE_VAR": "from-the-host", "RACE_SECRET": SECRET}
CONFIG = """\
[profiles.ci]
env_pass = ["RACE_VAR"]
secrets = ["TOKEN=env:RACE_SECRET"]
"""
# passes only with both (the secret compared by its digest: the command line is recorded); prints
# the secret, which the saved output must mask
CHECK = ('test "$RACE_VAR" = from-the-host && test "$(sha256sum < /run/secrets/TOKEN | cut -d" " -f1)" = '
         + hashlib.sha256(SECRET.encode()).hexdigest() + ' && cat /run/secrets/TOKEN && grep -q ok a.txt')


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("before\n")
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    (ws / ".petri" / "config.toml").write_text(CONFIG)
    try:
        yield ws
    finally:
        petri("rm", "--all", cwd=ws)
        petri("deinit", "--force", cwd=ws)


def _secret_nowhere(ws: Path) -> None:
    """No log, event or registry row holds the secret (the store's 0600 copy of a kept
    sandbox's secrets, ``.petri/**/secrets/``, is where it is meant to be)."""
    store = ws / ".petri"
    found = [p for p in store.rglob("*") if p.is_file() and "secrets" not in p.relative_to(store).parts
             and SECRET.encode() in p.read_bytes()]
    assert found == [], found
    for db in store.rglob("*.db"):
        con = sqlite3.connect(db)
        try:
            con.execute("PRAGMA wal_checkpoint")
            for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                for row in con.execute(f'SELECT * FROM "{table}"'):
                    assert SECRET not in repr(row), (db, table, row)
        finally:
            con.close()


def test_race_candidates_get_the_profiles_env_pass_and_secret(ws):
    # without the profile the check fails: no variable, no secret
    r = petri("race", "--json", "--check", CHECK, "--cmd", "echo ok > a.txt", cwd=ws, env=ENV)
    assert r.json["winner"] is None, r
    r = petri("race", "--json", "--profile", "ci", "--check", CHECK, "--cmd", "echo ok > a.txt",
              "--cmd", "printenv RACE_VAR > a.txt; cat /run/secrets/TOKEN >> a.txt", cwd=ws, env=ENV)
    assert r.rc == 0, r
    by = {c["candidate"]: c for c in r.json["candidates"]}
    assert r.json["winner"] == by["echo ok > a.txt"]["sandbox"], r.json
    assert by["echo ok > a.txt"]["exit_code"] == 0, by
    # the second candidate's apply run saw both too (and its check failed on a.txt only)
    loser = by["printenv RACE_VAR > a.txt; cat /run/secrets/TOKEN >> a.txt"]
    assert loser["exit_code"] != 0 and loser["apply_exit_code"] == 0, loser
    logs = petri("logs", r.json["winner"], cwd=ws)
    assert logs.rc == 0 and "***" in logs.out and SECRET not in logs.out, logs
    _secret_nowhere(ws)


def test_try_with_the_profile_gets_its_env_pass_and_secret(ws):
    r = petri("try", "--json", "--check", CHECK, "--", "sh", "-c", "echo ok > a.txt", cwd=ws, env=ENV)
    assert r.rc != 0 and (ws / "a.txt").read_text() == "before\n", r
    r = petri("try", "--json", "--yes", "--profile", "ci", "--check", CHECK, "--", "sh", "-c",
              'test "$RACE_VAR" = from-the-host && test -s /run/secrets/TOKEN && echo ok > a.txt', cwd=ws, env=ENV)
    assert r.rc == 0, r
    assert (ws / "a.txt").read_text() == "ok\n"
    assert SECRET not in r.out + r.err
    _secret_nowhere(ws)


def test_a_race_with_a_profile_whose_secret_cannot_be_read_is_one_line_and_forks_nothing(ws):
    r = petri("race", "--profile", "ci", "--check", "true", "--cmd", "true", cwd=ws, env={"RACE_VAR": "x"})
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1 and "RACE_SECRET" in r.err, r
    assert petri("ls", "--json", cwd=ws).json["sandboxes"] == []
