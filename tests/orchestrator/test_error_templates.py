"""Error messages come from the first paragraph of each error class's docstring: a
template too long for one source line wraps, and the message is still one line."""
from __future__ import annotations

import pytest

from orchestrator import errors as E
from orchestrator.cluster.errors import BadClusterAddress
from snapshot.errors import PetriError

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


class _Wrapped(PetriError):
    """cannot frobnicate {what}: the frobnicator is
    out of order; try {other}

    Notes for readers, not part of the message.
    """


def test_a_wrapped_template_is_one_line_with_every_word():
    assert str(_Wrapped(what="x", other="y")) == "cannot frobnicate x: the frobnicator is out of order; try y"


# The messages as they were when these templates were one source line each.
WRAPPED = [
    (E.StoreFull(store="/s", doing="d"),
     "the filesystem of /s is full (d); free space (`petri rm`, `petri gc`, or outside petri) and try again"),
    (E.SandboxUserUnavailable(why="w"),
     "cannot run commands of the root-owned workspace as an unprivileged user: w;"
     " petri does not run them as host root"),
    (E.OwnersCannotBeMapped(workspace="/w", why="y"),
     "cannot run commands of the root-owned workspace /w: y; petri does not run them as host root"
     " (docs/guide/environment.md, \"Who runs the command\")"),
    (E.OwnerCannotRunPetri(owner="u", path="/p"),
     "this workspace's store belongs to u: petri run as root acts as that user there (so nothing it makes is root's),"
     " but /p is not readable by u; run petri as u"),
    (E.SeccompUnavailable(profile="default", why="w"),
     "cannot build the default syscall filter: w; install Debian's libseccomp2 and the Python package pyseccomp,"
     " or run with `--seccomp off`"),
    (BadClusterAddress(text="t", most=8),
     "bad --cluster 't': give a Ray address (HOST:PORT, ray://HOST:PORT or auto) or local:N with N from 1 to 8"),
    (E.BadDuration(what="--ttl", text="5x"),
     "bad --ttl '5x': use seconds, or a number with ms, s, m, h, d or w, or several together"
     " (e.g. 500ms, 90s, 15m, 2h, 1h30m, 2w)"),
    (E.BadSize(what="--mem", text="5X"),
     "bad --mem '5X': use bytes, or a number with K, M, G, T or P (also KB or KiB: powers of 1024; e.g. 512M, 1.5G)"),
]


@pytest.mark.parametrize("err,message", WRAPPED, ids=[type(e).__name__ for e, _ in WRAPPED])
def test_wrapped_templates_give_the_same_one_line_message(err, message):
    assert str(err) == message
