"""`petri run`, `logs`, `shell`-less bits, config and events, end to end through the real CLI:
real bwrap, real cgroups (v1 here), the copy backend on a tmp dir, the demo's sample project."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, petri
from tests.helpers import run_ws
from tests.helpers.run_ws import fork, make_project

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                reason="needs root (cgroups) and bwrap")
ws, btrfs_ws = run_ws.ws, run_ws.btrfs_ws  # the fixtures (tests/helpers/run_ws.py)
PY = "/usr/bin/python3"  # the venv's interpreter lives under /root, which is masked inside


def test_run_exit_codes_env_and_json_shape(ws):
    sb = fork(ws, "--label", "t")
    r = petri("run", "t", "--", PY, "-m", "unittest", "-q", "tests.test_stats", cwd=ws)
    assert r.rc == 1 and "test_median_even" in r.err, r  # the sample's bug, found by its own tests
    r = petri("run", "t", "--", "sh", "-c", "echo out; echo err >&2; exit 3", cwd=ws)
    assert r.rc == 3 and r.out == "out\n" and "err" in r.err, r
    r = petri("run", "t", "--", "no-such-command-here", cwd=ws)
    assert r.rc == 127 and "not found" in r.err, r
    (Path(sb["path"]) / "noexec.sh").write_text("#!/bin/sh\necho hi\n")
    r = petri("run", "t", "--", "./noexec.sh", cwd=ws)
    assert r.rc == 126, r
    t0 = time.monotonic()
    r = petri("run", "t", "--timeout", "1", "--", "sh", "-c", "trap '' TERM; sleep 30", cwd=ws)
    assert r.rc == 124 and "timeout" in r.err, r
    assert time.monotonic() - t0 < 10
    r = petri("run", "t", "--env", "GREETING=hello world", "-e", "X=1", "--",
              "sh", "-c", 'echo "$GREETING/$X/$HOME"', cwd=ws)
    assert r.rc == 0 and r.out.startswith("hello world/1/"), r
    # --json: the output goes to the files it names, the doc to stdout
    r = petri("run", "t", "--json", "--", "sh", "-c", "echo to-$1; exit 5", "sh", "file", cwd=ws)
    assert r.rc == 5, r
    doc = r.json
    for k in ("id", "run", "exit_code", "duration_s", "killed_by", "limits_hit", "stdout_path", "stderr_path",
              "peak_memory_bytes"):
        assert k in doc, k
    assert doc["schema"] == 1 and doc["id"] == sb["id"] and doc["exit_code"] == 5 and doc["killed_by"] is None
    assert Path(doc["stdout_path"]).read_text() == "to-file\n" and r.out.count("to-file") == 0
    assert doc["run"] == 7 and isinstance(doc["peak_memory_bytes"], int)
    st = petri("status", sb["id"], "--json", cwd=ws).json["sandboxes"][0]
    assert st["state"] == "exited" and st["last_exit_code"] == 5


def test_run_usage_errors_are_one_line(ws):
    fork(ws, "--label", "u")
    for args, code in ((["run", "u"], 2), (["run", "u", "--"], 2), (["run", "sb-nope", "--", "true"], 2),
                       (["run", "u", "--timeout", "soon", "--", "true"], 2),
                       (["run", "u", "--env", "NOEQ", "--", "true"], 2),
                       (["logs", "u", "--run", "9"], 2), (["logs", "sb-nope"], 2)):
        r = petri(*args, cwd=ws)
        assert r.rc == code, (args, r)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, (args, r.err)
    r = petri("logs", "u", cwd=ws)
    assert r.rc == 1 and "no runs yet" in r.err
    r = petri("run", "u", "--json", cwd=ws)
    assert r.rc == 2 and r.json["exit_code"] == 2


def test_writes_stay_in_the_sandbox_and_cwd_maps(ws):
    sb = fork(ws, "--label", "w")
    r = petri("run", "w", "--", "sh", "-c",
              "echo changed > ../README.md; mkdir -p new && echo x > new/f; touch /etc/petri-test 2>/dev/null; "
              "ls -a .petri 2>/dev/null | wc -l; pwd", cwd=ws / "stats")
    assert r.rc == 0, r
    lines = r.out.split()
    assert lines[-1] == str(ws / "stats")  # the caller's directory, the same path inside
    assert lines[-2] == "0"  # the store is masked
    assert (Path(sb["path"]) / "README.md").read_text() == "changed\n"
    assert (Path(sb["path"]) / "stats" / "new" / "f").exists()
    assert "changed" not in (ws / "README.md").read_text() and not (ws / "stats" / "new").exists()
    assert not Path("/etc/petri-test").exists()


def test_runs_as_the_sudo_caller_when_the_owner_is_root():
    import tempfile
    from snapshot.osutil import rmtree
    top = Path(tempfile.mkdtemp(prefix="petri-test-run-", dir="/var/tmp"))
    os.chmod(top, 0o755)  # the caller must be able to reach the tree (pytest's tmp is 0700)
    ws = make_project(top / "proj")
    try:
        assert petri("init", "--backend", "copy", cwd=ws).rc == 0
        _runs_as_the_sudo_caller(ws)
    finally:
        petri("deinit", "--force", cwd=ws)
        rmtree(bytes(top))


def _runs_as_the_sudo_caller(ws):
    fork(ws, "--label", "who")
    r = petri("run", "who", "--", "id", "-u", cwd=ws, env={"SUDO_UID": "65534", "SUDO_GID": "65534"})
    assert r.rc == 0 and r.out.strip() == "65534", r
    r = petri("run", "who", "--", "id", "-u", cwd=ws)
    assert r.rc == 0 and r.out.strip() == str(os.stat(ws).st_uid)


def test_logs_saved_per_run_and_followed_live(ws):
    fork(ws, "--label", "l")
    assert petri("run", "l", "--", "sh", "-c", "echo first; echo e1 >&2", cwd=ws).rc == 0
    assert petri("run", "l", "--", "sh", "-c", "echo second", cwd=ws).rc == 0
    r = petri("logs", "l", "--run", "1", cwd=ws)
    assert r.rc == 0 and r.out == "first\n" and r.err == "e1\n", r
    r = petri("logs", "l", cwd=ws)
    assert r.rc == 0 and "first" in r.out and "second" in r.out and "==> run 2" in r.out
    docs = petri("logs", "l", "--json", cwd=ws).json
    assert [d["run"] for d in docs["runs"]] == [1, 2] and docs["runs"][1]["stdout"] == "second\n"
    # -f follows a run that is still going, and returns when it ends
    env = dict(os.environ, PYTHONPATH=str(REPO))
    live = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "l", "--", "sh", "-c",
                             "for i in 1 2 3 4; do echo tick$i; sleep 0.4; done"], cwd=ws, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            runs = petri("status", "l", "--json", cwd=ws).json["sandboxes"][0]["runs"]
            if len(runs) == 3:
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        r = petri("logs", "l", "-f", cwd=ws)
        assert r.rc == 0 and r.out == "tick1\ntick2\ntick3\ntick4\n", r
        assert live.poll() is not None or time.monotonic() - t0 > 0.8  # it waited for the run
    finally:
        live.wait(timeout=20)


def test_expired_sandbox_refused_but_logs_stay(ws):
    fork(ws, "--label", "e", "--ttl", "1s")
    time.sleep(1.2)
    r = petri("run", "e", "--", "true", cwd=ws)
    assert r.rc == 1 and "expired" in r.err and len(r.err.strip().splitlines()) == 1, r
    st = petri("status", "e", "--json", cwd=ws).json["sandboxes"][0]
    assert st["state"] == "expired" and not Path(st["path"]).exists()


def test_disk_cap_refused_where_nothing_enforces_it(ws):
    r = petri("fork", "--disk", "1G", cwd=ws)
    assert r.rc == 4 and "btrfs" in r.err and "fuse" in r.err, r
    r = petri("race", "--check", "true", "--cmd", "true", "--disk", "1G", cwd=ws)
    assert r.rc == 4, r
    assert petri("ls", "--json", cwd=ws).json["sandboxes"] == []


def test_config_env_masks_and_bad_key(ws, tmp_path):
    secret = tmp_path / "secret-dir"
    secret.mkdir()
    (secret / "token").write_text("s3cret")
    cfg = tmp_path / "petri.toml"
    cfg.write_text(f'masks = ["{secret}"]\n[env]\nFROM_CONFIG = "yes"\n[limits]\nmem = "256M"\npids = 64\n')
    fork(ws, "--label", "c")
    env = {"PETRI_CONFIG": str(cfg)}
    r = petri("run", "c", "--", "sh", "-c", f'echo $FROM_CONFIG; cat {secret}/token 2>&1 || true', cwd=ws, env=env)
    assert r.rc == 0 and r.out.startswith("yes\n") and "s3cret" not in r.out, r
    cfg.write_text('[limits]\nmemory = "1G"\n')
    r = petri("run", "c", "--", "true", cwd=ws, env=env)
    assert r.rc == 2 and "limits.memory" in r.err and str(cfg) in r.err, r
    cfg.write_text('[limits]\nttl = "soon"\n')
    r = petri("run", "c", "--", "true", cwd=ws, env=env)
    assert r.rc == 2 and "limits.ttl" in r.err, r
    cfg.write_text('not = [toml')
    r = petri("run", "c", "--", "true", cwd=ws, env=env)
    assert r.rc == 2 and "TOML" in r.err, r
    # the workspace's own config (in the store) is read too; its limits become the race's defaults
    (ws / ".petri" / "config.toml").write_text('[limits]\nmem = "64M"\n')
    r = petri("race", "--json", "--check", "true", "--cmd", "true", "--keep", cwd=ws)
    assert r.rc == 0, r
    sb = r.json["winner"]
    st = petri("status", sb, "--json", cwd=ws).json["sandboxes"][0]
    assert st["limits"]["mem_bytes"] == 64 << 20


def test_events_stream_records_runs(ws):
    sb = fork(ws, "--label", "ev")
    assert petri("run", "ev", "--", "sh", "-c", "echo one; echo two", cwd=ws).rc == 0
    lines = [json.loads(x) for x in (ws / ".petri" / "events.jsonl").read_text().splitlines()]
    mine = [e for e in lines if e.get("sandbox") == sb["id"]]
    kinds = [e["event"] for e in mine]
    # keyed by ``sandbox`` like every sandbox event (docs/reference/events.md), so its creation is in the list
    assert kinds[:2] == ["sandbox.created", "run.started"] and kinds[-1] == "run.finished", kinds
    # coalesced (at most ten a second, not one per line): the last one has the final counts
    outs = [e for e in mine if e["event"] == "run.output"]
    assert 1 <= len(outs) <= 2, outs
    assert {k: outs[-1][k] for k in ("stream", "line", "stdout_bytes", "stdout_lines", "stderr_bytes")} == {
        "stream": "stdout", "line": "two", "stdout_bytes": 8, "stdout_lines": 2, "stderr_bytes": 0}
    assert mine[-1]["exit_code"] == 0 and all(e["schema"] == 1 and e["ts"].endswith("Z") for e in mine)


def test_listing_commands_do_not_import_trio_or_pydantic():
    code = ("import sys, orchestrator.cli.run, orchestrator.cli.sandboxes; "
            "bad = [m for m in ('trio', 'pydantic') if m in sys.modules]; assert not bad, bad")
    cp = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


def test_memory_limit_kills_with_137(ws):
    fork(ws, "--label", "m", "--mem", "64M")
    r = petri("run", "m", "--json", "--", PY, "-c", "x = bytearray(1 << 30)", cwd=ws)
    assert r.rc == 137 and r.json["killed_by"] == "memory", r


def test_btrfs_disk_cap_with_qgroups(btrfs_ws):
    w = btrfs_ws
    qdir_exists = lambda: any(Path("/sys/fs/btrfs").glob("*/qgroups"))  # noqa: E731
    r = petri("fork", "--label", "free", cwd=w)
    assert r.rc == 0
    r = petri("fork", "--json", "--label", "capped", "--disk", "20M", cwd=w)
    assert r.rc == 0, r
    assert qdir_exists()
    r = petri("run", "capped", "--json", "--", "sh", "-c",
              "dd if=/dev/urandom of=big bs=1M count=64 conv=fsync 2>&1; sync", cwd=w)
    doc = r.json
    assert "disk" in doc["limits_hit"], doc
    size = (Path(petri("status", "capped", "--json", cwd=w).json["sandboxes"][0]["path"]) / "big").stat().st_size
    assert size < 40 << 20, size
    # the uncapped sandbox writes freely
    r = petri("run", "free", "--", "sh", "-c", "dd if=/dev/zero of=big bs=1M count=40 conv=fsync 2>/dev/null", cwd=w)
    assert r.rc == 0, r


# ---------------------------------------------------------------------------- output at volume

def _petri_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def _env() -> dict:
    e = dict(os.environ)
    e.pop("PETRI_WORKSPACE", None)
    return e


def _run_events(ws: Path, sb: str, n: int) -> list[dict]:
    from orchestrator import events
    return [e for e in events.read_all(ws / ".petri") if e.get("sandbox") == sb and e.get("run") == n]


BIG = ("seq 1 200000; sleep 1; head -c 39321600 /dev/urandom | base64 -w 76; sleep 1; "
       "echo to-stderr >&2; echo end")


def test_a_big_output_is_saved_whole_and_every_follower_sees_every_byte_live(ws):
    """200k lines, then 53 MB, through `petri run` (its stdout to a file), with `petri logs -f`
    and the API's follower started while it runs: the saved log, petri's own stdout and
    both followers hold the same bytes, in order; the run's record counts them; run.output
    events stay at about ten a second."""
    import petri as P

    sb = fork(ws, "--label", "big")["id"]
    out = ws.parent / "run.out"
    t0 = time.monotonic()
    with open(out, "wb") as f:
        p = subprocess.Popen(_petri_argv("run", "big", "--", "sh", "-c", BIG), cwd=ws, env=_env(), stdout=f,
                             stderr=subprocess.PIPE)
    try:
        pws = P.open(ws)
        deadline = time.monotonic() + 30
        while not pws.logs(sb) and time.monotonic() < deadline:
            time.sleep(0.02)
        n = pws.logs(sb)[-1].run
        follow_out = ws.parent / "follow.out"
        with open(follow_out, "wb") as f:
            logs_f = subprocess.Popen(_petri_argv("logs", "big", "-f"), cwd=ws, env=_env(), stdout=f,
                                      stderr=subprocess.PIPE)
        got: dict[str, list[tuple[int, bytes]]] = {"stdout": [], "stderr": []}
        for stream, at, data in pws.output(sb, n, follow=True):
            got[stream].append((at, data))
        assert p.wait(120) == 0, p.stderr.read()
        took = time.monotonic() - t0
        assert logs_f.wait(60) == 0, logs_f.stderr.read()
        logs_err = logs_f.stderr.read()
    finally:
        p.kill()
        p.wait()
    rec = pws.logs(sb)[-1]
    saved = Path(rec.stdout_path).read_bytes()
    assert saved.startswith(subprocess.run(["seq", "1", "200000"], capture_output=True).stdout)
    assert saved.endswith(b"\nend\n") and len(saved) == 1_288_895 + 53_118_653 + 4
    assert out.read_bytes() == saved, "petri run's own stdout"
    assert follow_out.read_bytes() == saved and logs_err == b"to-stderr\n", "petri logs -f"
    pos = 0
    for at, data in got["stdout"]:
        assert at == pos  # no gap: the follower kept up
        pos += len(data)
    assert b"".join(d for _, d in got["stdout"]) == saved
    assert b"".join(d for _, d in got["stderr"]) == b"to-stderr\n"
    assert rec.output == {"stdout": {"bytes": len(saved), "lines": 200000 + 689853 + 1, "dropped": 0},
                          "stderr": {"bytes": 10, "lines": 1, "dropped": 0}}
    outs = [e for e in _run_events(ws, sb, n) if e["event"] == "run.output"]
    assert 2 <= len(outs) <= took * 10 + 3, (len(outs), took)
    assert outs[-1]["stdout_bytes"] == len(saved) and outs[-1]["stdout_lines"] == 889854
    assert all(len(e.get("line") or "") <= 200 for e in outs)


def test_past_the_cap_the_log_keeps_head_and_tail_and_says_what_was_dropped(ws):
    sb = fork(ws, "--label", "capped")["id"]
    (ws / ".petri" / "config.toml").write_text('log_cap = "8M"\n')
    r = petri("run", "capped", "--", "sh", "-c", "seq 1 3000000", cwd=ws)
    full = subprocess.run(["seq", "1", "3000000"], capture_output=True).stdout
    assert r.rc == 0 and r.out.encode() == full, "the terminal gets everything"
    head = tail = 4 << 20
    dropped = len(full) - head - tail
    assert "run 1's saved stdout keeps its first and last 4.0M: " in r.err and "dropped" in r.err, r.err
    doc = petri("status", sb, "--json", cwd=ws).json["sandboxes"][0]["runs"][-1]
    assert doc["output"]["stdout"] == {"bytes": len(full), "lines": 3000000, "dropped": dropped}
    saved = Path(doc["stdout_path"]).read_bytes()
    mark = f"\n[petri: {dropped} bytes dropped here; the log keeps the first {head} and the last {tail}".encode()
    assert saved.startswith(full[:head] + mark) and saved.endswith(full[-tail:])
    assert len(saved) < head + tail + 200
    logs = petri("logs", "capped", cwd=ws)
    assert logs.rc == 0 and logs.out.startswith(full[:head].decode()) and logs.out.endswith(full[-tail:].decode())
    assert f"[petri: {dropped} bytes dropped here (log_cap)]" in logs.out and "dropped" in logs.err
    bad = ws / ".petri" / "config.toml"
    bad.write_text('log_cap = "lots"\n')
    r = petri("run", "capped", "--", "true", cwd=ws)
    assert r.rc == 2 and "log_cap" in r.err, r
    bad.write_text('log_cap = "none"\n')
    assert petri("run", "capped", "--", "true", cwd=ws).rc == 0


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_output_exits_128_plus_it_with_the_log_complete(ws, sig, code):
    """Ctrl-C (or a SIGTERM) of `petri run` while the command floods its output: petri passes
    it on, the command exits 128+signal, and the saved log holds every line it wrote, whole
    and in order, the same bytes petri echoed."""
    fork(ws, "--label", "sig")
    script = ("trap 'echo bye; exit %d' INT TERM; i=0; while :; do echo \"line $i\"; i=$((i+1)); done" % code)
    out = ws.parent / "sig.out"
    with open(out, "wb") as f:
        p = subprocess.Popen(_petri_argv("run", "sig", "--", "bash", "-c", script), cwd=ws, env=_env(), stdout=f,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while out.stat().st_size < 2_000_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(p.pid, sig)  # as a terminal's Ctrl-C hits the foreground group
        rc = p.wait(60)
    finally:
        p.kill()
        p.wait()
    assert rc == code, p.stderr.read()
    runs = petri("status", "sig", "--json", cwd=ws).json["sandboxes"][0]["runs"]
    saved = Path(runs[-1]["stdout_path"]).read_bytes()
    assert runs[-1]["exit_code"] == code and saved == out.read_bytes()
    lines = saved.split(b"\n")
    assert lines[-1] == b"" and lines[-2] == b"bye"
    assert lines[:-2] == [b"line %d" % i for i in range(len(lines) - 2)]
    assert runs[-1]["output"]["stdout"]["bytes"] == len(saved)
