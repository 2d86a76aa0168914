"""The pure parts of what a sandbox's commands get from the host (orchestrator.run_env):
env_pass patterns, secret references, and the redaction of secrets in saved output."""
from __future__ import annotations

import pytest

from orchestrator.run_env import BadEnvPass, BadSecret, Redact, check_patterns, passed, read_secrets, redact_text


def test_passed_takes_only_what_a_pattern_names():
    environ = {"CI": "1", "PYTHONHASHSEED": "0", "PYTHON": "x", "HOME": "/root", "API_TOKEN": "t", "ci": "low"}
    assert passed(["CI", "PYTHON*"], environ) == {"CI": "1", "PYTHONHASHSEED": "0", "PYTHON": "x"}
    assert passed([], environ) == {}
    with pytest.raises(BadEnvPass):
        check_patterns(["A=B"])
    with pytest.raises(BadEnvPass):
        check_patterns([""])


def test_secret_references(tmp_path):
    (tmp_path / "f").write_bytes(b"v1\n")
    got = read_secrets([f"A=@{tmp_path / 'f'}", "B=env:X"], {"X": "v2"})
    assert got == {"A": b"v1\n", "B": b"v2"}
    for bad, why in (("A=value", "never the secret itself"), ("A=env:NOPE", "not set"), ("=@f", "use NAME"),
                     (f"A=@{tmp_path / 'missing'}", "cannot read"), ("1A=env:X", "use NAME")):
        with pytest.raises(BadSecret, match=why):
            read_secrets([bad], {"X": "v"})
    with pytest.raises(BadSecret, match="twice"):
        read_secrets(["A=env:X", "A=env:X"], {"X": "v"})


@pytest.mark.parametrize("cut", range(1, 30))
def test_redaction_across_every_chunk_boundary(cut):
    text = b"start hunter2-secret mid hunter2-secret end hunter2-sec"
    r = Redact([b"hunter2-secret\n"])
    out = r.feed(text[:cut]) + r.feed(text[cut:]) + r.flush()
    assert out == b"start *** mid *** end hunter2-sec"


def test_redaction_keeps_short_values_and_does_not_delay_what_cannot_be_a_secret():
    assert redact_text("a b c", [b"b"]) == "a b c"  # under 4 bytes: not redacted
    r = Redact([b"longsecret"])
    assert r.feed(b"line one\n") == b"line one\n"  # nothing held back: no secret starts here
    assert r.feed(b"x long") == b"x "
    assert r.feed(b"secret!") == b"***!"
