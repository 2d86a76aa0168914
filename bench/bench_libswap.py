"""Hand-written code against the library that could replace it (issue 21), old and new timed
interleaved in one process on the same input, with the load average.

patch: ``merge.patch.patch_and_stats`` as it is in this checkout (hunks and ``GIT binary
patch`` bodies from libgit2 through pygit2) against the hand-written version of a git revision
(``--old-rev``, default ``main``: its ``merge/patch.py`` loaded from ``git show`` as a module
of this checkout's ``merge`` package, so both share the change set, the tree reader and the
line diff). The input: a 10,000-file change set between two plain trees on ``/var/tmp``:
text files cut from this machine's Python standard library (small edits in the middle,
additions, deletions), and binaries (a small edit in a big file, rewrites, additions,
deletions). Timed: the patch with its stats, and the stats alone (``patch_stats``, what a
race's ranking asks). Checked: the two patches' text parts are equal byte for byte, and both
patches apply with ``git apply --check``.

ignore: ``merge.ignore.IgnoreRules`` (hand-written wildmatch, kept) against the same class
with each ``.gitignore``'s matching done by ``pathspec.GitIgnoreSpec`` (the candidate), on
a 10,000-path tree with a real project's nested ignore set (a Node and Python monorepo:
GitHub's Node and Python templates at the top, a few packages' own files below), walked
parents first as a change set walks (an ignored directory is not entered). Each walk is
also compared with what ``git ls-files --others --ignored --exclude-standard`` ignores. And
the index: ``merge.ignore.parse_index`` against ``pygit2.Index`` on the tree's own index
(10,000 entries), including ``import pygit2`` once.

Run from the repository root: ``.venv/bin/python -m bench.bench_libswap [--rounds 5]
[--only patch|ignore] [--old-rev main]``. Prints one markdown section on stdout (progress on
stderr). The trees live in a temporary directory under ``/var/tmp``, removed at the end.

Caveats: warm page cache (the trees were just written); the standard library is this
machine's (``/usr/lib/python3*``), so the text mix is Python; the pathspec adaptation asks
about a directory with a trailing slash, which is how pathspec spells one.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from .common import REPO, fmt_ratio, fmt_s, loadavg, log, percentile

N_FILES = 10_000


# -------------------------------------------------------------------------------- patch

def _old_patch_module(rev: str) -> types.ModuleType:
    src = subprocess.run(["git", "show", f"{rev}:merge/patch.py"], cwd=REPO, capture_output=True,
                         check=True).stdout
    spec = importlib.util.spec_from_loader("merge._patch_old", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "merge"
    sys.modules["merge._patch_old"] = mod
    exec(compile(src, f"{rev}:merge/patch.py", "exec"), mod.__dict__)
    return mod


def _stdlib_texts(limit: int) -> list[bytes]:
    roots = sorted(Path("/usr/lib").glob("python3.*"))
    out: list[bytes] = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            try:
                data = p.read_bytes()
            except OSError:
                continue
            if b"\0" in data[:8000] or not data:
                continue
            lines = data.splitlines(keepends=True)
            out.append(b"".join(lines[:400]))  # a source file's size, not a whole big module
            if len(out) >= limit:
                return out
    if not out:
        raise SystemExit("no Python standard library under /usr/lib to take text from")
    return out


def _edit(rng: random.Random, data: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(lines) + 1)
        n = rng.randrange(0, 3)
        lines[i:i + n] = [b"    changed = %d  # edited\n" % rng.randrange(1000)] * rng.randrange(0, 3)
    return b"".join(lines)


def build_patch_trees(work: Path, seed: int = 21) -> tuple[Path, Path, dict[str, int]]:
    rng = random.Random(seed)
    texts = _stdlib_texts(6000)
    base, new = work / "base", work / "new"
    counts = {"text modified": 7000, "text added": 1000, "text deleted": 500, "binary edited": 500,
              "binary rewritten": 500, "binary added": 300, "binary deleted": 200}
    unchanged = 2000

    def put(root: Path, rel: str, data: bytes) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def text(i: int) -> bytes:
        return texts[i % len(texts)]

    def binary(i: int, size: int) -> bytes:
        r = random.Random(i)
        # half noise, half structure: what images, archives and object files look like to zlib
        head = bytes(r.getrandbits(8) for _ in range(min(size // 2, 4096)))
        return b"\0BIN" + head + bytes(range(256)) * ((size - len(head)) // 256)

    k = 0
    for kind, n in counts.items():
        for _ in range(n):
            d = f"pkg{k % 97}/sub{k % 13}"
            if kind.startswith("text"):
                rel, data = f"{d}/mod_{k}.py", text(k)
                if kind == "text modified":
                    put(base, rel, data)
                    put(new, rel, _edit(rng, data))
                elif kind == "text added":
                    put(new, rel, data)
                else:
                    put(base, rel, data)
            else:
                rel = f"{d}/blob_{k}.bin"
                data = binary(k, rng.choice([2_000, 20_000, 200_000]))
                if kind == "binary edited":
                    put(base, rel, data)
                    cut = len(data) // 2
                    put(new, rel, data[:cut] + b"\0edited %d" % k + data[cut:])
                elif kind == "binary rewritten":
                    put(base, rel, data)
                    put(new, rel, binary(k + 10**6, len(data)))
                elif kind == "binary added":
                    put(new, rel, data)
                else:
                    put(base, rel, data)
            k += 1
    for _ in range(unchanged):
        rel = f"pkg{k % 97}/same_{k}.py"
        put(base, rel, text(k))
        put(new, rel, text(k))
        k += 1
    return base, new, counts


def _text_parts(patch: bytes) -> bytes:
    # Each file's section, binaries left out (their bodies legitimately differ: literal against delta).
    parts = patch.split(b"\ndiff --git ")
    return b"\n".join(p for p in parts if b"GIT binary patch\n" not in p)


def _git_apply_check(base: Path, patch: bytes, work: Path) -> str:
    repo = work / "apply"
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(base, repo)
    r = subprocess.run(["git", "apply", "--check", "-"], cwd=repo, input=patch, capture_output=True)
    shutil.rmtree(repo)
    return "ok" if r.returncode == 0 else "FAILED: " + r.stderr.decode(errors="replace")[:200]


def bench_patch(rounds: int, old_rev: str, work: Path) -> list[str]:
    from merge import patch as new_mod
    from merge.changes import tree_changes

    old_mod = _old_patch_module(old_rev)
    log("patch: building the trees")
    base, new, counts = build_patch_trees(work)
    changes = tree_changes(base, new)
    n_changes = len(changes)
    bin_changes = [c for c in changes if c.path.endswith(b".bin")]
    text_changes = [c for c in changes if not c.path.endswith(b".bin")]
    log(f"patch: {n_changes} changes; warming up")
    old_patch, old_stats = old_mod.patch_and_stats(changes, base, new)
    new_patch, new_stats = new_mod.patch_and_stats(changes, base, new)
    same_text = _text_parts(old_patch) == _text_parts(new_patch)
    same_stats = [(s.path, s.lines_added, s.lines_removed, s.binary) for s in old_stats] == \
        [(s.path, s.lines_added, s.lines_removed, s.binary) for s in new_stats]
    log("patch: git apply --check of both")
    apply_old = _git_apply_check(base, old_patch, work)
    apply_new = _git_apply_check(base, new_patch, work)
    times: dict[tuple[str, str], list[float]] = {}
    load_start = loadavg()
    for r in range(rounds):
        order = [("old", old_mod), ("new", new_mod)]
        if r % 2:
            order.reverse()
        for name, mod in order:
            for what, fn in (("patch", lambda m=mod: m.patch_and_stats(changes, base, new)),
                             ("text", lambda m=mod: m.patch_and_stats(text_changes, base, new)),
                             ("binary", lambda m=mod: m.patch_and_stats(bin_changes, base, new)),
                             ("stats", lambda m=mod: m.patch_stats(changes, base, new))):
                t0 = time.perf_counter()
                fn()
                times.setdefault((what, name), []).append(time.perf_counter() - t0)
        log(f"patch: round {r + 1}/{rounds}")
    load_end = loadavg()
    out = [f"### patch: hand-written ({old_rev}) against libgit2 bodies (this checkout)", "",
           f"{n_changes} changes ({', '.join(f'{v} {k}' for k, v in counts.items())}); "
           f"{rounds} rounds, old and new alternating first. Load average {load_start} at the start, "
           f"{load_end} at the end.", "",
           "| measure | hand-written p50 | libgit2 p50 | new / old | min old | min new |",
           "| --- | --- | --- | --- | --- | --- |"]
    for what, label in (("patch", f"patch + stats (`patch_and_stats`), all {n_changes}"),
                        ("text", f"... the {len(text_changes)} text files alone"),
                        ("binary", f"... the {len(bin_changes)} binaries alone"),
                        ("stats", "stats alone (`patch_stats`), all")):
        o, n = times[(what, "old")], times[(what, "new")]
        out.append(f"| {label} | {fmt_s(percentile(o, 50))} | {fmt_s(percentile(n, 50))} | "
                   f"{fmt_ratio(percentile(n, 50), percentile(o, 50))} | {fmt_s(min(o))} | {fmt_s(min(n))} |")
    out += ["", f"Patch size: hand-written {len(old_patch) / 1e6:.1f} MB, libgit2 {len(new_patch) / 1e6:.1f} MB. "
            f"Text parts equal byte for byte: {'yes' if same_text else 'NO'}; stats equal: "
            f"{'yes' if same_stats else 'NO'}; `git apply --check`: hand-written {apply_old}, libgit2 {apply_new}.", ""]
    return out


# -------------------------------------------------------------------------------- ignore

NODE_PY_GITIGNORE = b"""# Logs
logs
*.log
npm-debug.log*
yarn-debug.log*
yarn-error.log*
lerna-debug.log*
.pnpm-debug.log*
report.[0-9]*.[0-9]*.[0-9]*.[0-9]*.json
pids
*.pid
*.seed
*.pid.lock
lib-cov
coverage
*.lcov
.nyc_output
.grunt
bower_components
.lock-wscript
build/Release
node_modules/
jspm_packages/
web_modules/
*.tsbuildinfo
.npm
.eslintcache
.stylelintcache
.rpt2_cache/
.rts2_cache_cjs/
.node_repl_history
*.tgz
.yarn-integrity
.env
.env.development.local
.env.test.local
.env.production.local
.env.local
.cache
.parcel-cache
.next
out
.nuxt
dist
.cache/
.vuepress/dist
.temp
.docusaurus
.serverless/
.fusebox/
.dynamodb/
.tern-port
.vscode-test
.yarn/cache
.yarn/unplugged
.yarn/build-state.yml
.yarn/install-state.gz
.pnp.*
# Python
__pycache__/
*.py[cod]
*$py.class
*.so
.Python
develop-eggs/
downloads/
eggs/
.eggs/
/lib/
lib64/
parts/
sdist/
var/
wheels/
share/python-wheels/
*.egg-info/
.installed.cfg
*.egg
MANIFEST
*.manifest
*.spec
pip-log.txt
pip-delete-this-directory.txt
htmlcov/
.tox/
.nox/
.coverage
.coverage.*
nosetests.xml
coverage.xml
*.cover
*.py,cover
.hypothesis/
.pytest_cache/
cover/
*.mo
*.pot
instance/
.webassets-cache
.scrapy
docs/_build/
.pybuilder/
target/
.ipynb_checkpoints
profile_default/
ipython_config.py
.pdm.toml
__pypackages__/
celerybeat-schedule
celerybeat.pid
*.sage.py
.venv
env/
venv/
ENV/
env.bak/
venv.bak/
.spyderproject
.spyproject
.ropeproject
/site
.mypy_cache/
.dmypy.json
dmypy.json
.pyre/
.pytype/
cython_debug/
!dist/.keep
"""

NESTED = {
    "packages/web/.gitignore": b"/public/build\n*.map\n!vendor.js.map\n.svelte-kit/\n",
    "packages/api/.gitignore": b"generated/\n!generated/README.md\n*.sqlite3\n",
    "packages/docs/.gitignore": b"_site/\n.jekyll-cache/\n**/tmp/\n",
    "services/worker/.gitignore": b"*.prof\n/reports/**\n!/reports/keep/\n",
    "tools/.gitignore": b"*\n!*/\n!*.py\n!*.sh\n!.gitignore\n",
}


def build_ignore_tree(root: Path, seed: int = 7) -> int:
    rng = random.Random(seed)
    (root / ".gitignore").parent.mkdir(parents=True, exist_ok=True)
    (root / ".gitignore").write_bytes(NODE_PY_GITIGNORE)
    for rel, data in NESTED.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    kinds = [("src/{}.ts", 30), ("src/{}.py", 25), ("src/__pycache__/{}.cpython-311.pyc", 8),
             ("node_modules/m{}/index.js", 8), ("dist/{}.js", 3), ("build/{}.o", 2), ("{}.log", 2),
             ("generated/{}.ts", 3), ("public/build/{}.js", 2),
             ("tmp/{}.txt", 2), ("reports/{}.html", 2), ("{}.map", 3), ("docs/_build/{}.html", 2),
             (".venv/lib/{}.py", 4), ("tests/{}_test.py", 4)]
    weights = [w for _, w in kinds]
    places = ["packages/web", "packages/api", "packages/docs", "services/worker", "tools", "", "libs/core", "libs/ui"]
    n = len(NESTED) + 1
    made: set[str] = set()
    while n < N_FILES:
        tmpl = rng.choices(kinds, weights)[0][0]
        rel = os.path.join(rng.choice(places), tmpl.format(f"f{n}"))
        if rel in made:
            continue
        made.add(rel)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x\n")
        n += 1
    for keep in ("packages/api/generated/README.md", "services/worker/reports/keep/a.html", "dist/.keep"):
        p = root / keep
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"k\n")
    return n


def _pathspec_rules_class() -> type:
    import pathspec

    from merge import ignore

    class SpecRules:
        """One ignore file's verdicts from pathspec.GitIgnoreSpec (a line it rejects is skipped, as git does)."""

        def __init__(self, data: bytes):
            lines = []
            for raw in data.decode("utf-8", "surrogateescape").split("\n"):
                try:
                    pathspec.GitIgnoreSpec.from_lines([raw])
                except Exception:  # noqa: BLE001 - pathspec raises several kinds for a bad pattern
                    continue
                lines.append(raw)
            self.spec = pathspec.GitIgnoreSpec.from_lines(lines)
            self.live = any(p.include is not None for p in self.spec.patterns)

        def __bool__(self) -> bool:
            return self.live

        def verdict(self, rel: bytes, is_dir: bool) -> bool | None:
            got = self.spec.check_file(rel.decode("utf-8", "surrogateescape") + ("/" if is_dir else ""))
            return got.include

    class PathspecIgnoreRules(ignore.IgnoreRules):
        def __init__(self, root: bytes):
            super().__init__(root)
            self._outer = (SpecRules(ignore._read_beneath(self.root, b".git/info/exclude") or b""), SpecRules(b""))

        def rules_of(self, d: bytes):  # type: ignore[override]
            got = self._rules.get(d)
            if got is None:
                rel = d + b"/.gitignore" if d else b".gitignore"
                got = self._rules[d] = SpecRules(self._read(rel) or b"")
            return got

    return PathspecIgnoreRules


def _walk_ignored(root: bytes, rules) -> tuple[set[bytes], int]:
    """Every file the rules ignore, walking parents first and never entering an ignored directory."""
    ignored: set[bytes] = set()
    asked = 0
    stack = [b""]
    while stack:
        d = stack.pop()
        full = root + b"/" + d if d else root
        with os.scandir(full) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        for name, is_dir in entries:
            rel = d + b"/" + name if d else name
            if rel == b".git":
                continue
            asked += 1
            if rules.is_ignored(rel, is_dir):
                if is_dir:
                    for dp, _, fn in os.walk(root + b"/" + rel):
                        for f in fn:
                            ignored.add(os.path.relpath(os.path.join(dp, f), root))
                else:
                    ignored.add(rel)
            elif is_dir:
                stack.append(rel)
    return ignored, asked


def bench_ignore(rounds: int, work: Path) -> list[str]:
    from merge import ignore

    root = work / "ignore-tree"
    log("ignore: building the tree")
    n = build_ignore_tree(root)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    git = ["git", "-c", "core.excludesFile=/dev/null", "-c", "core.fsmonitor=", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=root, env=env, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, env=env, check=True)  # the index: every file not ignored
    # and untrack them again so the walk has ignored and untracked paths to decide on, with
    # a real 10k-entry-class index on disk to parse
    subprocess.run(["cp", ".git/index", ".git/index.full"], cwd=root, check=True)
    subprocess.run([*git, "rm", "-q", "-r", "--cached", "."], cwd=root, env=env, check=True)
    out = subprocess.run([*git, "ls-files", "-z", "--others", "--ignored", "--exclude-standard"], cwd=root, env=env,
                         capture_output=True, check=True).stdout
    oracle = {p for p in out.split(b"\0") if p}
    rb = os.fsencode(root)
    PathspecIgnoreRules = _pathspec_rules_class()
    impls = [("hand-written", lambda: ignore.IgnoreRules(rb)), ("pathspec", lambda: PathspecIgnoreRules(rb))]
    wrong: dict[str, int] = {}
    for name, make in impls:
        got, _ = _walk_ignored(rb, make())
        wrong[name] = len(got ^ oracle)
    times: dict[str, list[float]] = {}
    asked = 0
    load_start = loadavg()
    for r in range(rounds):
        order = impls if r % 2 == 0 else impls[::-1]
        for name, make in order:
            t0 = time.perf_counter()
            _, asked = _walk_ignored(rb, make())
            times.setdefault(name, []).append(time.perf_counter() - t0)
    # The index: the hand-written parser against pygit2's (its import timed once, on its own).
    index = root / ".git" / "index.full"
    fresh = "pygit2" not in sys.modules
    t0 = time.perf_counter()
    import pygit2
    import_s = time.perf_counter() - t0
    n_entries = len(ignore.parse_index(index.read_bytes()))
    for r in range(rounds * 4):
        order = [("index hand-written", lambda: ignore.parse_index(index.read_bytes())),
                 ("index pygit2", lambda: {os.fsencode(e.path) for e in pygit2.Index(str(index))})]
        if r % 2:
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            got = fn()
            times.setdefault(name, []).append(time.perf_counter() - t0)
            assert len(got) == n_entries, (name, len(got), n_entries)
    load_end = loadavg()
    hw, ps = times["hand-written"], times["pathspec"]
    ih, ip = times["index hand-written"], times["index pygit2"]
    out = ["### ignore: hand-written wildmatch against pathspec's GitIgnoreSpec; the index against pygit2", "",
           f"A {n}-file tree ({len(NESTED) + 1} .gitignore files: GitHub's Node and Python templates at the top, "
           f"{len(NESTED)} packages' own), walked parents first ({asked} paths asked, ignored directories not "
           f"entered); git ignores {len(oracle)} of the files. {rounds} rounds alternating first; the index "
           f"({n_entries} entries) {rounds * 4} rounds. Load average {load_start} at the start, {load_end} at the end.",
           "", "| measure | hand-written p50 | library p50 | library / hand-written | files wrong vs git (hw / lib) |",
           "| --- | --- | --- | --- | --- |",
           f"| walk with `is_ignored` (fresh rules each) | {fmt_s(percentile(hw, 50))} | {fmt_s(percentile(ps, 50))} | "
           f"{fmt_ratio(percentile(ps, 50), percentile(hw, 50))} | {wrong['hand-written']} / {wrong['pathspec']} |",
           f"| tracked set from `.git/index` | {fmt_s(percentile(ih, 50))} | {fmt_s(percentile(ip, 50))} | "
           f"{fmt_ratio(percentile(ip, 50), percentile(ih, 50))} | - |", "",
           f"`import pygit2`, paid once by a process that parses an index with it: {fmt_s(import_s)}"
           f"{'' if fresh else ' (already imported: not a real figure)'}.", ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["patch", "ignore"])
    ap.add_argument("--old-rev", default="main")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="petri-bench-libswap-", dir="/var/tmp"))
    try:
        lines = ["## bench_libswap: hand-written code against a library (issue 21)", ""]
        if a.only in (None, "ignore"):
            lines += bench_ignore(a.rounds, work)
        if a.only in (None, "patch"):
            lines += bench_patch(a.rounds, a.old_rev, work)
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
