"""The configuration file's schema (orchestrator.config_schema) against what petri says about
it: the unknown-key message lists exactly the schema's keys, the format in config.py's
docstring is a file the schema takes, and the schema (with pydantic) is loaded only when a
file is read. Pure: no root, mount or sandbox."""
from __future__ import annotations

import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from pydantic import BaseModel

import orchestrator.config as config
from orchestrator.config_schema import ConfigModel
from orchestrator.errors import ConfigError

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

REPO = Path(__file__).resolve().parents[2]


def _expand(text: str) -> list[str]:
    """``a.{b,c.{d,e}}`` as ``a.b``, ``a.c.d``, ``a.c.e`` (the message's brace shorthand)."""
    depth, start = 0, None
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                assert start is not None
                parts, level, last = [], 0, start + 1
                for j in range(start + 1, i):  # split the inside at its own top-level commas
                    level += text[j] == "{"
                    level -= text[j] == "}"
                    if text[j] == "," and level == 0:
                        parts.append(text[last:j])
                        last = j + 1
                parts.append(text[last:i])
                return [x for p in parts for x in _expand(text[:start] + p + text[i + 1:])]
    return [text]


def _message_keys() -> set[str]:
    with pytest.raises(ConfigError) as e:
        config.parse_config(b"no_such_key = 1\n", Path("/etc/petri/config.toml"))
    listed = re.search(r"unknown key \(known: (.*)\)$", str(e.value))
    assert listed, str(e.value)
    entries, level, last, text = [], 0, 0, listed.group(1)
    for j, ch in enumerate(text):
        level += ch == "{"
        level -= ch == "}"
        if text[j:j + 2] == ", " and level == 0:
            entries.append(text[last:j])
            last = j + 2
    entries.append(text[last:])
    return {k for e in entries for k in _expand(e)}


def _models(tp: typing.Any) -> list[tuple[str, type[BaseModel]]]:
    """The models inside an annotation, each with how the message spells the step into it."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [("", tp)]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _models(a)]
    if origin is list:
        return [("[]" + s, m) for s, m in _models(args[0])]
    if origin is dict:
        return [(".<name>" + s, m) for s, m in _models(args[1])]
    return []


def _schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, f in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _models(f.annotation)
        if not inner:
            out.add(key)
        for step, m in inner:
            if m.__name__ == "KpiModel":  # its keys are the kpi module's, named by pattern
                out.add(f"{key}.*")
            elif m.__name__ == "PolicyModel" and prefix:  # a profile's policy: "the keys of [policy]"
                out.add(f"{key}{step}.*")
            else:
                out |= _schema_keys(m, f"{key}{step}.")
    return out


def test_the_unknown_key_message_names_exactly_the_schemas_keys():
    said, schema = _message_keys(), _schema_keys(ConfigModel)
    assert "limits.mem" in schema and "stages[].timeout" in schema and "policy.risk[].require" in schema
    assert said == schema, (sorted(schema - said), sorted(said - schema))


def test_the_format_in_the_docstring_is_a_file_the_schema_takes(tmp_path):
    doc = config.__doc__ or ""
    body = doc.split("top-level keys before the first ``[table]``)::\n\n", 1)[1].split("\nValidation is", 1)[0]
    text = "\n".join(line[4:] for line in body.splitlines())
    assert "[[stages]]" in text and "[profiles.strict.limits]" in text
    cfg = config.parse_config(text.encode(), tmp_path / "config.toml")
    assert cfg.mem_bytes == 2 << 30 and cfg.ttl_s == 7200 and cfg.seccomp == "default"
    assert [s.name for s in cfg.stages] == ["fresh"] and cfg.stages[0].timeout_s == 600
    assert cfg.profiles["strict"].limits["mem_bytes"] == 512 << 20
    assert cfg.kpi["fork_p95"] == 2.0 and cfg.kpi["race_success"] == 0.5


def test_a_bad_value_is_one_line_naming_the_key_and_the_file(tmp_path):
    path = tmp_path / "config.toml"
    with pytest.raises(ConfigError) as e:
        config.parse_config(b'[[stages]]\nname = "a"\ntarget = "fresh"\ntimeout = "soon"\n', path)
    line = str(e.value)
    assert line.startswith(f"{path}: key 'stages[0].timeout'") and "\n" not in line, line


def test_the_schema_and_pydantic_load_only_when_a_file_is_read(tmp_path):
    (tmp_path / "config.toml").write_text("[limits]\nmem = \"1G\"\n")
    code = ("import sys\n"
            "import orchestrator.config as c\n"
            "assert 'pydantic' not in sys.modules and 'orchestrator.config_schema' not in sys.modules\n"
            "assert c.load_config(None).path is None\n"
            "assert 'pydantic' not in sys.modules\n"
            f"assert c.parse_config(b'[limits]\\nmem = \"1G\"\\n', c.Path('{tmp_path}/config.toml')).mem_bytes"
            " == 1 << 30\n"
            "assert 'orchestrator.config_schema' in sys.modules\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
