"""The syscall filter (docs/guide/sandboxes.md): the profiles as data, the compiled BPF and its
cache, and the filter in real sandboxes: a C probe (tests/sandbox/seccomp_probe.c, built with gcc
here) makes each denied call under ``default``, ``strict`` and ``off``; ``run``, ``shell``,
race checks and ``promote --verify`` each show ``Seccomp: 2``; and real work (gcc, git,
threads and subprocesses, ``python -m venv``, ``pip install`` from PyPI with ``--net``,
``npm test``, a real project's test suite) keeps working under ``default``."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator.sandbox import isolation, seccomp
from orchestrator.errors import BadSeccompProfile
from tests.conftest import REPO, petri
from tests.helpers.run_ws import fork, ws  # noqa: F401 (ws: a fixture; copy backend, no cgroup left behind)

HAVE_SANDBOX = os.geteuid() == 0 and shutil.which("bwrap") is not None
needs_sandbox = pytest.mark.skipif(not HAVE_SANDBOX,
                                   reason="needs root (cgroups) and bwrap (Debian package bubblewrap)")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the probe")
PY = "/usr/bin/python3"  # every sandbox sees it (this checkout's venv may sit under the host's /tmp)
SECCOMP_2 = "grep -q '^Seccomp:[[:space:]]*2$' /proc/self/status"

# What each probe line must say under `default` (tests/sandbox/seccomp_probe.c).
DEFAULT_EXPECTED = {
    "ptrace": "EPERM", "process_vm_readv": "EPERM", "process_vm_writev": "EPERM",
    "keyctl": "EPERM", "add_key": "EPERM", "request_key": "EPERM",
    "mount": "EPERM", "umount2": "EPERM", "pivot_root": "EPERM", "chroot": "EPERM",
    "fsopen": "ENOSYS", "open_tree": "ENOSYS", "open_tree_attr": "ENOSYS", "move_mount": "ENOSYS",
    "mount_setattr": "ENOSYS",
    "unshare_user": "EPERM", "clone_newuser": "EPERM", "clone_newuser_high_bits": "EPERM", "setns": "EPERM",
    "clone3": "ENOSYS",
    "kexec_load": "EPERM", "bpf": "EPERM", "perf_event_open": "EPERM", "userfaultfd": "EPERM",
    "io_uring_setup": "EPERM", "io_uring_enter": "EPERM",
    "tiocsti": "EPERM", "tiocsti_high_bits": "EPERM", "tioclinux": "EPERM",
    "x32": "EPERM", "i386": "EPERM",
    "chmod_setuid": "EPERM", "chmod_setgid": "EPERM", "chmod_setuid_high_bits": "EPERM",
    "fchmodat_setuid": "EPERM", "fchmod_setuid": "EPERM", "open_creat_setuid": "EPERM",
    "mknod_setuid": "EPERM", "mknod_setgid": "EPERM", "mknodat_setuid": "EPERM", "mknodat_setuid_high_bits": "EPERM",
    "openat2_setuid": "ENOSYS",
    # Allowed: a harmless unshare, a plain clone (fork), other ioctls, sockets, plain modes.
    "chmod_plain": "OK", "mknod_plain": "OK", "mknod_fifo": "OK",
    "unshare_files": "OK", "clone_plain": "OK", "ioctl_fionread": "ENOTTY",
    "socket_inet": "OK", "socket_unix": "OK", "socketpair_unix": "OK",
}
# The kernel itself refuses these without capabilities, with the same errno as the filter.
SAME_WITHOUT_FILTER = {"pivot_root"}
# ... and these, on some kernels and settings: kexec_load without CAP_SYS_BOOT where kexec is
# built in, bpf with unprivileged_bpf_disabled, userfaultfd with unprivileged_userfaultfd=0
# (Debian's 6.1 in tests/vm: all three EPERM unfiltered). Where they differ, it is checked.
MAY_BE_SAME_WITHOUT_FILTER = {"kexec_load", "bpf", "userfaultfd"}


# ----------------------------------------------------------------------------- pure: profiles


def test_profiles_as_data():
    assert seccomp.plan_filter("off", net=False) is None
    default = seccomp.plan_filter("default", net=False)
    strict = seccomp.plan_filter("strict", net=False)
    strict_net = seccomp.plan_filter("strict", net=True)
    names = {r.syscall for r in default.rules}
    for must in ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "mount",
                 "umount2", "pivot_root", "fsopen", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
                 "unshare", "setns", "clone", "clone3", "kexec_load", "kexec_file_load", "bpf", "perf_event_open",
                 "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "ioctl"):
        assert must in names, must
    assert "socket" not in names
    # ENOSYS exactly for clone3 and the new mount API (so libraries fall back), EPERM elsewhere.
    enosys = {r.syscall for r in default.rules if r.errno == seccomp.ENOSYS}
    assert enosys == {"clone3", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr",
                      "mount_setattr", "openat2"}
    # Every call that takes a mode refuses the setuid and setgid bits, masked on the bit
    # itself (mode_t is 32 bits to the kernel: high bits must not hide it).
    for name, arg in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2), ("creat", 1), ("open", 2),
                      ("openat", 3), ("mknod", 1), ("mknodat", 2)):
        got = {(r.arg.index, r.arg.value, r.arg.mask) for r in default.rules if r.syscall == name}
        assert got == {(arg, seccomp.S_ISUID, seccomp.S_ISUID), (arg, seccomp.S_ISGID, seccomp.S_ISGID)}, name
    assert {r.errno for r in default.rules} == {seccomp.EPERM, seccomp.ENOSYS}
    # The 64-bit pitfall: ioctl and clone compare only the low 32 bits the kernel reads.
    for r in default.rules:
        if r.syscall in ("ioctl", "clone", "unshare"):
            assert r.arg is not None and r.arg.op == "masked_eq" and r.arg.mask >> 32 == 0, r
    tty = {r.arg.value for r in default.rules if r.syscall == "ioctl"}
    assert tty == {seccomp.TIOCSTI, seccomp.TIOCLINUX}
    assert {r.arg.value for r in default.rules if r.syscall == "clone"} >= {seccomp.CLONE_NEWUSER, seccomp.CLONE_NEWNS}
    # strict adds the socket rules only without --net; with --net it is default.
    extra = set(strict.rules) - set(default.rules)
    assert {r.syscall for r in extra} == {"socket", "socketpair"}
    assert all(r.arg.op == "ne" and r.arg.value == 1 for r in extra)  # AF_UNIX
    assert strict_net.rules == default.rules and strict_net.key() == default.key() != strict.key()
    # s390 passes clone's flags second.
    s390 = seccomp.plan_filter("default", net=False, machine="s390x")
    assert {r.arg.index for r in s390.rules if r.syscall == "clone"} == {1}


def test_bad_profile_is_a_usage_error():
    with pytest.raises(BadSeccompProfile) as e:
        seccomp.parse_profile("loose")
    assert e.value.exit_code == 2 and "default, strict, off" in str(e.value)


def test_off_names_what_it_turns_off():
    off = seccomp.turned_off()
    text = " ".join(off)
    for word in ("ptrace", "keyctl", "mount", "unshare", "kexec", "bpf", "perf_event_open", "userfaultfd",
                 "io_uring", "TIOCSTI", "x32"):
        assert word in text, word
    assert "\n" not in seccomp.OFF_NOTICE and seccomp.OFF_NOTICE.startswith("--seccomp off")


def test_a_filtered_plan_is_never_rendered_without_its_fd():
    plan = isolation.build_plan(workspace="/w", tree="/t", argv=["true"], cwd="/w", env={}, uid=1, gid=1)
    assert plan.seccomp == "default"  # the default is filtered
    with pytest.raises(ValueError):
        isolation.bwrap_argv(plan)
    argv = isolation.bwrap_argv(plan, seccomp_fd=5)
    assert argv[argv.index(b"--seccomp") + 1] == b"5" and argv.index(b"--seccomp") < argv.index(b"--")
    off = isolation.build_plan(workspace="/w", tree="/t", argv=["true"], cwd="/w", env={}, uid=1, gid=1, seccomp="off")
    assert b"--seccomp" not in isolation.bwrap_argv(off)
    with pytest.raises(ValueError):
        isolation.bwrap_argv(off, seccomp_fd=5)


# ----------------------------------------------------------------------------- BPF and its cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(seccomp, "_memo", {})
    return tmp_path / "cache" / "petri" / "seccomp"


def test_bpf_is_compiled_once_and_cached_on_disk(fresh_cache, monkeypatch):
    default = seccomp.bpf("default", net=False)
    strict = seccomp.bpf("strict", net=False)
    assert default and len(default) % 8 == 0 and len(default) <= seccomp.MAX_BPF_BYTES
    assert strict != default and seccomp.bpf("strict", net=True) == default
    assert seccomp.bpf("off", net=False) is None
    files = sorted(fresh_cache.iterdir())
    assert len(files) == 2  # strict with --net shares default's file
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(fresh_cache.stat().st_mode) == 0o700
    # A new process (empty memo) reads the file and compiles nothing.
    monkeypatch.setattr(seccomp, "_memo", {})
    calls = []
    real = seccomp.compile_bpf
    monkeypatch.setattr(seccomp, "compile_bpf", lambda plan: calls.append(plan) or real(plan))
    assert seccomp.bpf("default", net=False) == default and calls == []


def test_a_tampered_or_foreign_cache_file_is_rebuilt(fresh_cache, monkeypatch):
    good = seccomp.bpf("default", net=False)
    path = seccomp._cache_path(seccomp.plan_filter("default", net=False))
    raw = path.read_bytes()
    # 1. contents changed (a weaker filter would be an escape): the checksum catches it
    path.write_bytes(raw[:-8] + bytes(8))
    monkeypatch.setattr(seccomp, "_memo", {})
    assert seccomp.bpf("default", net=False) == good
    assert path.read_bytes() == raw  # rebuilt and rewritten
    # 2. writable by others: not trusted even with a valid checksum
    os.chmod(path, 0o666)
    monkeypatch.setattr(seccomp, "_memo", {})
    calls = []
    real = seccomp.compile_bpf
    monkeypatch.setattr(seccomp, "compile_bpf", lambda plan: calls.append(plan) or real(plan))
    assert seccomp.bpf("default", net=False) == good and len(calls) == 1
    # 3. a symlink in its place is not followed
    path.unlink()
    other = fresh_cache / "elsewhere"
    other.write_bytes(raw)
    path.symlink_to(other)
    monkeypatch.setattr(seccomp, "_memo", {})
    assert seccomp._read_cached(path) is None


def test_filter_fd_carries_the_bpf_and_closes_on_exec(fresh_cache):
    assert seccomp.filter_fd("off", net=False) is None
    fd = seccomp.filter_fd("default", net=False)
    try:
        assert not os.get_inheritable(fd)  # only the spawn's pass_fds hands it on
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        assert data == seccomp.bpf("default", net=False)
    finally:
        seccomp.close_fd(fd)


# ----------------------------------------------------------------------------- in real sandboxes


@pytest.fixture(scope="module")
def probe_bin(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the probe")
    out = tmp_path_factory.mktemp("probe") / "seccomp_probe"
    subprocess.run(["gcc", "-O1", "-o", str(out), str(REPO / "tests" / "sandbox" / "seccomp_probe.c")], check=True)
    return out


def run_probe(root: Path, sb: dict, probe: Path, *flags: str) -> tuple[dict[str, str], dict]:
    shutil.copy(probe, Path(sb["path"]) / "probe")
    r = petri("run", sb["id"], "--json", *flags, "--", "./probe", cwd=root)
    assert r.rc == 0, r
    doc = r.json
    lines = Path(doc["stdout_path"]).read_text().splitlines()
    return dict(line.split() for line in lines), doc


@needs_sandbox
def test_default_denies_each_call_with_its_errno_and_off_does_not(ws, probe_bin):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    got, doc = run_probe(ws, sb, probe_bin)
    assert doc["seccomp"] == "default"
    assert got == DEFAULT_EXPECTED
    # The control: without the filter each probe gets something else (so each line above
    # was the filter's doing, not the kernel's own refusal).
    off, doc = run_probe(ws, sb, probe_bin, "--seccomp", "off")
    assert doc["seccomp"] == "off"
    for name, want in DEFAULT_EXPECTED.items():
        # A call this kernel does not have is ENOSYS either way (open_tree_attr before 6.15).
        kernels_own = want == off[name] and (want == "ENOSYS" or name in MAY_BE_SAME_WITHOUT_FILTER)
        if want != "OK" and name not in SAME_WITHOUT_FILTER and name != "ioctl_fionread" and not kernels_own:
            assert off[name] != want, (name, off[name])
    assert petri("run", sb["id"], "--", "sh", "-c", SECCOMP_2, cwd=ws).rc == 0
    assert petri("run", sb["id"], "--seccomp", "off", "--", "sh", "-c", SECCOMP_2, cwd=ws).rc == 1
    # The util-linux tools fail the same way.
    r = petri("run", sb["id"], "--", "unshare", "-U", "true", cwd=ws)
    assert r.rc != 0 and "Operation not permitted" in r.err, r
    r = petri("run", sb["id"], "--", "mount", "-t", "tmpfs", "none", "/tmp", cwd=ws)
    assert r.rc != 0 and ("permission denied" in r.err.lower() or "not permitted" in r.err.lower()), r


@needs_sandbox
def test_strict_refuses_inet_sockets_without_net_only(ws, probe_bin):  # noqa: F811 - the fixture imported from tests.helpers
    got, doc = run_probe(ws, fork(ws), probe_bin, "--seccomp", "strict")
    assert doc["seccomp"] == "strict"
    assert got["socket_inet"] == "EPERM" and got["socket_unix"] == "OK" and got["socketpair_unix"] == "OK"
    assert {k: v for k, v in got.items() if not k.startswith("socket")} == {
        k: v for k, v in DEFAULT_EXPECTED.items() if not k.startswith("socket")}
    with_net, _ = run_probe(ws, fork(ws, "--net"), probe_bin, "--seccomp", "strict")
    assert with_net["socket_inet"] == "OK"


@needs_sandbox
def test_off_says_what_it_turns_off_once_on_stderr_and_in_json(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    r = petri("run", sb["id"], "--json", "--seccomp", "off", "--", "true", cwd=ws)
    assert r.rc == 0, r
    notice = [line for line in r.err.splitlines() if "seccomp off" in line]
    assert len(notice) == 1 and "ptrace" in notice[0] and "x32" in notice[0], r.err
    assert r.json["seccomp"] == "off" and r.json["seccomp_turned_off"] == seccomp.turned_off()
    r = petri("run", sb["id"], "--json", "--", "true", cwd=ws)
    assert "seccomp off" not in r.err and "seccomp_turned_off" not in r.json


@needs_sandbox
def test_the_config_key_sets_the_profile_and_the_flag_wins(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    cfg = ws / ".petri" / "config.toml"
    cfg.write_text('seccomp = "off"\n')
    r = petri("run", sb["id"], "--json", "--", "sh", "-c", SECCOMP_2, cwd=ws)
    assert r.json["seccomp"] == "off" and r.rc == 1, r
    r = petri("run", sb["id"], "--json", "--seccomp", "default", "--", "sh", "-c", SECCOMP_2, cwd=ws)
    assert r.json["seccomp"] == "default" and r.rc == 0, r
    cfg.write_text('seccomp = "loose"\n')
    r = petri("run", sb["id"], "--", "true", cwd=ws)
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1 and "seccomp" in r.err, r


@needs_sandbox
def test_bad_flag_is_one_line_exit_2_and_runs_nothing(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    r = petri("run", sb["id"], "--seccomp", "loose", "--", "touch", "ran", cwd=ws)
    assert r.rc == 2 and r.err.strip() == "petri: bad --seccomp 'loose': use one of default, strict, off", r
    r = petri("run", sb["id"], "--json", "--seccomp", "loose", "--", "touch", "ran", cwd=ws)
    assert r.rc == 2 and r.json["exit_code"] == 2 and "--seccomp" in r.json["error"]
    assert not (Path(sb["path"]) / "ran").exists()
    assert petri("logs", sb["id"], cwd=ws).rc != 0  # no run was recorded
    r = petri("race", "--check", "true", "--cmd", "true", "--seccomp", "loose", cwd=ws)
    assert r.rc == 2, r
    assert len(petri("ls", "--json", cwd=ws).json["sandboxes"]) == 1  # the race forked nothing


@needs_sandbox
def test_shell_runs_under_the_filter(ws):  # noqa: F811 - the fixture imported from tests.helpers
    from tests.helpers.pty_drive import drive

    sb = fork(ws, "--label", "sh")
    # TIOCSTI on the shell's own terminal (the one case --new-session cannot cover).
    (Path(sb["path"]) / "tiocsti.py").write_text(
        "import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'#')\n    print('INJECTED')\n"
        "except OSError as e:\n    print('REFUSED', e.errno)\n")
    script = f"{SECCOMP_2} && echo FILTERED-$((40+2)); {PY} tiocsti.py; echo DONE-$((1+1))\n".encode()
    code, out = drive(["shell", "sh"], ws, script, until=b"DONE-2")
    assert code == 3, out[-800:]
    assert b"FILTERED-42" in out and b"REFUSED 1" in out and b"INJECTED" not in out, out[-800:]


@needs_sandbox
def test_race_checks_run_under_the_filter(ws):  # noqa: F811 - the fixture imported from tests.helpers
    r = petri("race", "--json", "--cmd", "echo a > a.txt", "--check", SECCOMP_2, cwd=ws)
    assert r.rc == 0 and r.json["winner"] and r.json["seccomp"] == "default", r
    # The control: the same check fails when the race turns the filter off.
    r = petri("race", "--json", "--cmd", "echo a > a.txt", "--check", SECCOMP_2, "--seccomp", "off", cwd=ws)
    assert r.rc == 1 and r.json["winner"] is None, r


@needs_sandbox
def test_promote_verify_runs_under_the_filter(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    (Path(sb["path"]) / "new.txt").write_text("promoted\n")
    r = petri("promote", sb["id"], "--json", "--verify", SECCOMP_2, cwd=ws)
    assert r.rc == 0 and r.json["verified"] is True and not r.json["rolled_back"], r
    assert (ws / "new.txt").read_text() == "promoted\n"
    # It inherits the config: with the filter off there, the same verify fails and rolls back.
    (ws / ".petri" / "config.toml").write_text('seccomp = "off"\n')
    sb = fork(ws)
    (Path(sb["path"]) / "other.txt").write_text("x\n")
    r = petri("promote", sb["id"], "--json", "--verify", SECCOMP_2, cwd=ws)
    assert r.rc == 1 and r.json["verified"] is False and r.json["rolled_back"] is True, r
    assert not (ws / "other.txt").exists()


# ----------------------------------------------------------------------------- real work under default


@needs_sandbox
@needs_gcc
def test_compilers_git_threads_and_subprocesses_work_under_default(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    tree = Path(sb["path"])
    (tree / "hello.c").write_text('#include <stdio.h>\n#include <pthread.h>\n'
                                  'static void *f(void *a) { return a; }\n'
                                  'int main(void) { pthread_t t; void *r; pthread_create(&t, 0, f, "hi");'
                                  ' pthread_join(t, &r); printf("%s from gcc\\n", (char *)r); return 0; }\n')
    r = petri("run", sb["id"], "--", "sh", "-c", "gcc -O1 -pthread -o hello hello.c && ./hello", cwd=ws)
    assert r.rc == 0 and r.out == "hi from gcc\n", r
    git = ("git init -q g && cd g && echo x > f && git add f && "
           "git -c user.name=t -c user.email=t@e commit -qm one && git log --oneline | wc -l")
    r = petri("run", sb["id"], "--", "sh", "-c", git, cwd=ws)
    assert r.rc == 0 and r.out.strip() == "1", r
    work = (
        "import concurrent.futures as cf, multiprocessing as mp, os, subprocess, threading\n"
        "def sq(x): return x * x\n"
        "if __name__ == '__main__':\n"
        "    with cf.ThreadPoolExecutor(8) as ex:\n"
        "        outs = list(ex.map(lambda i: subprocess.run(['sh', '-c', f'echo {i}'], capture_output=True,"
        " text=True).stdout.strip(), range(16)))\n"
        "    assert outs == [str(i) for i in range(16)], outs\n"
        "    for method in ('fork', 'spawn', 'forkserver'):\n"
        "        with mp.get_context(method).Pool(2) as p:\n"
        "            assert p.map(sq, range(5)) == [0, 1, 4, 9, 16]\n"
        "    pid = os.posix_spawn('/bin/true', ['true'], {})\n"
        "    assert os.waitpid(pid, 0)[1] == 0\n"
        "    print('WORK-OK', threading.active_count())\n")
    (tree / "work.py").write_text(work)
    r = petri("run", sb["id"], "--", PY, "work.py", cwd=ws)
    assert r.rc == 0 and r.out.startswith("WORK-OK"), r


NPM_TEST = """const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');
const { Worker } = require('node:worker_threads');
const fs = require('node:fs/promises');
const os = require('node:os');
const path = require('node:path');

test('a child process', () => {
  assert.strictEqual(execFileSync('sh', ['-c', 'echo child-ok']).toString().trim(), 'child-ok');
});
test('a worker thread', async () => {
  const w = new Worker('require("node:worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
  assert.strictEqual(await new Promise((res, rej) => { w.once('message', res); w.once('error', rej); }), 42);
});
test('asynchronous file I/O', async () => {
  const p = path.join(os.tmpdir(), 'petri-npm-probe.txt');
  await fs.writeFile(p, 'x'.repeat(100000));
  assert.strictEqual((await fs.readFile(p, 'utf8')).length, 100000);
});
"""


@needs_sandbox
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs node and npm")
def test_npm_test_works_under_default(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = fork(ws)
    pkg = Path(sb["path"]) / "pkg"
    (pkg / "test").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": "petri-probe", "version": "1.0.0", "private": True,
                                                   "scripts": {"test": "node --test"}}))
    (pkg / "test" / "work.test.js").write_text(NPM_TEST)
    r = petri("run", sb["id"], "--env", "npm_config_cache=/tmp/npm-cache", "--", "sh", "-c", "cd pkg && npm test",
              cwd=ws)
    assert r.rc == 0 and "# pass 3" in r.out and "# fail 0" in r.out, r


PYPI = "https://pypi.org/simple"
CA = "/etc/ssl/certs/ca-certificates.crt"


def pypi_reachable() -> str | None:
    try:
        urllib.request.urlopen(f"{PYPI}/iniconfig/", timeout=10).close()
        return None
    except OSError as e:
        return f"PyPI ({PYPI}) cannot be reached from here: {e}"


@needs_sandbox
def test_venv_and_pip_install_from_pypi_with_net_under_default(ws):  # noqa: F811 - the fixture imported from tests.helpers
    why = pypi_reachable()
    if why:
        pytest.skip(why)
    sb = fork(ws, "--net")
    # PIP_CONFIG_FILE=/dev/null: no local index or wheel folder from the host's pip.conf, so
    # the package really comes over the network.
    cmd = (f"{PY} -m venv /tmp/v && /tmp/v/bin/pip install -q --no-cache-dir --disable-pip-version-check "
           f"--cert {CA} --index-url {PYPI} iniconfig && /tmp/v/bin/python -c 'import iniconfig; print(\"PIP-OK\")'")
    r = petri("run", sb["id"], "--json", "--env", "PIP_CONFIG_FILE=/dev/null", "--", "sh", "-c", cmd, cwd=ws,
              timeout=300)
    out = Path(r.json["stdout_path"]).read_text()
    err = Path(r.json["stderr_path"]).read_text()
    assert r.rc == 0 and r.json["seccomp"] == "default" and "PIP-OK" in out, (r, err)


# A real project nobody here wrote, and pytest to run its suite: downloaded once from PyPI,
# kept between runs, copied into the sandbox (which then needs no network).
REAL_CACHE = Path("/var/tmp/petri-test-cache/seccomp")
REAL_PROJECT = "six==1.17.0"


def real_project_files() -> Path:
    done = REAL_CACHE / ".ok"
    if not done.exists():
        REAL_CACHE.mkdir(parents=True, exist_ok=True)
        for args in (["--no-deps", "--no-binary", ":all:", REAL_PROJECT], ["--only-binary", ":all:", "pytest"]):
            cp = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                                 "-d", str(REAL_CACHE), *args], capture_output=True, text=True)
            if cp.returncode != 0:
                pytest.skip(f"cannot download {args[-1]} from the package index: {cp.stderr.strip()[-300:]}")
        done.write_text("ok\n")
    return REAL_CACHE


@needs_sandbox
def test_a_real_projects_suite_passes_under_default(ws):  # noqa: F811 - the fixture imported from tests.helpers
    cache = real_project_files()
    sb = fork(ws)
    tree = Path(sb["path"])
    sdist = next(cache.glob("six-*.tar.gz"))
    subprocess.run(["tar", "-xzf", str(sdist), "-C", str(tree)], check=True)
    shutil.copytree(cache, tree / "wheels", ignore=shutil.ignore_patterns("*.tar.gz", ".ok"))
    project = next(tree.glob("six-*")).name
    cmd = (f"{PY} -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index --find-links wheels pytest && "
           f"cd {project} && /tmp/v/bin/python -m pytest -q -p no:cacheprovider")
    r = petri("run", sb["id"], "--json", "--", "sh", "-c", cmd, cwd=ws, timeout=300)
    out = Path(r.json["stdout_path"]).read_text()
    assert r.rc == 0 and r.json["seccomp"] == "default", (out[-1500:], Path(r.json["stderr_path"]).read_text()[-1500:])
    assert " passed" in out and " failed" not in out, out[-800:]
