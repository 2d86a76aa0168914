"""The small project and workspace the API's tests (and the TUI's that drive the API) share:
the fixture ``ws`` (copy backend, via ``petri.init``) and the patches that fix or also touch it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import api_workspace


needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap")


def make_project(root: Path) -> Path:
    ws = root / "proj"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "test_calc.py").write_text("from pkg.calc import add\nassert add(2, 3) == 5, add(2, 3)\n")
    (ws / "notes.txt").write_text("one\ntwo\nthree\n")
    (ws / ".gitignore").write_text("__pycache__/\n")
    return ws


@pytest.fixture
def ws(tmp_path):
    with api_workspace(make_project(tmp_path)) as w:
        yield w


FIX = b"""--- a/pkg/calc.py
+++ b/pkg/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


ALSO_NOTES = b"""--- a/pkg/calc.py
+++ b/pkg/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return b + a
--- a/notes.txt
+++ b/notes.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""
