"""What this kernel gives petri's backends, measured: ``python -m tests.vm.kernel_features
[--no-backends]`` (as root) prints one line per feature, ``yes`` or what the kernel said.
tests/vm/guest.sh runs it in the VM after the test passes (Debian's 6.1; in CI without the
backends' end-to-end lines, which cost minutes there: ``python -m tests.vm.harness
--features`` runs them); docs/kernel-features.md has both kernels' results.

Each probe uses petri's own code where petri has it (``snapshot.idmap`` for idmapped mounts,
the overlay backend's mount calls), on filesystems it makes for the purpose: ext4 is where
``/var/tmp`` is (the host's root; the guest's scratch), tmpfs is mounted, btrfs and XFS are
small loop images (tests/helpers/loopimg, ``petri-kf-*``, released at the end). The last lines run
each backend end to end through the CLI for a root-owned workspace (init, fork, a run that
writes a file), which is where the features meet: a root-owned workspace's commands run as
the sandbox account through an id-mapped view (or, for overlay, over idmapped layers).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from snapshot import idmap as I  # noqa: E402
from snapshot.backends import overlay as O  # noqa: E402
from tests.helpers import loopimg  # noqa: E402

FICLONE = 0x40049409
MAP = I.IdMap(4242, 4242)


def said(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return "no: " + (text[0] if text else type(e).__name__)


def check(fn: Callable[[], object]) -> str:
    try:
        out = fn()
        return out if isinstance(out, str) else "yes"
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        return said(e)


def idmapped(d: Path) -> None:
    os.close(I.open_clone(d, MAP))


def reflink(d: Path) -> None:
    (d / "a").write_bytes(b"x" * 8192)
    with open(d / "a", "rb") as s, open(d / "b", "wb") as t:
        fcntl.ioctl(t.fileno(), FICLONE, s.fileno())


@contextlib.contextmanager
def mounted_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _umount(p: Path) -> None:
    subprocess.run(["umount", str(p)], check=False, stderr=subprocess.DEVNULL)


def overlay_probes(base: Path) -> list[tuple[str, str]]:
    out = []
    for n in ("l1", "l2", "m1", "m2", "m3"):
        (base / n).mkdir()
    (base / "l1" / "f").write_text("1")
    (base / "l2" / "g").write_text("2")
    lowers = [bytes(base / "l1"), bytes(base / "l2")]

    def plain() -> None:
        O._legacy_mount(bytes(base / "m1"), lowers, None, None, True, bytes(base), [])

    out.append(("overlay mount (mount(2))", check(plain)))
    out.append(("idmapped mount of an overlay mount", check(lambda: idmapped(base / "m1"))))
    _umount(base / "m1")

    def lowerdir_plus() -> None:
        try:
            O._fsconfig_mount(bytes(base / "m2"), lowers, None, None, True, [])
        except O._NoLowerdirPlus:
            raise OSError("fsconfig refuses the lowerdir+ key") from None

    out.append(("overlay lowerdir+ (new mount API)", check(lowerdir_plus)))
    _umount(base / "m2")

    def over_idmapped_layers() -> None:
        fd = I.open_clone(base, MAP)
        try:
            mapped = [b"/proc/self/fd/%d/%s" % (fd, n) for n in (b"l1", b"l2")]
            try:
                O._fsconfig_mount(bytes(base / "m3"), mapped, None, None, True, [])
            except O._NoLowerdirPlus:
                # mount(8) cannot name a detached mount (a /proc/self/fd path of ours).
                raise OSError("needs lowerdir+ to name detached idmapped layers") from None
        finally:
            os.close(fd)

    out.append(("overlay over idmapped layers", check(over_idmapped_layers)))
    _umount(base / "m3")
    return out


def petri(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))


def backend_end_to_end(backend: str, ws: Path) -> str:
    (ws / "src").mkdir(parents=True, exist_ok=True)
    (ws / "src" / "a.txt").write_text("a\n")
    try:
        r = petri("init", "--backend", backend, "--json", cwd=ws)
        if r.returncode != 0:
            return "no: init: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        r = petri("fork", "--json", cwd=ws)
        if r.returncode != 0:
            return "no: fork: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        sb = json.loads(r.stdout)["sandboxes"][0]["id"]
        r = petri("run", sb, "--json", "--", "sh", "-c", "echo b > src/b.txt && cat src/a.txt", cwd=ws)
        if r.returncode != 0:
            return f"no: run exit {r.returncode}: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        mapped = json.loads(r.stdout).get("run_as", {}).get("id_mapped")
        return "yes" + (" (id-mapped view)" if mapped else "")
    finally:
        petri("deinit", "--force", cwd=ws)


def main(args: list[str] | None = None) -> int:
    argv = sys.argv[1:] if args is None else args
    # The backends end to end cost ~20 petri commands: minutes under the VM's emulation.
    backends = "--no-backends" not in argv
    if os.geteuid() != 0:
        print("kernel_features: run as root", file=sys.stderr)
        return 2
    rows: list[tuple[str, str]] = [("kernel", os.uname().release)]
    from orchestrator.sandbox import cgroups
    sup = cgroups.detect()
    rows.append(("cgroups (as root)", f"{sup.mode}: {sup.reason}"))
    if sup.mode == "v2":
        from orchestrator.limits import Limits
        cg = cgroups.open_cgroup("petri-kf-probe/run-1", Limits(mem_bytes=64 << 20, pids=8), sup)
        assert isinstance(cg, cgroups.CgroupV2)
        for f in ("cgroup.kill", "memory.peak", "memory.swap.max"):
            rows.append((f"cgroup v2 {f}", "yes" if (cg.dir / f).exists() else "no: absent"))
        cg.remove()
    top = Path(tempfile.mkdtemp(prefix="petri-kf-", dir="/var/tmp"))
    fss: list[loopimg.LoopFs] = []
    try:
        ext4 = top / "ext4"
        ext4.mkdir()
        # The last line: the mount on top (the guest binds its ext4 over a tmpfs /var/tmp).
        fstype = (subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(ext4)], capture_output=True,
                                 text=True).stdout.split() or ["?"])[-1]
        rows.append((f"idmapped mount: {fstype} (/var/tmp)", check(lambda: idmapped(ext4))))
        rows.append((f"reflink (FICLONE): {fstype}", check(lambda: reflink(ext4))))
        with mounted_tmpfs(top / "tmpfs") as t:
            rows.append(("idmapped mount: tmpfs", check(lambda: idmapped(t))))
        mounts: dict[str, Path] = {}
        for kind, size in (("btrfs", 256 << 20), ("xfs", 320 << 20)):
            try:
                fs = loopimg.make_loopfs(kind, size, prefix="petri-kf")
            except Exception as e:  # noqa: BLE001
                rows.append((f"{kind} loop filesystem", said(e)))
                continue
            fss.append(fs)
            assert fs.mount is not None
            mounts[kind] = fs.mount
            d = fs.mount / "probe"
            d.mkdir()
            rows.append((f"idmapped mount: {kind}", check(lambda d=d: idmapped(d))))
            rows.append((f"reflink (FICLONE): {kind}", check(lambda d=d: reflink(d))))
        ov = ext4 / "overlay"
        ov.mkdir()
        rows += overlay_probes(ov)
        rows.append(("/dev/fuse opens", check(lambda: os.close(os.open("/dev/fuse", os.O_RDWR)))))
        # Each backend as a root-owned workspace: init, fork, a run that writes a file.
        plans = [("copy", ext4 / "ws-copy"), ("overlay", ext4 / "ws-overlay"), ("fuse", ext4 / "ws-fuse")]
        if not backends:
            plans = []
        if "xfs" in mounts and backends:
            plans.append(("reflink", mounts["xfs"] / "ws-reflink"))
        if "btrfs" in mounts and backends:
            import btrfsutil
            btrfsutil.create_subvolume(str(mounts["btrfs"] / "ws-btrfs"))
            plans.append(("btrfs", mounts["btrfs"] / "ws-btrfs"))
        for backend, ws in plans:
            ws.mkdir(exist_ok=True)
            rows.append((f"backend {backend}, root-owned workspace: init, fork, run", backend_end_to_end(backend, ws)))
    finally:
        for fs in fss:
            fs.release()
        shutil.rmtree(top, ignore_errors=True)
    for k, v in rows:
        print(f"{k}\t{v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
