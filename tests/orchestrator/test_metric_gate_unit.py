"""The metric gate's pure parts: the config's check of a stage's ``metric``/``max_regression``
takes exactly what ``parse_metric`` takes (one rule, ``orchestrator/metric_spec.py``, in the
config's words there), and ``metric_gate.judge``'s verdicts and wording."""
from __future__ import annotations

import pytest

from orchestrator.config_schema import metric_spec_error
from orchestrator.errors import UsageError
from orchestrator.metric_gate import cache_key, change, judge
from orchestrator.metric_spec import Metric, parse_metric

pytestmark = pytest.mark.unit

SPECS = ["a.json:k", "a/b.json:time_s:max", "x:y.json:score:min", "m.json", ":k", "m.json:", "/etc/m.json:k",
         "a/../m.json:k", "..:k", "m.json:k:max:max", "m.json::max", ":max", "", "a:b:c", "dir/.petri-metrics.json:n"]
REGRESSIONS = [None, "10%", "0%", "12.5 %", "10", "-5%", "ten%", "%", " 3% "]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("reg", REGRESSIONS)
def test_the_configs_check_takes_exactly_what_parse_metric_takes(spec, reg):
    try:
        parse_metric(spec, reg)
        takes = True
    except UsageError:
        takes = False
    assert (metric_spec_error(spec, reg) is None) is takes, (spec, reg, metric_spec_error(spec, reg))


def test_judge_says_both_numbers_and_the_limit():
    lo = Metric("m.json", "time_s", max_regression=0.1)
    v = judge(lo, 13.0, {"metric": 10.0, "cached": True, "exit_code": 0})
    assert v["metric_ok"] is False and v["regression"] == pytest.approx(0.3) and v["base_metric_cached"] is True
    assert v["error"] == "time_s regressed 30.0% against the base (13 vs 10; at most 10%)"
    ok = judge(lo, 10.5, {"metric": 10.0})
    assert ok["metric_ok"] is True and ok["note"] == "time_s 10.5 against the base's 10 (5.0% worse; at most 10%)"
    hi = Metric("m.json", "n", higher=True, max_regression=0.15)
    assert judge(hi, 17.0, {"metric": 19.0})["metric_ok"] is True
    assert judge(hi, 7.0, {"metric": 19.0})["metric_ok"] is False
    # no number while the gate is on: fails; no number on the base: a warning, no gate
    assert judge(lo, None, {"metric": 10.0})["error"] == "the check left no number 'time_s' in m.json"
    w = judge(lo, 12.0, {"metric": None, "exit_code": 3})
    assert w["metric_ok"] is None and "on the base (exit 3): no regression was measured" in w["warning"]
    # no gate: only the number
    assert judge(Metric("m.json", "t"), 5.0, None) == {"metric": 5.0, "base_metric": None, "base_metric_cached": None,
                                                       "regression": None, "metric_ok": None}
    assert (change(0.105), change(-0.03), change(0.0)) == ("10.5% worse", "3.0% better", "unchanged")


def test_the_cache_key_holds_the_profile():
    m = Metric("m.json", "k")
    assert cache_key("s-1", ["c"], m, None) != cache_key("s-1", ["c"], m, "ci")
    assert cache_key("s-1", ["c"], m, None) != cache_key("s-1", ["c", "d"], m, None)
