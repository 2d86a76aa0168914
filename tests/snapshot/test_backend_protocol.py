"""Every backend implements the whole Backend protocol (snapshot/backend.py), with
compatible signatures; nothing above snapshot/ names a backend; the protocol's defaults
mean "cannot tell" on a real backend. mypy checks the same statically (strict, on the
protocol and the backends: ``[tool.mypy]`` in pyproject.toml)."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from snapshot.backend import FULL, Backend, DiskCap, Leftover
from snapshot.choose import BACKENDS, backend_class
from snapshot.errors import DiskLimitUnavailable, Unsupported
from snapshot.store import Store

REPO = Path(__file__).resolve().parents[2]


def protocol_members() -> dict[str, object]:
    """The protocol's methods as written in snapshot/backend.py (static and instance)."""
    return {n: v for n, v in vars(Backend).items()
            if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, staticmethod))}


def test_the_protocol_is_what_callers_need():
    # What callers once reached through getattr or backend-name switches: it stays behind the protocol.
    assert {"change_candidates", "shares_inodes", "live_record", "live_candidates", "live_unchanged_since",
            "snapshot_layers", "quiet_layers", "read_view", "quiet_view", "read_set", "disk_cap", "clone_usage",
            "note_usage", "remove_leftover", "reap_processes", "destroy_store", "convert",
            "available", "snapshot_origin", "snapshots_differ"} <= set(protocol_members())


def _compatible(proto: inspect.Signature, impl: inspect.Signature) -> list[str]:
    """Why a call that is valid against ``proto`` could fail against ``impl`` (empty: none)."""
    P = inspect.Parameter
    problems = []
    pparams = [p for p in proto.parameters.values() if p.name != "self"]
    iparams = [p for p in impl.parameters.values() if p.name != "self"]
    var_pos = any(p.kind is P.VAR_POSITIONAL for p in iparams)
    var_kw = any(p.kind is P.VAR_KEYWORD for p in iparams)
    positional = [p for p in iparams if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in iparams}
    used: set[str] = set()
    for i, pp in enumerate(pparams):
        if pp.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            if i >= len(positional):
                if not var_pos:
                    problems.append(f"takes no positional argument {i} ({pp.name})")
                continue
            ip = positional[i]
            used.add(ip.name)
            if pp.kind is P.POSITIONAL_OR_KEYWORD and (ip.name != pp.name or ip.kind is not P.POSITIONAL_OR_KEYWORD):
                problems.append(f"argument {i} must be {pp.name!r}, passable by name (is {ip.name!r}, {ip.kind})")
        elif pp.kind is P.KEYWORD_ONLY:
            ip = by_name.get(pp.name)
            if ip is None or ip.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD):
                if not var_kw:
                    problems.append(f"takes no keyword {pp.name!r}")
                continue
            used.add(ip.name)
        else:
            continue
        if pp.default is not P.empty and ip.default is P.empty:
            problems.append(f"{pp.name!r} has no default (the protocol's is {pp.default!r})")
    for ip in iparams:
        if ip.name not in used and ip.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and ip.default is P.empty:
            problems.append(f"extra argument {ip.name!r} without a default")
    return problems


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_implements_every_method(name):
    cls = backend_class(name)
    assert Backend in cls.__mro__ and cls.name == name and isinstance(cls.instant, bool)
    problems = []
    for meth, proto in protocol_members().items():
        impl = inspect.getattr_static(cls, meth, None)
        if impl is None:
            problems.append(f"{meth}: missing")
            continue
        if isinstance(proto, staticmethod) != isinstance(impl, staticmethod):
            problems.append(f"{meth}: {'must' if isinstance(proto, staticmethod) else 'must not'} be a staticmethod")
            continue
        pf = proto.__func__ if isinstance(proto, staticmethod) else proto
        impf = impl.__func__ if isinstance(impl, staticmethod) else impl
        problems += [f"{meth}: {p}" for p in _compatible(inspect.signature(pf), inspect.signature(impf))]
        # A protocol method whose body is only a docstring has no default: the backend
        # must define it itself.
        if impf is pf and _no_body(pf):
            problems.append(f"{meth}: not implemented (the protocol has no default for it)")
    assert not problems, f"{name}: " + "; ".join(problems)
    assert isinstance(cls(), Backend)


def _no_body(func) -> bool:
    """Is the function's body only its docstring (what mypy calls a protocol member
    without a default)?"""
    fn = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
    assert isinstance(fn, ast.FunctionDef)
    return all(isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) for st in fn.body)


def test_the_checker_catches_a_wrong_signature():
    class Broken(backend_class("copy")):  # type: ignore[misc, valid-type]
        def change_candidates(self, store, sb_id, since):  # drops arguments the callers pass
            return FULL

        def clone(self, store, snap_id, sb_id, budget):  # an extra argument nobody passes
            return Path()

    pc = inspect.signature(Backend.change_candidates)
    assert _compatible(pc, inspect.signature(Broken.change_candidates))
    assert _compatible(inspect.signature(Backend.clone), inspect.signature(Broken.clone))
    assert not _compatible(pc, inspect.signature(backend_class("btrfs").change_candidates))


# -- nothing above snapshot/ knows a backend --------------------------------------------------------

ABOVE = ("orchestrator", "merge", "tui", "petri")
NAMES = "btrfs|zfs|reflink|overlay|fuse|copy"
FORBIDDEN = [
    (re.compile(r"backend_name\s*(==|!=|\bin\b|\bnot in\b)"), "tests backend_name"),
    (re.compile(rf"(==|!=|\bin\b)\s*[(\[{{]?\s*[\"']({NAMES})[\"']"), "compares with a backend name"),
    (re.compile(r"(from|import)\s+snapshot\.backends\b|snapshot\.backends\.\w+"), "imports a backend module"),
    (re.compile(r"getattr\([^)]*backend"), "probes a backend with getattr"),
    (re.compile(r"backend\.\w+\(.*type:\s*ignore"), "reaches past the protocol"),
]


def test_no_backend_knowledge_above_snapshot():
    found = []
    for top in ABOVE:
        for path in sorted((REPO / top).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0] if "type: ignore" not in line else line
                for rx, why in FORBIDDEN:
                    if rx.search(code):
                        found.append(f"{path.relative_to(REPO)}:{n}: {why}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_scan_would_see_a_switch():
    lines = ['if engine.backend_name == "btrfs":', "from snapshot.backends.btrfs import delete_tree",
             'reap = getattr(self.backend, "reap_processes", None)', 'if name in ("overlay", "fuse"):',
             "engine.backend._record(store, row.id)  # type: ignore[attr-defined]"]
    for line in lines:
        assert any(rx.search(line) for rx, _ in FORBIDDEN), line
    assert not any(rx.search('backend=self.backend_name, state="creating"') for rx, _ in FORBIDDEN)


# -- the defaults, on a real backend that keeps no records -------------------------------------------

@pytest.fixture
def copy_store(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    be = backend_class("copy")()
    store = Store(ws)
    be.create_store(store)
    be.snapshot(store, "s-1", None)
    be.clone(store, "s-1", "sb-1")
    return be, store


def test_defaults_say_cannot_tell(copy_store):
    be, store = copy_store
    assert be.change_candidates(store, "sb-1", "s-1", "s-1") is FULL
    assert be.read_set(store, "sb-1") is None and be.quiet_layers(store, "sb-1") is None
    assert be.snapshot_layers(store, "s-1") is None and not be.shares_inodes()
    assert not be.live_unchanged_since(store, "s-1")
    with be.read_view(store, "s-1") as view, be.snapshot_view(store, "s-1") as same:
        assert view == same
    with be.quiet_view(store, "sb-1") as tree:
        assert tree == be.ensure_clone(store, "sb-1")
    with be.live_candidates(store, "s-1", lambda top: False) as got:
        assert got is None
    assert be.snapshot_origin(store, "s-1") is None
    assert be.snapshots_differ(store, "s-1", "s-1", lambda top: False) is None
    assert be.reap_processes(store, set()) == 0
    assert be.disk_refusals(store, "sb-1") is None and not be.enforces_disk_budget()
    assert DiskCap().hit(store, "sb-1", DiskCap().mark(store, "sb-1")) is False
    with pytest.raises(Unsupported):
        be.convert(store.workspace)
    with pytest.raises(Unsupported):
        be.map_owners(store, "sb-1", None)  # type: ignore[arg-type]


def test_the_copy_manifest_is_its_live_record(copy_store):
    be, store = copy_store
    keys, trusted = be.live_record(store, "s-1", 0.0)
    assert set(keys) == {b"a.txt"} and set(trusted) == {b"a.txt"}


def test_disk_cap_refusal_names_what_would_work(copy_store):
    be, store = copy_store
    from snapshot.osutil import fs_type
    if fs_type(store.root) == "xfs":
        pytest.skip("the store is on XFS: the project quota path applies")
    with pytest.raises(DiskLimitUnavailable) as e:
        be.disk_cap(store)
    assert e.value.exit_code == 4 and "copy backend on" in str(e.value) and "fuse" in str(e.value)


def test_clone_options_a_backend_cannot_honour_are_refused(copy_store):
    be, store = copy_store
    with pytest.raises(Unsupported):
        be.clone(store, "s-1", "sb-2", disk_budget=1 << 20)
    assert not store.sandbox_dir("sb-2").exists()


def test_default_leftover_removal_and_store_destruction(copy_store):
    be, store = copy_store
    stray = store.tmp / "stray.1"
    (stray / "d").mkdir(parents=True)
    os.chmod(stray / "d", 0o500)
    be.remove_leftover(store, Leftover("tree", stray))
    assert not stray.exists()
    be.destroy_store(store)
    assert not store.root.exists() and (store.workspace / "a.txt").exists()


# -- the static check --------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
def test_mypy_strict_on_the_protocol_and_the_backends():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
