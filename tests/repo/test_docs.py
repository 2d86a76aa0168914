"""The documentation: the site in docs/ builds with ``mkdocs build --strict`` (every nav
page exists, every link and anchor resolves, the generated references render), the
examples it marks as runnable run, and nothing in the repository points outside it.

Runnable examples: a fenced ```python or ```sh block right after a line
``<!-- docs-test: run ... -->`` (an HTML comment: invisible on the site and on GitHub) in
README.md or any page of docs/. Each block runs in a fresh directory holding ``calc.py``
(``add`` with a bug: ``x - y``), with this venv's ``petri`` and ``python`` first on PATH: a
python block as one script, a sh block line by line, each line expected to exit 0 (or one of
the codes in ``exit=0,1`` in the marker). A small extractor rather than pytest-examples: the
blocks are whole programs that need a directory and ``petri`` on PATH, not doctests, and the
shell lines need running too, which pytest-examples does not do; it would also bring black.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
MARK = re.compile(r"^<!-- docs-test: run\b(?P<opts>[^>]*)-->\n```(?P<lang>python|sh)\n(?P<body>.*?)^```$", re.M | re.S)
CALC = "def add(x, y):\n    return x - y\n"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def examples() -> list[tuple[str, str, str, tuple[int, ...]]]:
    found = []
    for path in doc_files():
        text = path.read_text()
        for m in MARK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            codes = re.search(r"exit=([\d,]+)", m["opts"])
            allowed = tuple(int(c) for c in codes[1].split(",")) if codes else (0,)
            found.append((f"{path.relative_to(REPO)}:{line}", m["lang"], m["body"], allowed))
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETRI_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's notice about its successor, on every build
    return env


def test_the_site_builds_strict_with_every_command_in_the_cli_reference(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # The generated reference pages hold what the code has: every command `petri --help` lists,
    # every event name, every public record, the error classes with their exit codes.
    helpdoc = subprocess.run([str(VENV_BIN / "petri"), "--json", "--help"], capture_output=True, text=True,
                             env=_env(), timeout=60)
    import json
    commands = [c["name"] for c in json.loads(helpdoc.stdout)["commands"]]
    assert len(commands) > 20
    cli = (site / "reference/cli/index.html").read_text()
    for name in commands:
        assert f'id="petri-{name}"' in cli, name
    assert "--on-conflict" in cli and "--keep-generations" in cli
    from orchestrator import events
    page = (site / "reference/events/index.html").read_text()
    assert all(name in page for name in events.NAMES)
    import petri
    page = (site / "reference/json/index.html").read_text()
    assert all(f'id="{n.lower()}"' in page for n in petri.__all__ if n in ("RunResult", "Race", "PromoteResult"))
    page = (site / "reference/exit-codes/index.html").read_text()
    assert "orchestrator.errors.BadDuration" in page and "merge.errors.PromotionConflict" in page
    page = (site / "reference/config/index.html").read_text()
    assert "unknown key (known: limits." in page
    page = (site / "reference/api/index.html").read_text()
    assert 'id="petri.Workspace.fork"' in page and 'id="petri.Sandbox.run"' in page


@pytest.mark.parametrize("where,lang,body,allowed", examples(), ids=[e[0] for e in examples()])
def test_the_docs_examples_run(tmp_path, where, lang, body, allowed):
    work = tmp_path / "proj"
    work.mkdir()
    (work / "calc.py").write_text(CALC)
    try:
        if lang == "python":
            steps = [[sys.executable, "-c", body]]
        else:
            steps = [["bash", "-c", line] for line in body.splitlines() if line.split("#", 1)[0].strip()]
        for argv in steps:
            r = subprocess.run(argv, cwd=work, env=_env(), capture_output=True, text=True, timeout=120)
            assert r.returncode in allowed, f"{where}: {argv[-1]!r} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    finally:
        if (work / ".petri").exists():  # what an example registered goes with everything it made
            subprocess.run([str(VENV_BIN / "petri"), "deinit", "-y", "--force"], cwd=work, env=_env(),
                           capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    assert str(work) not in Path("/proc/self/mountinfo").read_text()


def test_the_config_page_shows_a_valid_file_with_every_key():
    from orchestrator.config import parse_config
    from orchestrator.errors import ConfigError

    page = (REPO / "docs/reference/config.md").read_text()
    example = re.search(r"Every key is optional:\n\n```toml\n(.*?)^```", page, re.S | re.M)[1]
    cfg = parse_config(example.encode(), Path("/nowhere/config.toml"))  # raises on a key or value it refuses
    assert cfg.stages and cfg.kpi and cfg.env and cfg.masks
    with pytest.raises(ConfigError) as e:
        parse_config(b"no_such_key = 1\n", Path("/nowhere/config.toml"))
    known = re.search(r"\(known: (.*)\)$", str(e.value))[1]
    # "limits.{mem,cpus}, masks, kpi.*, stages[].{name,...}": each key, in its table where it has one
    def split(text: str, sep: str) -> list[str]:  # at sep, outside braces
        out, depth, i, last = [], 0, 0, 0
        while i < len(text):
            depth += (text[i] == "{") - (text[i] == "}")
            if depth == 0 and text.startswith(sep, i):
                out.append(text[last:i])
                i = last = i + len(sep)
                continue
            i += 1
        return [*out, text[last:]]

    def check(item: str, prefix: str = "") -> None:
        table, dot, rest = item.partition(".")
        if not dot:  # a key at the top, or a table of free names ([env])
            assert re.search(rf"^{re.escape(item)} *=", example, re.M) or f"[{prefix}{item}]" in example, item
            return
        table = prefix + table.removesuffix("[]")
        # profiles.<name>.limits: any name ([profiles.strict.limits]); a table of named ones
        # (profiles) is shown by one of them
        pat = re.escape(table).replace(re.escape("<name>"), r"[A-Za-z0-9_-]+")
        assert re.search(rf"^\[\[?{pat}[\].]", example, re.M), item
        for name in split(rest[1:-1] if rest.startswith("{") else rest, ","):
            if "." in name:  # a table inside the table: policy.{..., risk[].{paths,...}}
                check(name, table + ".")
            else:
                assert name == "*" or re.search(rf"^{re.escape(name)} *=", example, re.M), (item, name)

    for item in split(known, ", "):
        check(item)


def test_the_readme_example_is_one_that_runs():
    # The README's API example is executed (its marker is not lost in an edit).
    assert any(where.startswith("README.md:") and lang == "python" for where, lang, _, _ in examples())


def test_the_readme_links_resolve_on_github_too():
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (REPO / link).is_file(), link


def test_nothing_in_the_repository_points_outside_it():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    # The requirements this project was written against lived beside the repository, in a
    # folder a reader of the project alone cannot open; spelled in pieces so this file is
    # not itself a hit.
    folder = b"shar" + b"ed/"
    outside = re.compile(rb"\.\./" + folder + rb"|\b" + folder + rb"|\b(SP" + rb"EC|DES" + rb"IGN|STY" + rb"LE)\.md\b")
    bad = []
    for name in files.split(b"\0"):
        path = REPO / os.fsdecode(name)
        if name and path.is_file() and not path.is_symlink():
            for n, line in enumerate(path.read_bytes().splitlines(), 1):
                if outside.search(line):
                    bad.append(f"{os.fsdecode(name)}:{n}")
    assert not bad, bad


def test_the_tui_snapshot_report_is_not_part_of_the_repository():
    # pytest-textual-snapshot writes it where pytest runs when a screen differs
    tracked = subprocess.run(["git", "ls-files", "snapshot_report.html"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
    assert not tracked
    ignored = subprocess.run(["git", "check-ignore", "-q", "snapshot_report.html"], cwd=REPO)
    assert ignored.returncode == 0
