"""``--cluster local:N``: a throwaway Ray cluster of N nodes on this machine, on loopback only.

The cluster runs in a child process of its own (``python -m orchestrator.cluster.local``),
which starts the nodes with Ray's ``ray.cluster_utils.Cluster`` (the head, then N-1 more;
each a raylet with its own object store, workers and node store), prints one JSON line when
they are up, then obeys lines on its stdin (``kill I``: node I dies, as a machine would;
``stop``) and tears everything down at ``stop``, at the end of its stdin (its parent died) and
on SIGTERM. Why a child: Ray's node startup installs signal handlers, which only the main
thread of a process may do, while a race may run in any thread (``petri.aio`` under asyncio);
and Ray's process-wide state stays out of the driver.

Loopback only: the child sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before importing Ray
(Ray then takes 127.0.0.1 as the node address for everything it binds), passes
``node_ip_address=127.0.0.1`` and starts no dashboard; usage statistics are off. After the
start, :func:`listeners` reads ``/proc/net`` for every socket that a process of this cluster
(found by the cluster's private directory in its command line or environment) listens on,
and the cluster is torn down if one is bound beyond loopback.

Everything lives in one private directory (``/var/tmp/petri-lc-*``): Ray's
temporary files (``RAY_TMPDIR``, so ``/tmp/ray`` is never touched), each node's store
(``node-I``: ``PETRI_CLUSTER_STORE`` for that node's workers) and its spilling directory;
teardown stops the nodes, kills whatever process still names the directory, unmounts what
is mounted below it and removes it.

Caveats:
- N nodes on one machine share its cores and disk: a local cluster shows that races spread
  and ship their base correctly, not that they go faster.
- Starting takes a few seconds per node (each raylet, its object store and worker pool).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadClusterAddress, LocalClusterFailed, NotLoopbackOnly
import orchestrator
import snapshot

MAX_NODES = 16
START_TIMEOUT_S = 180.0
OBJECT_STORE_BYTES = 256 << 20
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


# ---------------------------------------------------------------------------- the driver's handle


class LocalCluster:
    """A local Ray cluster (see the module docstring); a context manager. ``address`` is its
    Ray address, ``nodes`` one dict per node (``index``, ``node``: Ray's node id, ``store``)."""

    def __init__(self, nodes: int, *, cpus_per_node: int = 2, object_store_bytes: int = OBJECT_STORE_BYTES,
                 node_backend: str | None = None, parent_dir: str | os.PathLike | None = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise BadClusterAddress(text=f"local:{nodes}", most=MAX_NODES)
        self.n = nodes
        self.cpus = cpus_per_node
        self.object_store_bytes = object_store_bytes
        # PETRI_NODE_BACKEND here: `--cluster local:N` with the nodes on fuse (as a rootless node would be)
        self.node_backend = node_backend or os.environ.get("PETRI_NODE_BACKEND")
        self.parent_dir = parent_dir
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self.nodes: list[dict[str, Any]] = []

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "LocalCluster":
        # Short: Ray's unix sockets live below it, and a socket path has 107 bytes at most.
        self.dir = Path(tempfile.mkdtemp(prefix="petri-lc-", dir=self.parent_dir or "/var/tmp"))
        log = self.dir / "cluster.log"
        argv = [sys.executable, "-P", "-m", "orchestrator.cluster.local", "--nodes", str(self.n),
                "--dir", str(self.dir), "--cpus", str(self.cpus), "--object-store", str(self.object_store_bytes)]
        if self.node_backend:
            argv += ["--node-backend", self.node_backend]
        env = {**os.environ, **_LOOPBACK_ENV, "RAY_TMPDIR": str(self.dir), "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)
        try:
            with open(log, "ab") as logf:
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                                             env=env, cwd=self.dir, start_new_session=True)
            ready = self._reply(START_TIMEOUT_S)
            if "error" in ready:
                raise LocalClusterFailed(why=ready["error"], log=str(log))
            self.address, self.nodes = ready["address"], ready["nodes"]
            wide = [ln for ln in listeners(self.pids()) if not ln.loopback]
            if wide:
                raise NotLoopbackOnly(listeners=", ".join(str(ln) for ln in wide))
        except BaseException:
            self.close()
            raise
        return self

    def _reply(self, timeout: float) -> dict[str, Any]:
        """The child's next JSON line, or an error when it died or said nothing in time."""
        import selectors

        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return {"error": f"no answer from the cluster process in {timeout:.0f}s"}
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the cluster process exited ({self.proc.wait()})"}
        return json.loads(line)

    def _ask(self, line: str, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        return self._reply(timeout)

    def kill_node(self, index: int) -> None:
        """Kill node ``index`` (not the head, 0) as a dying machine would: its raylet, its
        workers and their children, at once."""
        got = self._ask(f"kill {index}")
        if "error" in got:
            raise LocalClusterFailed(why=got["error"], log=str(self.dir / "cluster.log") if self.dir else "-")

    def pids(self) -> set[int]:
        """Every process of this cluster: the child and whatever names its directory."""
        out = set()
        if self.proc is not None and self.proc.poll() is None:
            out.add(self.proc.pid)
        if self.dir is not None:
            out |= processes_naming(str(self.dir))
        return out

    def close(self) -> None:
        """Tear it all down: the nodes, any process left that names the directory, mounts
        below it, the directory. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.write(b"stop\n")
                proc.stdin.close()
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(OSError):
                assert proc.stdout is not None  # started with stdout=PIPE
                proc.stdout.close()
        if self.dir is not None and self.dir.exists():
            sweep_dir(self.dir)
            self.dir = None


# ---------------------------------------------------------------------------- what runs where


@dataclass(frozen=True)
class Listener:
    proto: str
    address: str
    port: int
    pid: int
    comm: str

    @property
    def loopback(self) -> bool:
        a = self.address
        return a.startswith("127.") or a == "::1" or a.startswith("::ffff:127.")

    def __str__(self) -> str:
        return f"{self.proto} {self.address}:{self.port} ({self.comm}, pid {self.pid})"


def _hex_addr(text: str) -> tuple[str, int]:
    import ipaddress

    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            return f"::ffff:{ip.ipv4_mapped}", int(port, 16)
    return str(ip), int(port, 16)


def listeners(pids: set[int]) -> list[Listener]:
    """Sockets that the processes ``pids`` listen on (TCP) or are bound to (UDP), from
    ``/proc/net`` and each process's file descriptors."""
    inodes: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes[int(target[8:-1])] = pid
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            # /proc/net is the reader's own network namespace: every Ray process shares ours.
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
            for line in lines:
                f = line.split()
                state, inode = f[3], int(f[9])
                if inode not in inodes or (proto.startswith("tcp") and state != "0A"):
                    continue
                addr, port = _hex_addr(f[1])
                pid = inodes[inode]
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    comm = "?"
                out.append(Listener(proto, addr, port, pid, comm))
    return out


def processes_naming(text: str) -> set[int]:
    """Processes whose command line or environment holds ``text`` (a private directory)."""
    needle = text.encode()
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as f:
                    if needle in f.read():
                        out.add(int(name))
                        break
            except OSError:
                continue
    return out


def _node_sandbox_ids(d: Path) -> list[str]:
    """Every sandbox id the node stores below ``d`` know of."""
    import sqlite3

    ids: list[str] = []
    for db in d.glob("node-*/ws/*/.petri/registry.db"):
        with contextlib.suppress(sqlite3.Error):
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                ids += [r[0] for r in con.execute("SELECT id FROM sandboxes")]
            finally:
                con.close()
    return ids


def sweep_dir(d: Path) -> None:
    """Kill the processes that name ``d``, unmount everything below it, remove it."""
    for _ in range(3):
        left = processes_naming(str(d))
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    # Runs of a node that died were never finished: their cgroups (v1 keeps empty ones) go.
    for sb in _node_sandbox_ids(d):
        with contextlib.suppress(Exception):
            orchestrator.sandbox.cgroups.sweep_cgroups(f"{orchestrator.sandbox.reaper.CGROUP_ROOT}/{sb}")
    prefix = os.fsencode(os.path.realpath(d)).rstrip(b"/") + b"/"
    for m in sorted(snapshot.fusefs.daemon.mounts(), key=lambda m: len(m.mountpoint), reverse=True):
        if m.mountpoint.startswith(prefix):
            subprocess.run(["umount", "-l", m.mountpoint], capture_output=True)
            if os.geteuid() != 0:
                subprocess.run(["fusermount3", "-uz", m.mountpoint], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------- the child


def _serve(n: int, d: Path, cpus: int, object_store: int, node_backend: str | None) -> int:
    for k, v in _LOOPBACK_ENV.items():
        os.environ[k] = v  # before Ray is imported: it reads them once
    tmp = d / "ray"  # Ray's temp dir; its address file goes to $RAY_TMPDIR/ray as well
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["RAY_TMPDIR"] = str(d)
    import ray
    from ray.cluster_utils import Cluster

    def node_args(i: int) -> dict[str, Any]:
        store = d / f"node-{i}"
        (store / "spill").mkdir(parents=True, exist_ok=True)
        env = {"PETRI_CLUSTER_STORE": str(store)}
        if node_backend:
            env["PETRI_NODE_BACKEND"] = node_backend
        return dict(num_cpus=cpus, node_ip_address="127.0.0.1", include_dashboard=False, temp_dir=str(tmp),
                    object_store_memory=object_store, object_spilling_directory=str(store / "spill"),
                    env_vars=env, labels={"petri-local-node": str(i)}, resources={f"petri-local-node-{i}": 1})

    def say(doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    cluster = None
    nodes: list[Any] = []

    def on_term(*_: Any) -> None:
        raise SystemExit(0)  # through the finally below: the nodes go down

    signal.signal(signal.SIGTERM, on_term)
    try:
        try:
            cluster = Cluster(initialize_head=True, head_node_args=node_args(0))
            nodes.append(cluster.head_node)
            for i in range(1, n):
                nodes.append(cluster.add_node(**node_args(i)))
            cluster.wait_for_nodes()
        except Exception as e:  # noqa: BLE001 - said to the parent, which raises it
            say({"error": f"{type(e).__name__}: {e}"})
            return 1
        say({"address": cluster.address, "nodes": [
            {"index": i, "node": node.node_id, "store": str(d / f"node-{i}")} for i, node in enumerate(nodes)]})
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["stop"]:
                break
            if words[:1] == ["kill"] and len(words) == 2 and words[1].isdigit() and 0 < int(words[1]) < len(nodes):
                node = nodes[int(words[1])]
                if node is None:
                    say({"error": "that node is dead already"})
                    continue
                cluster.remove_node(node, allow_graceful=False)
                nodes[int(words[1])] = None
                say({"killed": int(words[1])})
            else:
                say({"error": f"unknown command {line.strip()!r} (kill I with 0 < I < {len(nodes)}, stop)"})
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                ray.shutdown()
            with contextlib.suppress(Exception):
                cluster.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrator.cluster.local")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--object-store", type=int, default=OBJECT_STORE_BYTES)
    p.add_argument("--node-backend")
    a = p.parse_args(argv)
    return _serve(a.nodes, a.dir, a.cpus, a.object_store, a.node_backend)


if __name__ == "__main__":
    sys.exit(main())
