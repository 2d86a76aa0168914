"""A workspace's whole state as a reader may not change it (registry rows, store entries,
mounts, events): taken before and after, and their difference."""
from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path


REGISTRY = {"registry.db", "registry.db-wal", "registry.db-shm"}


BTRFS_EMPTY_SUBVOL_DIR = 2


def _mountpoints(under: Path) -> list[str]:
    from tests.helpers.loopimg import mounts
    prefix = str(under).rstrip("/") + "/"
    return sorted(p for p, _t, _s in mounts() if p == str(under) or p.startswith(prefix))


def _store_entries(store: Path, skip: set[str]) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(store):
        keep = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if full in skip:
                out[os.path.relpath(full, store)] = ("mountpoint",)
            else:
                keep.append(d)
        dirnames[:] = keep
        st = os.lstat(dirpath)
        # btrfs shows a nested subvolume inside a snapshot (the store's place in a sandbox's
        # tree) as an empty directory of inode 2 whose times the kernel makes up afresh.
        placeholder = st.st_ino == BTRFS_EMPTY_SUBVOL_DIR and not os.listdir(dirpath)
        out[os.path.relpath(dirpath, store)] = ("dir",) if placeholder else ("dir", st.st_mtime_ns)
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), store)
            if rel in REGISTRY:
                continue
            st = os.lstat(os.path.join(dirpath, f))
            out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def registry_rows(store: Path) -> dict[str, tuple[int, str]]:
    """Every table of the registry: (row count, a digest of its rows), read through a
    read-only connection (it writes nothing itself), in a process of its own.

    Why a process of its own: SQLite shares its locks and its mapping of a WAL database's
    -shm among the connections of one process by (device, inode), and btrfs hands out a
    deleted subvolume's device number again while inode numbers repeat from one fresh tree
    to the next: a connection an earlier test of this worker left open to another workspace's
    registry.db with the same (device, inode) made this read fail with "disk I/O error" in
    full parallel runs (never alone)."""
    import json
    import subprocess
    import sys

    script = (
        "import hashlib, json, sqlite3, sys\n"
        "db = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n"
        "tables = [r[0] for r in db.execute(\"SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name\")]\n"
        "out = {}\n"
        "for t in tables:\n"
        "    rows = sorted(repr(tuple(r)) for r in db.execute(f'SELECT * FROM \"{t}\"'))\n"
        "    out[t] = (len(rows), hashlib.sha256(chr(10).join(rows).encode()).hexdigest()[:16])\n"
        "db.close()\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(store / "registry.db")], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"reading the registry read-only failed: {r.stderr.strip()}")
    return {t: (n, d) for t, (n, d) in json.loads(r.stdout).items()}


def event_files(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.glob("events.jsonl*"))}


def state(ws: Path, backend: str, *, times: bool = True) -> dict:
    mps = _mountpoints(ws)
    subvols: list[str] = []
    if backend == "btrfs":
        r = subprocess.run(["btrfs", "subvolume", "list", "-a", str(ws)], capture_output=True, text=True, check=True)
        subvols = sorted(line.split(" path ", 1)[1] for line in r.stdout.splitlines()
                         if ws.name in line.split(" path ", 1)[1])
    entries = _store_entries(ws / ".petri", set(mps))
    if not times:
        entries = {k: v[:1] for k, v in entries.items()}
    return {"subvolumes": subvols, "mounts": mps, "store": entries, "registry": registry_rows(ws / ".petri"),
            "events": event_files(ws / ".petri")}


def diff_state(a: dict, b: dict) -> str:
    lines = []
    for t in sorted(set(a["registry"]) | set(b["registry"])):
        if a["registry"].get(t) != b["registry"].get(t):
            lines.append(f"registry table {t}: (rows, digest) {a['registry'].get(t)} -> {b['registry'].get(t)}")
    for name in sorted(set(a["events"]) | set(b["events"])):
        old, new = a["events"].get(name, b""), b["events"].get(name, b"")
        if old != new:
            added = new[len(old):] if new.startswith(old) else new
            lines.append(f".petri/{name}: {len(old)} -> {len(new)} bytes: {added[:300]!r}")
    for key in ("subvolumes", "mounts"):
        if a[key] != b[key]:
            lines.append(f"{key}: {sorted(set(a[key]) ^ set(b[key]))}")
    sa, sb = a["store"], b["store"]
    for k in sorted(set(sa) | set(sb)):
        if sa.get(k) != sb.get(k):
            lines.append(f".petri/{k}: {sa.get(k)} -> {sb.get(k)}")
    return "\n".join(lines)


def registry_states(ws: Path) -> dict[str, tuple[str, int | None]]:
    """Every sandbox's (state, owner_pid), read straight from the registry (no petri command
    runs, so nothing is settled before we look)."""
    db = sqlite3.connect(f"file:{ws / '.petri' / 'registry.db'}?mode=ro", uri=True)
    try:
        return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, owner_pid FROM sandboxes")}
    finally:
        db.close()
