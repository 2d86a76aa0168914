#!/usr/bin/env bash
# Writes the demo's sample project into $1: a tiny Python package with a bug
# (median() of an even-length list is wrong) and a unittest suite that catches it.
set -euo pipefail
root=$1
mkdir -p "$root/stats" "$root/tests" "$root/.venv/bin" "$root/node_modules/left-pad"
cat > "$root/stats/__init__.py" <<'PY'
def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2]
PY
cat > "$root/tests/test_stats.py" <<'PY'
import unittest

from stats import mean, median


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)


if __name__ == "__main__":
    unittest.main()
PY
printf '.env\n.venv/\nnode_modules/\n__pycache__/\n' > "$root/.gitignore"
printf 'API_TOKEN=not-a-real-token\n' > "$root/.env"
printf '# a stand-in virtualenv\n' > "$root/.venv/bin/activate"
printf 'module.exports = (s, n) => s.padStart(n);\n' > "$root/node_modules/left-pad/index.js"
printf '# stats\n\nmean() and median() for lists of numbers.\n' > "$root/README.md"
