"""A real project nobody here wrote, for the end-to-end test and the race benchmark.

chardet 5.2.0 (pure Python, 754 tests in its own ``test.py``, about 30 s on one core here)
comes as its published sdist from PyPI; pytest and its three dependencies come as published
wheels. Every file is pinned by name and sha256 and downloaded once into a cache keyed by
that hash:

- ``$PETRI_TEST_CACHE`` when set, else ``/var/cache/petri-tests`` when it can be written
  (root), else ``~/.cache/petri-tests``; files live in ``<cache>/sha256/<hash>/<filename>``.

A clean clone downloads about 2.5 MB once; every later run (and the benchmark) reads the
cache and needs no network. Files are found through PyPI's JSON simple index (PEP 691), the
same index pip reads; ``RegistryUnreachable`` is raised only when the network or PyPI cannot
be reached (callers skip with its text). A hash that differs from the pin, or a file PyPI
does not list, is an error: the registry was reached and answered something else.

The workspace (``build_workspace``) is the sdist's tree as published, plus two things a
developer's checkout has: the project's real ``.gitignore`` (the sdist has none; it is the
file at tag 5.2.0 of github.com/chardet/chardet, blob ``37ed04a1``, checked by its git blob
id) and a ``.venv`` (``python3 -m venv`` + the pinned wheels, installed offline). That
``.gitignore`` lists ``*.pyc`` but neither ``__pycache__/`` nor ``.pytest_cache/``, so what a
test run leaves behind is not ignored by the project's own rules.

The bug, the candidates and the check are here too, so the test and the benchmark race the
same thing: the injected bug stops ``UTF8Prober`` counting two-byte characters (``>= 2``
becomes ``> 2``); the right patch restores it; the wrong patch tunes a constant that cannot
help (the count stays 0); the breaking command "fixes" the comparison but drops the colon,
so chardet no longer imports.

Caveats: the venv is made with this machine's ``/usr/bin/python3`` (Debian's 3.11), and its
absolute paths tie it to the workspace's path (fine for petri: sandboxes see the workspace
at its own path; a plain copy elsewhere must call ``.venv/bin/python -m pytest``, not the
``pytest`` script). hypothesis is deliberately not installed: chardet's ``test.py`` then
skips its property tests, which keeps the suite deterministic.
"""
from __future__ import annotations

import atexit
import difflib
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

INDEX = "https://pypi.org/simple"
PYTHON = "/usr/bin/python3"  # readable by everyone (a pyenv under /root is 0700)


class RegistryUnreachable(Exception):
    """PyPI could not be reached (no network, DNS, TLS, timeout): the only reason to skip."""


@dataclass(frozen=True)
class PypiFile:
    project: str
    filename: str
    sha256: str


SDIST = PypiFile("chardet", "chardet-5.2.0.tar.gz",
                 "1b3b6ff479a8c414bc3fa2c0852995695c4a026dcd6d0633b2dd092ca39c1cf7")
TEST_WHEELS = (
    PypiFile("pytest", "pytest-8.3.5-py3-none-any.whl",
             "c69214aa47deac29fad6c2a4f590b9c4a9fdb16a403176fe154b79c0b4d4d820"),
    PypiFile("pluggy", "pluggy-1.5.0-py3-none-any.whl",
             "44e1ad92c8ca002de6377e165f3e0f1be63266ab4d554740532335b9d75ea669"),
    PypiFile("iniconfig", "iniconfig-2.1.0-py3-none-any.whl",
             "9deba5723312380e77435581c6bf4935c94cbfab9b1ed33ef8d238ea168eb760"),
    PypiFile("packaging", "packaging-24.2-py3-none-any.whl",
             "09abb1bccd265c01f4a3aa3f7a7db064b36514d2cba19a2f694fe6150451a759"),
)

# github.com/chardet/chardet, tag 5.2.0 (commit 78250d91), .gitignore: git blob 37ed04a1.
GITIGNORE = b"*.pyc\n*.egg-info\n*.swp\nPKG-INFO\n/dist\n/build\n.hypothesis\n.cache\n.eggs\nwiki_*.txt\n"
GITIGNORE_BLOB = "37ed04a1c62369360a121678826de0abd140b399"
GITIGNORE_SOURCE = "github.com/chardet/chardet tag 5.2.0 (commit 78250d91), .gitignore blob 37ed04a1"

CHECK = ".venv/bin/python -m pytest -q"  # the project's own suite: test.py at the root
TESTS_PASSING = "754 passed"

BUGGY_FILE = "chardet/utf8prober.py"
GOOD_LINE = "                if self.coding_sm.get_current_charlen() >= 2:\n"
BAD_LINE = "                if self.coding_sm.get_current_charlen() > 2:\n"
WRONG_FROM = "    ONE_CHAR_PROB = 0.5\n"
WRONG_TO = "    ONE_CHAR_PROB = 0.25\n"
# The right comparison without its colon: a SyntaxError when chardet is imported.
BREAKING_CMD = "sed -i 's/get_current_charlen() > 2:/get_current_charlen() >= 2/' chardet/utf8prober.py"
# A test the bug (and the wrong patch) fails: Greek in UTF-8 is all two-byte characters.
FAILING_TEST = "test.py::test_encoding_detection[tests/utf-8/_ude_greek.txt-utf-8]"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache_dir() -> Path:
    env = os.environ.get("PETRI_TEST_CACHE")
    if env:
        return Path(env)
    system = Path("/var/cache/petri-tests")
    try:
        system.mkdir(parents=True, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    return Path.home() / ".cache" / "petri-tests"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _get(url: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()
    except urllib.error.HTTPError:
        raise  # PyPI answered: not a reason to skip
    except (urllib.error.URLError, socket.timeout, ConnectionError, ssl.SSLError) as e:
        reason = getattr(e, "reason", e)
        raise RegistryUnreachable(f"PyPI cannot be reached ({url}: {reason})") from None


def fetch(f: PypiFile) -> Path:
    """The file from the cache, downloading it first if absent; its sha256 always checked."""
    dest = cache_dir() / "sha256" / f.sha256 / f.filename
    if dest.exists():
        if _sha256(dest) == f.sha256:
            return dest
        dest.unlink()  # a corrupted cache entry: fetch it again
    index = json.loads(_get(f"{INDEX}/{f.project}/", "application/vnd.pypi.simple.v1+json"))
    entry = next((e for e in index["files"] if e["filename"] == f.filename), None)
    if entry is None:
        raise RuntimeError(f"PyPI does not list {f.filename} under {f.project}")
    if entry["hashes"].get("sha256") != f.sha256:
        raise RuntimeError(f"PyPI's sha256 for {f.filename} is {entry['hashes'].get('sha256')}, pinned {f.sha256}")
    data = _get(entry["url"])
    got = hashlib.sha256(data).hexdigest()
    if got != f.sha256:
        raise RuntimeError(f"downloaded {f.filename} has sha256 {got}, pinned {f.sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Another session may fetch the same file at once: write aside, then rename.
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return dest


def fetch_all() -> tuple[Path, list[Path]]:
    """The sdist and the test wheels, from the cache (raises RegistryUnreachable)."""
    return fetch(SDIST), [fetch(w) for w in TEST_WHEELS]


def build_workspace(dest: Path) -> None:
    """The sdist unpacked at ``dest`` (which must not exist) + its .gitignore + a .venv.

    Built once per process (``_template``), then copied (``cp -a``: modes and times as built)
    and its venv moved to ``dest`` (``relocate_venv``): a venv's build is ~2.7 s of CPU (venv,
    ensurepip, pip install), the copy ~0.25 s, and a session builds this workspace a score of
    times."""
    template = _template()
    subprocess.run(["cp", "-a", "--reflink=auto", "--", template, dest], check=True)
    relocate_venv(dest / ".venv", template / ".venv")


_TEMPLATE_PREFIX = "petri-test-chardet-"
_template_dir: Path | None = None


def _template() -> Path:
    """The workspace as ``build_workspace`` makes it, built in a private directory of this
    process under /var/tmp the first time (removed when the process exits; one a killed
    process left is removed by the next that builds one)."""
    global _template_dir
    if _template_dir is not None and _template_dir.exists():
        return _template_dir / "chardet-5.2.0"
    for d in Path("/var/tmp").glob(f"{_TEMPLATE_PREFIX}*-*"):
        pid = d.name[len(_TEMPLATE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)
    sdist, wheels = fetch_all()
    assert git_blob_id(GITIGNORE) == GITIGNORE_BLOB
    top = Path(tempfile.mkdtemp(prefix=f"{_TEMPLATE_PREFIX}{os.getpid()}-", dir="/var/tmp"))
    os.chmod(top, 0o755)  # the tree is root's; a sandbox's owner only ever sees the copies
    atexit.register(shutil.rmtree, top, True)
    dest = top / "chardet-5.2.0"
    dest.mkdir()
    # tar, not tarfile: as root it keeps the sdist's modes without chowning to its uids.
    subprocess.run(["tar", "-xzf", sdist, "--strip-components=1", "--no-same-owner", "-C", dest], check=True)
    (dest / ".gitignore").write_bytes(GITIGNORE)
    make_venv(dest / ".venv", wheels)
    _template_dir = top
    return dest


def relocate_venv(venv: Path, built_at: Path) -> None:
    """A venv copied from ``built_at`` made to work at ``venv``: its absolute path is in the
    scripts of ``bin/`` (shebangs, ``activate*``) and in ``pyvenv.cfg``, nowhere else that
    runs (the bytecode's file names are fixed on import)."""
    old, new = os.fsencode(built_at), os.fsencode(venv)
    for f in [*sorted((venv / "bin").iterdir()), venv / "pyvenv.cfg"]:
        if f.is_symlink() or not f.is_file():
            continue
        data = f.read_bytes()
        if old in data:
            st = f.stat()
            f.write_bytes(data.replace(old, new))
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def make_venv(venv: Path, wheels: list[Path]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index or find-links from the host's pip config
    subprocess.run([PYTHON, "-m", "venv", venv], check=True, env=env)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", *wheels], check=True, env=env)


def _replace_line(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected exactly one {old.strip()!r} in {BUGGY_FILE}"
    return text.replace(old, new)


def inject_bug(root: Path) -> None:
    p = root / BUGGY_FILE
    p.write_text(_replace_line(p.read_text(), GOOD_LINE, BAD_LINE))


def _patch(before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        "a/" + BUGGY_FILE, "b/" + BUGGY_FILE))


def candidate_patches(buggy_root: Path) -> tuple[str, str]:
    """(right, wrong) as unified diffs against the buggy tree."""
    buggy = (buggy_root / BUGGY_FILE).read_text()
    return (_patch(buggy, _replace_line(buggy, BAD_LINE, GOOD_LINE)),
            _patch(buggy, _replace_line(buggy, WRONG_FROM, WRONG_TO)))

