"""Which cluster a race runs on, and this process's connection to it.

``--cluster`` takes a Ray address (``HOST:PORT`` of a running cluster's head, ``ray://HOST:PORT``
for Ray Client, ``auto`` for the cluster this machine belongs to) or ``local:N`` (a throwaway
cluster of N nodes here, :mod:`orchestrator.cluster.local`); the API's ``cluster=`` also takes
a started :class:`~orchestrator.cluster.local.LocalCluster`. The address is checked before
anything is made (exit 2), and so is that a Ray head answers there (``probe``: a TCP connect
and an HTTP/2 greeting, 3 s each, before Ray is imported; then one question to its GCS),
because ``ray.init`` retries for 20 s and more against an address where nothing or
something else answers (exit 1, one line). Ray is imported here and only here, on first use
(``import ray`` costs about half a second and ``import petri`` must not pay it).

A session connects with ``ray.init`` unless this process is connected already (a caller that
runs several races on one cluster), and disconnects at the end only what it connected; a
``local:N`` cluster it started, it also tears down.

Caveats:
- While a session holds Ray it changes two things of Ray's in this process, and puts them
  back at the end: for a local cluster, Ray's "cluster enabled" switch is off (else Ray,
  imported before with it on, turns 127.0.0.1 into this machine's outward address); and
  the messages Ray's driver prints on stdout (a raylet's death and its last log lines) go
  to the ``petri.cluster`` debug log, since ``--json`` owns stdout. Both are Ray internals
  of the pinned version, as is the GCS question (``ray._raylet.GcsClient``).
- While Ray is imported and connects, file descriptor 2 of the whole process is a temporary
  file (Ray's C++ core logs there from its own threads; what it wrote goes to the
  ``petri.cluster`` debug log): anything else this process writes to stderr meanwhile goes
  there too. Ray's lines after the connection (a node's death mid-race) still reach stderr.
- A head behind something that answers HTTP/2 for it (a proxy) is asked through that; a
  Ray Client address (``ray://``) gets the TCP and HTTP/2 checks only.
- ``ray://`` (Ray Client) and ``auto`` are passed to Ray as they are; only ``HOST:PORT`` and
  ``local:N`` are exercised by the tests here.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from typing import Any, Iterator

from .errors import BadClusterAddress, ClusterUnreachable, NotLoopbackOnly, RayMissing
from .local import _LOOPBACK_ENV, MAX_NODES, LocalCluster, listeners

_HOST_PORT = re.compile(r"(?:ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})")


def parse_address(cluster: Any) -> tuple[str, Any]:
    """("local", N) | ("given", LocalCluster) | ("ray", address); BadClusterAddress (exit 2)."""
    if isinstance(cluster, LocalCluster):
        return "given", cluster
    text = str(cluster).strip()
    if text.startswith("local:"):
        n = text[6:]
        if n.isdigit() and 1 <= int(n) <= MAX_NODES:
            return "local", int(n)
        raise BadClusterAddress(text=text, most=MAX_NODES)
    if text == "auto":
        return "ray", text
    m = _HOST_PORT.fullmatch(text)
    if m and 1 <= int(m.group(2)) <= 65535:
        return "ray", text
    raise BadClusterAddress(text=text, most=MAX_NODES)


def import_ray(loopback: bool) -> Any:
    """Ray, imported now; with ``loopback`` (a local cluster) told to bind only 127.0.0.1 in
    this process too, which works only when Ray was not imported before."""
    if loopback and "ray" not in sys.modules:
        os.environ.update(_LOOPBACK_ENV)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as e:
        raise RayMissing(why=str(e)) from None
    return ray


def _to_debug_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    log = logging.getLogger("petri.cluster")
    for line in data.get("lines", ()):
        log.debug("%s: %s", data.get("pid"), line)


PROBE_TIMEOUT_S = 3.0  # to connect, and again for the answer: a head that takes longer is not usable anyway

# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (a Ray head's GCS, the
# Ray Client server) answers with a SETTINGS frame of its own, whatever it serves.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe(address: str | None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast, in one line, where ``ray.init`` would retry for 20 s and more, printing its
    own log lines: nothing listens at HOST:PORT, nothing answers in time, or what answers
    does not speak gRPC. Ray is not imported for this. (``auto`` is Ray's to resolve.)"""
    import socket

    m = _HOST_PORT.fullmatch(address or "")
    if m is None:
        return
    host = m.group(1).strip("[]")
    try:
        sock = socket.create_connection((host, int(m.group(2))), timeout=timeout)
    except socket.timeout:
        raise ClusterUnreachable(address=address, why=f"no answer within {timeout:g} s") from None
    except OSError as e:
        raise ClusterUnreachable(address=address, why=f"nothing answers there ({e.strerror or e})") from None
    with sock:
        try:
            sock.settimeout(timeout)
            sock.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except socket.timeout:
            raise ClusterUnreachable(address=address, why=f"what listens there did not answer within {timeout:g} s;"
                                                          " it is not a Ray cluster's head") from None
        except OSError as e:
            raise ClusterUnreachable(address=address, why=f"the connection failed ({e.strerror or e})") from None
    if len(head) < 9 or head[3] != 0x04 or head[5:9] != b"\x00\x00\x00\x00":
        raise ClusterUnreachable(address=address, why="what listens there does not speak gRPC; it is not a Ray"
                                                      " cluster's head")


def _head_answers(ray: Any, address: str | None) -> None:
    """One question to the head's GCS (its cluster id), where ``ray.init`` would ask again
    for 20 s when something else speaks gRPC there (a proxy, another service)."""
    if address is None or address == "auto" or address.startswith("ray://"):
        return  # Ray's to resolve, or Ray Client's server, which has no GCS of its own to ask
    from ray._raylet import GcsClient

    try:
        GcsClient(address=address)
    except Exception as e:  # noqa: BLE001 - Ray's errors, translated at the boundary
        first = " ".join(str(e).split())[:200]
        raise ClusterUnreachable(address=address, why=f"it is not a Ray cluster's head ({first})") from None


@contextlib.contextmanager
def _stderr_to_log() -> Iterator[None]:
    """Ray's own log lines (its C++ core writes them to file descriptor 2, from its threads)
    go to the ``petri.cluster`` debug log while this holds, not to the terminal: an error
    is petri's one line."""
    import tempfile

    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            log = logging.getLogger("petri.cluster")
            for line in tmp.read(1 << 20).decode("utf-8", "replace").splitlines():
                log.debug("ray: %s", line)


class Session:
    """The connection a race holds while it runs: ``open()``, ``ray``, ``address``, ``close()``."""

    def __init__(self, cluster: Any) -> None:
        self.kind, self.arg = parse_address(cluster)
        self.local: LocalCluster | None = self.arg if self.kind == "given" else None
        self.owns_local = False
        self.owns_connection = False
        self.address: str | None = None if self.kind == "local" else (
            self.arg.address if self.kind == "given" else self.arg)
        self.ray: Any = None
        self.saved_enable: bool | None = None
        self.saved_print: Any = None

    @property
    def loopback(self) -> bool:
        return self.kind in ("local", "given")

    def open(self, say: Any = None) -> "Session":
        try:
            return self._open(say)
        except BaseException:
            self.close()
            raise

    def probe(self) -> None:
        """Whether a Ray head answers at the address given (``probe``): before anything is
        made, and before Ray is imported (half a second)."""
        if self.kind == "ray":
            probe(self.address)

    def _open(self, say: Any) -> "Session":
        self.probe()
        with _stderr_to_log():
            self.ray = import_ray(self.loopback)
        if self.loopback:
            # Ray imported earlier in this process, without the loopback setting, would turn
            # 127.0.0.1 into this machine's outward address (and bind there): not while we hold it.
            from ray._private import ray_constants
            self.saved_enable = ray_constants.ENABLE_RAY_CLUSTER
            ray_constants.ENABLE_RAY_CLUSTER = False
        if self.kind == "local":
            if say:
                say(f"starting a local Ray cluster of {self.arg} node(s) on 127.0.0.1")
            self.local = LocalCluster(self.arg).start()
            self.owns_local = True
            self.address = self.local.address
        ray = self.ray
        if not ray.is_initialized():
            probe(self.address)  # a local cluster's too: it may have died since it started
            with _stderr_to_log():
                _head_answers(ray, self.address)
                try:
                    ray.init(address=self.address, namespace="petri", log_to_driver=False,
                             logging_level=logging.ERROR, configure_logging=True)
                except Exception as e:  # noqa: BLE001 - Ray's errors, translated at the boundary
                    why = f"{type(e).__name__}: {e}".splitlines()[0]
                    raise ClusterUnreachable(address=self.address, why=why) from None
            self.owns_connection = True
        # Ray's driver prints what the cluster reports (a raylet's death, with its last
        # log lines) on stdout, where `--json` has its one document: the race reports node
        # deaths itself, so that goes to the debug log instead while the race holds Ray.
        from ray._private import worker as ray_worker
        self.saved_print = ray_worker.print_to_stdstream
        ray_worker.print_to_stdstream = _to_debug_log
        if self.loopback:
            wide = [ln for ln in listeners({os.getpid()}) if not ln.loopback]
            if wide:  # Ray was imported before without the loopback setting
                raise NotLoopbackOnly(listeners=", ".join(str(ln) for ln in wide))
        return self

    def close(self) -> None:
        if self.owns_connection and self.ray is not None:
            self.ray.shutdown()
            self.owns_connection = False
        if self.saved_print is not None:
            from ray._private import worker as ray_worker
            ray_worker.print_to_stdstream, self.saved_print = self.saved_print, None
        if self.saved_enable is not None:
            from ray._private import ray_constants
            ray_constants.ENABLE_RAY_CLUSTER, self.saved_enable = self.saved_enable, None
        if self.owns_local and self.local is not None:
            self.local.close()
            self.owns_local = False
