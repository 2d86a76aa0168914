"""Shared pieces of the petri benchmarks: test trees, loop filesystems, timing, tables.

Trees are built once into a cache (``/var/tmp/petri-bench/trees``) and reused by later runs:
a tree counts as built only when its marker file (``<name>.ok``, JSON with the recipe
version, file count and bytes) matches the recipe, so a half-built tree from a killed run is
rebuilt. Each bench copies the cached tree into the filesystem it measures.

Loop filesystems (btrfs, XFS with ``reflink=1``) come from ``tests/helpers/loopimg.py``, the same
code the tests use: sparse images named ``/var/tmp/petri-bench-<kind>-<pid>-<rand>.img``,
held under ``flock`` while in use; a sweep at start releases only images whose lock nobody
holds (a killed run's), never the test suite's ``petri-test-*`` images or anything else.

Numbers are wall-clock ``time.perf_counter`` deltas; p50/p99 use linear interpolation
between order statistics (so with fewer than 100 samples p99 sits between the two largest).

Caveats: warm page cache throughout (trees were just copied in; nothing drops caches), so
these are warm-cache numbers. The machine may be shared with other work: the load average
at the start and end is printed with the results so noise can be judged. SIGTERM is turned
into KeyboardInterrupt so the same try/finally cleanup runs as on Ctrl-C; SIGKILL leaves
images for the next run's sweep.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tests.helpers import loopimg
from tests.helpers.loopimg import LoopFs, kill_fuse_daemons_under, unmount_under

REPO = Path(__file__).resolve().parent.parent
PETRI = REPO / ".venv" / "bin" / "petri"
CACHE = Path("/var/tmp/petri-bench")
IMAGE_PREFIX = "petri-bench"
TREE_RECIPE = 4  # bump when a tree recipe changes: cached trees are then rebuilt

PYCACHE = CACHE / "pycache"
PYENV_PYTHON = Path("/root/.pyenv/versions/3.11.7")
PROJECT_VENV = REPO / ".venv"


def log(msg: str) -> None:
    """Progress for people, on stderr (stdout carries only the markdown)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv: Sequence[str | os.PathLike], *, check: bool = True, cwd: Path | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r


def cli_env() -> dict[str, str]:
    """The environment for ``petri`` processes: bytecode cached as on a user's machine.

    This environment sets PYTHONDONTWRITEBYTECODE=1, and an editable install has no
    precompiled bytecode, so every petri process would recompile the project's modules
    from source (tens of ms). The cache goes to PYCACHE, not into the checkout."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PETRI_WORKSPACE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def warm_cli(scratch: Path) -> None:
    """Fill the bytecode cache for every module a CLI init/fork/rm/deinit imports."""
    env = cli_env()
    py = REPO / ".venv" / "bin" / "python"
    mods = ["orchestrator.cli", "orchestrator.cli.app", "orchestrator.cli.workspace", "orchestrator.cli.sandboxes",
            "orchestrator.engine"] + [f"snapshot.backends.{b}" for b in
                                                          ("btrfs", "overlay", "reflink", "copy", "fuse")]
    run([py, "-c", "import importlib\nfor m in %r: importlib.import_module(m)" % mods], env=env, cwd=REPO)
    ws = scratch / "warm-ws"
    ws.mkdir(parents=True)
    try:
        (ws / "f").write_text("x")
        run([PETRI, "--version"], env=env)
        run([PETRI, "--help"], env=env)
        run([PETRI, "init", "--backend", "copy", "--json", ws], env=env)
        snap = json.loads(run([PETRI, "snapshots", "--json"], env=env, cwd=ws).stdout)["snapshots"][0]["id"]
        for argv in (["fork", "--json"], ["fork", "--from", snap, "-n", "2", "--json"], ["ls", "--json"],
                     ["rm", "--all", "--json"], ["deinit", "--force", "--json"]):
            run([PETRI, *argv], env=env, cwd=ws)
    finally:
        remove_path(ws)


# -- statistics --------------------------------------------------------------------------

def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, like numpy's default."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Samples:
    values: list[float] = field(default_factory=list)
    note: str = ""  # e.g. "stopped at the time budget"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def p50(self) -> float:
        return percentile(self.values, 50)

    @property
    def p99(self) -> float:
        return percentile(self.values, 99)


def measure(fn: Callable[[], object], *, runs: int, budget_s: float = 0.0, min_runs: int = 3,
            before: Callable[[], None] | None = None,
            after: Callable[[object], None] | None = None) -> Samples:
    """Time ``fn`` ``runs`` times; ``before``/``after(result)`` run outside the timed part.

    With ``budget_s`` > 0, stop early once at least ``min_runs`` samples exist and the
    measured time alone has used up the budget (slow O(bytes) cells on the big tree)."""
    out = Samples()
    spent = 0.0
    for i in range(runs):
        if before:
            before()
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        out.values.append(dt)
        spent += dt
        if after:
            after(result)
        if budget_s and i + 1 >= min_runs and i + 1 < runs and spent >= budget_s:
            out.note = f"time budget {budget_s:.0f}s reached after {i + 1} of {runs} runs"
            break
    return out


def fmt_s(seconds: float | None) -> str:
    """Milliseconds under 1 s, seconds above; '-' for nothing."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    r = a / b
    return f"{r:.3f}" if r < 0.1 else f"{r:.2f}"


def verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value <= limit else "FAIL"


# -- machine facts and markdown ----------------------------------------------------------

def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine_facts() -> list[tuple[str, str]]:
    u = os.uname()
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / (1 << 20):.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    commit = run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=False).stdout.strip() or "?"
    dirty = run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], check=False).stdout.strip()
    host_fs = run(["stat", "-f", "-c", "%T", CACHE if CACHE.exists() else "/var/tmp"], check=False).stdout.strip()
    return [
        ("date", _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("kernel", f"{u.sysname} {u.release}"),
        ("cores", f"{os.cpu_count()} ({cpu})"),
        ("memory", mem),
        ("python", sys.version.split()[0]),
        ("petri commit", commit + (" (with uncommitted changes)" if dirty else "")),
        ("host filesystem (/var/tmp)", host_fs),
        ("load average at start", loadavg()),
    ]


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(cells)) + " |"

    out = [line(headers), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(r) for r in rows]
    return "\n".join(out)


class Report:
    """Markdown assembled as the bench goes, printed whole at the end (and on interrupt)."""

    def __init__(self, title: str, argv: Sequence[str]) -> None:
        self.parts: list[str] = []
        cmd = " ".join([".venv/bin/python -m bench." + Path(argv[0]).stem, *argv[1:]])
        self.parts.append(f"## {title}\n\nCommand (from the repository root): `{cmd}`\n")
        self.parts.append(md_table(["machine", ""], machine_facts()) + "\n")

    def section(self, heading: str, text: str = "") -> None:
        self.parts.append(f"### {heading}\n" + (f"\n{text}\n" if text else ""))

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        self.parts.append(md_table(headers, rows) + "\n")

    def text(self, text: str) -> None:
        self.parts.append(text + "\n")

    def render(self) -> str:
        return "\n".join(self.parts)


# -- signals and cleanup -----------------------------------------------------------------

def sigterm_as_interrupt() -> None:
    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")
    # A job started in the background of a non-interactive shell inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def remove_path(path: Path) -> None:
    """rm -rf that also deletes btrfs subvolumes (read-only ones too) and unmounts first."""
    if not os.path.lexists(path):
        return
    unmount_under(path)
    if run(["stat", "-f", "-c", "%T", path], check=False).stdout.strip() == "btrfs":
        if loopimg.delete_subvolumes_under(path):
            return
    # chattr/read-only dirs are not expected; rm -rf is the fastest remover for big trees.
    run(["rm", "-rf", "--one-file-system", path], check=False)


# -- loop filesystems (tests/helpers/loopimg.py: one implementation for tests and benches) ----------

def sweep_stale_images() -> None:
    """Release images of killed bench runs (their flock is free); nothing else."""
    loopimg.sweep_stale_images(IMAGE_PREFIX, log)


def sweep_stale_work_dirs() -> None:
    """Remove host work trees (``CACHE/work-<pid>``) of bench runs that are gone."""
    for d in CACHE.glob("work-*"):
        try:
            pid = int(d.name.split("-", 1)[1])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        log(f"sweeping stale work tree {d}")
        kill_fuse_daemons_under(d)
        remove_path(d)


def make_loopfs(kind: str, size: int) -> LoopFs:
    """A fresh ``kind`` filesystem on a sparse image of ``size`` bytes, mounted."""
    return loopimg.make_loopfs(kind, size, prefix=IMAGE_PREFIX)


@contextlib.contextmanager
def sample_engine_on_btrfs(size: int):
    """The demo's sample project as a workspace (btrfs backend) on a fresh btrfs loop image:
    yields ``(engine, ws, first snapshot id)``; deinit and release at the end, whatever
    happened (the time-to-first-command setup of bench_run and bench_seccomp)."""
    fs = make_loopfs("btrfs", size)
    engine = None
    try:
        import btrfsutil

        from orchestrator.engine import Engine

        assert fs.mount is not None
        ws = fs.mount / "stats"
        btrfsutil.create_subvolume(ws)
        run(["bash", REPO / "demo" / "sample_project.sh", ws])
        engine, init = Engine.init(ws, "btrfs")
        log(f"workspace {ws} on {fs.device}, snapshot {init.snapshot}")
        yield engine, ws, init.snapshot
    finally:
        if engine is not None:
            try:
                engine.deinit(force=True)
            except Exception as e:  # noqa: BLE001
                log(f"deinit failed: {e}")
        fs.release()


# -- trees -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeInfo:
    name: str
    path: Path
    files: int  # regular files
    entries: int  # files + dirs + symlinks
    bytes: int
    description: str


def count_tree(path: Path) -> tuple[int, int, int]:
    files = entries = size = 0
    for dirpath, dirnames, filenames in os.walk(path):
        entries += len(dirnames)
        for name in filenames:
            entries += 1
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_mode & 0o170000) == 0o100000:
                files += 1
                size += st.st_size
    return files, entries, size


def _synthetic(dest: Path, nfiles: int, seed: int) -> None:
    """A source-tree-like layout: ~40 files a directory, three levels, sizes log-uniform
    64 B .. 64 KiB (mean about 9 KiB), 1 in 50 executable, 1 in 100 a symlink, text-ish
    content so git's compression behaves as on code."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 10)))
             for _ in range(2000)]
    # One 2 MiB corpus of code-like lines; each file is a slice of it at a random offset.
    lines = []
    total = 0
    while total < (2 << 20):
        line = "    " * rng.randint(0, 3) + " ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))
        lines.append(line)
        total += len(line) + 1
    corpus = ("\n".join(lines) + "\n").encode()
    per_dir = 40
    made = 0
    d = 0
    while made < nfiles:
        rel = Path(f"pkg{d // 400:02d}") / f"mod{(d // 20) % 20:02d}" / f"sub{d % 20:02d}"
        full = dest / rel
        full.mkdir(parents=True, exist_ok=True)
        for i in range(min(per_dir, nfiles - made)):
            name = full / f"file{i:03d}.py"
            if made % 100 == 99 and i > 0:
                os.symlink(f"file{i - 1:03d}.py", name)
            else:
                size = int(2 ** rng.uniform(6, 16))
                start = rng.randrange(0, len(corpus) - size)
                name.write_bytes(corpus[start:start + size])
                if made % 50 == 7:
                    os.chmod(name, 0o755)
            made += 1
        d += 1


PAD_FILES_TARGET = 60_000
PAD_BYTES_TARGET = 1 << 30


def _python_tree(dest: Path) -> None:
    """A real Python installation plus the project's venv, padded to >= 60k files and
    >= 1 GiB with generated files (see TREE_DOCS['py60k'])."""
    dest.mkdir(parents=True)
    run(["cp", "-a", PYENV_PYTHON, dest / "python-3.11.7"])
    run(["cp", "-a", PROJECT_VENV, dest / "venv"])
    files, _, size = count_tree(dest)
    pad = dest / "padding"
    pad.mkdir()
    if files < PAD_FILES_TARGET:
        missing = PAD_FILES_TARGET - files
        _synthetic(pad / "small", missing + missing // 99 + 1, seed=60)  # 1 in 100 is a symlink
        files, _, size = count_tree(dest)
    rng = random.Random(61)
    i = 0
    while size < PAD_BYTES_TARGET:
        # Incompressible 4 MiB blobs (like wheels/archives): git cannot shrink them away.
        n = min(4 << 20, PAD_BYTES_TARGET - size)
        (pad / f"blob{i:03d}.bin").write_bytes(rng.randbytes(n))
        size += n
        i += 1


TREE_DOCS = {
    "1k": "synthetic: 1,000 entries (990 files, 10 symlinks) in 25 directories, text content, "
          "sizes log-uniform 64 B..64 KiB",
    "10k": "synthetic: 10,000 entries (9,900 files, 100 symlinks) in 250 directories, same recipe as 1k",
    "py60k": f"a copy of {PYENV_PYTHON} (CPython 3.11.7 built by pyenv, with its stdlib, tests and "
             f"site-packages) + the project's .venv, padded with synthetic files to >= "
             f"{PAD_FILES_TARGET:,} files and with incompressible 4 MiB blobs to >= 1 GiB",
}

TREE_SIZES = {"1k": 1000, "10k": 10000, "py60k": 60000}


def tree_name(nfiles: int) -> str:
    for name, n in TREE_SIZES.items():
        if n == nfiles:
            return name
    return f"{nfiles}"


def ensure_tree(nfiles: int) -> TreeInfo:
    """The cached tree for a ``--files`` value, built when missing or its marker is stale."""
    name = tree_name(nfiles)
    path = CACHE / "trees" / name
    marker = CACHE / "trees" / f"{name}.ok"
    try:
        m = json.loads(marker.read_text())
        if m.get("recipe") == TREE_RECIPE and path.is_dir():
            return TreeInfo(name, path, m["files"], m["entries"], m["bytes"], m["description"])
    except (OSError, ValueError, KeyError):
        pass
    log(f"building tree {name} into {path} (cached for later runs)")
    marker.unlink(missing_ok=True)
    remove_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if name == "py60k":
        _python_tree(path)
        desc = TREE_DOCS[name]
    else:
        path.mkdir()
        _synthetic(path, nfiles, seed=nfiles)
        desc = TREE_DOCS.get(name, f"synthetic: {nfiles:,} entries, same recipe as 1k")
    files, entries, size = count_tree(path)
    if name == "py60k":
        parts = []
        for part in ("python-3.11.7", "venv", "padding"):
            f, _, b = count_tree(path / part)
            parts.append(f"{part}/: {f:,} files, {b / (1 << 20):,.0f} MiB")
        desc += " (" + "; ".join(parts) + ")"
    marker.write_text(json.dumps({"recipe": TREE_RECIPE, "files": files, "entries": entries,
                                  "bytes": size, "description": desc}))
    return TreeInfo(name, path, files, entries, size, desc)


def ensure_git_repo(tree: TreeInfo) -> Path:
    """A bare git repository with the tree committed (one commit), cached beside the tree."""
    repo = CACHE / "git" / f"{tree.name}.git"
    marker = CACHE / "git" / f"{tree.name}.ok"
    if marker.exists() and marker.read_text() == str(TREE_RECIPE) and repo.is_dir():
        return repo
    log(f"committing tree {tree.name} into {repo} (cached for later runs)")
    marker.unlink(missing_ok=True)
    remove_path(repo)
    repo.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "init", "-q", "--bare", repo])
    env = {**os.environ, "GIT_DIR": str(repo), "GIT_WORK_TREE": str(tree.path),
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
    # -f: a venv's own .gitignore ("*") must not hide it from the baseline.
    # gc.auto=0: a background auto-gc after the big commit would make our own gc refuse.
    run(["git", "-c", "gc.auto=0", "add", "-A", "-f", "."], cwd=tree.path, env=env)
    run(["git", "-c", "gc.auto=0", "commit", "-q", "-m", f"tree {tree.name}"], cwd=tree.path, env=env)
    run(["git", "gc", "-q", "--force"], env=env)
    marker.write_text(str(TREE_RECIPE))
    return repo


def copy_tree_into(src: Path, dest: Path, *, subvolume: bool = False) -> None:
    """Copy a cached tree to ``dest`` (made a btrfs subvolume first when asked)."""
    if subvolume:
        import btrfsutil
        btrfsutil.create_subvolume(dest)
    else:
        dest.mkdir()
    run(["cp", "-a", "--no-target-directory", src, dest])
