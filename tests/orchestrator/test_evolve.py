"""The population loop (``Workspace.evolve``): generations of races of forks of forks with
deterministic mutations, fitness from the check and the metrics it leaves; the known best
is found. Also the metrics file: never in a diff or a promotion, never read through a
symlink."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import petri
from orchestrator.evolve import read_metrics
from tests.conftest import api_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="needs root (cgroups) and bwrap")

TARGET = 12
# The check: value.txt must not pass TARGET; its score is how close it is.
SCORE = f"""import json
x = int(open("value.txt").read())
json.dump({{"score": -abs({TARGET} - x), "x": x}}, open(".petri-metrics.json", "w"))
raise SystemExit(0 if x <= {TARGET} else 1)
"""
# Candidate i of every parent adds STEPS[i]: from 0 the only way to exactly 12 in three
# generations through passing candidates is 7 -> 11 -> 12 (+7, +4, +1); a greedy "take the
# biggest step that passes" also gets there, a "smallest lines" race winner would not.
STEPS = (1, 2, 4, 7)
MUTATE = """x=$(cat value.txt)
case "$PETRI_CANDIDATE" in 0) d=1;; 1) d=2;; 2) d=4;; 3) d=7;; esac
echo $((x + d)) > value.txt
"""


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "value.txt").write_text("0\n")
    (root / "score.py").write_text(SCORE)
    (root / "mutate.sh").write_text(MUTATE)
    with api_workspace(root) as w:
        yield w


def value(ws: petri.Workspace, sb: str) -> int:
    return int(ws.read_file(sb, "value.txt").content)


def test_three_generations_of_four_find_the_known_best(ws):
    ev = ws.evolve("live", "sh mutate.sh", "python3 score.py", population=4, generations=3, keep=1)
    # the service built the record: every key of its document a typed field, in order, nothing in extra
    assert isinstance(ev, petri.Evolution) and dict(ev.extra) == {}
    assert list(ev.to_json()) == ["schema", "seed", "best", "best_fitness", "survivors", "generations", "metrics_file"]
    assert ev.metrics_file == ".petri-metrics.json" and petri.Evolution.from_doc(ev.to_json()) == ev
    assert value(ws, ev.best) == TARGET and ev.best_fitness["score"] == 0 and ev.best_fitness["passed"]
    assert len(ev.generations) == 3
    assert [len(g["candidates"]) for g in ev.generations] == [4, 4, 4]
    assert [value(ws, g["survivors"][0]) for g in ev.generations] == [7, 11, 12]
    # candidates that overshoot fail their check and are ranked after every passing one
    g3 = ev.generations[2]["candidates"]
    assert [c["fitness"]["passed"] for c in g3] == [True, False, False, False]
    assert g3[0]["metrics"] == {"score": 0, "x": 12}
    # the winner's lineage: seed -> gen 1 -> gen 2 -> gen 3, each a fork of the one before
    best = ws.sandbox(ev.best)
    chain = [best]
    while chain[-1].parent:
        chain.append(ws.sandbox(chain[-1].parent))
    assert [s.generation for s in chain] == [3, 2, 1, 0] and chain[-1].id == ev.seed
    nodes = {n.id: n for n in ws.lineage().nodes}
    assert nodes[ev.best].fitness == {"passed": True, "score": 0.0}
    assert nodes[ev.best].race == ev.generations[2]["races"][0]
    # losers are gone, survivors and parents stay; the evolution was one audited operation
    assert {s.id for s in ws.sandboxes()} == {c.id for c in chain}
    assert [e.op for e in ws.log().entries][-1] == "evolve"
    # the result promotes like any sandbox: everything since live, without the metrics file
    d = best.diff()
    assert [f.path for f in d.files] == ["value.txt"] and ".petri-metrics" not in d.patch
    best.promote()
    assert (ws.root / "value.txt").read_text() == f"{TARGET}\n"


def test_a_python_mutate_keep_two_and_a_fitness_function(ws):
    seen: list[tuple[int, int]] = []

    def mutate(parent: petri.Sandbox, generation: int, count: int) -> list:
        x = value(parent.workspace, parent.id)
        seen.append((generation, x))
        return [petri.Patch(text=f"--- a/value.txt\n+++ b/value.txt\n@@ -1 +1 @@\n-{x}\n+{x + d}\n",
                            name=f"+{d}") for d in STEPS[:count]]

    # 8 a generation, 2 kept: each parent gets 4 (the seed alone offers only 4 mutations)
    ev = ws.evolve("live", mutate, "python3 score.py", population=8, generations=3, keep=2,
                   fitness=lambda c: (c["metrics"] or {}).get("x", 0))  # the biggest x that passes
    assert value(ws, ev.best) == TARGET
    assert seen == [(1, 0), (2, 7), (2, 4), (3, 11), (3, 11)], "two parents from generation 2 on"
    assert len(ev.survivors) == 2 and [len(g["candidates"]) for g in ev.generations] == [4, 8, 8]


def test_bad_arguments_make_nothing(ws):
    for kw in ({"population": 0}, {"generations": 0}, {"keep": 5}, {"keep": 0}):
        with pytest.raises(petri.UsageError):
            ws.evolve("live", "true", "true", **kw)
    with pytest.raises(petri.UsageError):
        ws.evolve("live", "  ", "true")
    assert ws.sandboxes() == []


def test_metrics_are_read_safely_and_never_promoted(ws, tmp_path):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    assert read_metrics(tree) is None
    (tree / ".petri-metrics.json").write_text(json.dumps({"score": 3}))
    assert read_metrics(tree) == {"score": 3}
    assert [f.path for f in sb.diff().files] == []  # not a change
    assert sb.promote().promotion is None and not (ws.root / ".petri-metrics.json").exists()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"score": 1e9}))
    os.unlink(tree / ".petri-metrics.json")
    os.symlink(secret, tree / ".petri-metrics.json")
    assert read_metrics(tree) is None  # a symlink is never followed
    os.unlink(tree / ".petri-metrics.json")
    (tree / ".petri-metrics.json").write_text("[1, 2]")
    assert read_metrics(tree) is None  # not an object
    (tree / ".petri-metrics.json").write_text(json.dumps({"pad": "x" * (70 << 10)}))
    assert read_metrics(tree) is None  # too big
