"""petri.aio mirrors the sync API: every public method of ``petri.Workspace``, ``Sandbox`` and
``SandboxSet`` (and the module's ``init``/``open``/``doctor``) has an async twin with the same
parameters (names, kinds, defaults), so a keyword the sync API grows cannot be forgotten or
swallowed by a ``**kw`` (the mirror had 20 such methods). The only parameters left out are the
sync iterators' thread plumbing, which cancelling the awaiting task replaces."""
from __future__ import annotations

import inspect

import pytest

import petri
import petri.aio as aio
from orchestrator import api

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


# sync-only plumbing: how a thread tells a blocking iterator to stop and how often it looks
THREAD_PLUMBING = {("events", "stop"), ("events", "poll_s"), ("output", "stop"), ("output", "poll_s"),
                   ("service_output", "stop")}
# no I/O (a record's JSON, a flag on the handle): the same plain methods in both
PLAIN = {"to_json", "keep"}


def _params(fn, method: str) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if (method, p.name) not in THREAD_PLUMBING]


def _public_functions(cls) -> dict[str, object]:
    out = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, v in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(v):
                out[name] = getattr(cls, name)
    return out


@pytest.mark.parametrize("sync_cls, aio_cls", [(api.Workspace, aio.Workspace), (api.Sandbox, aio.Sandbox),
                                               (api.SandboxSet, aio.SandboxSet)])
def test_every_public_method_has_an_async_twin_with_the_same_parameters(sync_cls, aio_cls):
    missing, differ, not_async = [], [], []
    for name, fn in _public_functions(sync_cls).items():
        twin = inspect.getattr_static(aio_cls, name, None)
        if twin is None:
            missing.append(name)
            continue
        twin = getattr(aio_cls, name)
        if name not in PLAIN and not (inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin)):
            if not inspect.isgeneratorfunction(fn) or not inspect.isasyncgenfunction(twin):
                not_async.append(name)
        if _params(fn, name) != _params(twin, name):
            differ.append(f"{name}: sync {inspect.signature(fn)} / aio {inspect.signature(twin)}")
    assert not missing, f"petri.aio.{aio_cls.__name__} lacks {missing}"
    assert not not_async, f"petri.aio.{aio_cls.__name__}: not async: {not_async}"
    assert not differ, "\n".join(differ)


def test_the_module_functions_match():
    for name in ("init", "open", "doctor"):
        assert _params(getattr(api, name), name) == _params(getattr(aio, name), name), name
        assert inspect.iscoroutinefunction(getattr(aio, name))


def test_no_async_method_swallows_keywords():
    for cls in (aio.Workspace, aio.Sandbox, aio.SandboxSet):
        for name, fn in _public_functions(cls).items():
            kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
            assert inspect.Parameter.VAR_KEYWORD not in kinds, f"petri.aio.{cls.__name__}.{name} takes **kw"


def test_an_audited_method_shows_its_reason_keyword():
    """``reason`` is taken by the audit wrapper; help() and this mirror see it in the signature."""
    for name in ("fork", "promote", "remove", "gc", "rollback", "try_", "rebase"):
        p = inspect.signature(getattr(petri.Workspace, name)).parameters.get("reason")
        assert p is not None and p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None, name
