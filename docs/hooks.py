"""mkdocs hook: the reference pages that are generated from the code at build time, so they
cannot drift from it.

A page asks for a generated part with a marker comment on a line of its own; the hook
replaces it with markdown made from the code itself:

- ``<!-- petri:cli -->``: every command of the ``petri`` typer app (``orchestrator.cli.app``),
  walked as the click commands typer builds: usage, description, arguments, options;
- ``<!-- petri:records -->``: the records ``import petri`` exports (``petri.Record``
  subclasses), each with its docstring and typed fields; ``to_json()`` of a record is the
  ``--json`` document;
- ``<!-- petri:errors -->``: every ``PetriError`` class with its exit code and its message
  template (the class's docstring);
- ``<!-- petri:events -->``: the closed set of event names and the keys each must carry;
- ``<!-- petri:config-unknown-key -->``: what petri says of an unknown key in the
  configuration file, which lists every key it knows.

On GitHub the markers are invisible and each page says where the list comes from. The
hook imports petri from the environment mkdocs runs in (the project's ``.venv``).

Caveat: click's help text is plain text; it is put in the page as markdown with ``*`` and
``_`` escaped, not reflowed.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from typing import Any

MARKER = re.compile(r"^<!-- petri:([\w-]+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(m: re.Match[str]) -> str:
        if m[1] not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generator for <!-- petri:{m[1]} -->")
        return GENERATORS[m[1]]()
    out = MARKER.sub(replace, markdown)
    if "<!-- petri:" in out:  # a marker that is not alone on its line would stay an invisible comment
        raise ValueError(f"{page.file.src_path}: a <!-- petri:... --> marker must be alone on its line")
    return out


def _cell(text: Any) -> str:
    """Plain text as one table cell: one line, pipes and markdown's emphasis escaped."""
    s = " ".join(str(text).split()) if text not in (None, "") else ""
    return re.sub(r"([|*_<>])", r"\\\1", s)


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


# ----------------------------------------------------------------------------- the CLI


def _cli() -> str:
    import click
    import typer

    from orchestrator.cli import app as cli_app

    group = typer.main.get_command(cli_app.app)
    assert isinstance(group, click.Group)
    root = click.Context(group, info_name="petri")
    out = [_command(root, group, "petri")]
    for name in group.list_commands(root):
        cmd = group.get_command(root, name)
        if cmd is None or cmd.hidden:
            continue
        ctx = click.Context(cmd, info_name=name, parent=root)
        out.append(_command(ctx, cmd, f"petri {name}"))
    return "\n".join(out)


def _command(ctx: Any, cmd: Any, path: str) -> str:
    import click

    usage = " ".join(cmd.get_usage(ctx).split()).removeprefix("Usage: ")
    lines = [f"## `{path}`", ""]
    if cmd.help:
        lines += [_paragraphs(inspect.cleandoc(cmd.help)), ""]
    lines += ["```text", usage, "```", ""]
    args = [p for p in cmd.get_params(ctx) if isinstance(p, click.Argument)]
    # -h/--help is every command's, and said once at the top of the page
    opts = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden
            and p is not cmd.get_help_option(ctx)]
    if args:
        lines += ["| argument | required | help |", "| --- | --- | --- |"]
        for p in args:
            name = p.human_readable_name + (" ..." if p.nargs == -1 else "")
            lines.append(f"| {_code(name)} | {'yes' if p.required else 'no'} | {_cell(getattr(p, 'help', None))} |")
        lines.append("")
    if opts:
        lines += ["| option | value | default | help |", "| --- | --- | --- | --- |"]
        for p in opts:
            names = ", ".join(_code(n) for n in (*p.opts, *p.secondary_opts))
            value = "" if p.is_flag or p.count else _value(p)
            default = _default(p)
            repeat = p.multiple and "repeat" not in (p.help or "").lower()
            help_text = _cell(p.help) + (" (repeatable)" if repeat else "")
            lines.append(f"| {names} | {value} | {default} | {help_text} |")
        lines.append("")
    if isinstance(cmd, click.Group):
        lines += ["| command | what it does |", "| --- | --- |"]
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                first = (sub.help or "").strip().split("\n\n")[0]
                lines.append(f"| [`{name}`](#petri-{name}) | {_cell(first)} |")
        lines.append("")
    return "\n".join(lines)


def _value(p: Any) -> str:
    choices = getattr(p.type, "choices", None)
    if choices:
        return " \\| ".join(_code(str(c)) for c in choices)
    return _code(p.metavar or p.type.name.upper())


def _default(p: Any) -> str:
    import click

    d = p.default
    if d is None or callable(d) or d is getattr(click.core, "UNSET", object()) or d is False or d == () or d == []:
        return ""
    if p.is_flag and d is True:
        return "on"
    return _code(str(d))


def _paragraphs(text: str) -> str:
    """click's help text (paragraphs of wrapped lines) as markdown paragraphs; a paragraph
    that starts with click's no-rewrap mark (a ``\\b`` line) keeps its lines, as a block."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        if not para.strip():
            continue
        if para.lstrip(" ").startswith("\b"):
            lines = [line for line in para.splitlines() if line.strip() != "\b"]
            out.append("```text\n" + inspect.cleandoc("\n".join(lines)) + "\n```")
        else:
            out.append(re.sub(r"(?<![`\w])([*_])", r"\\\1", " ".join(para.split())))
    return "\n\n".join(out)


# ---------------------------------------------------------------------- JSON documents


def _records() -> str:
    import petri

    out = []
    for name in petri.__all__:
        cls = getattr(petri, name)
        if not (inspect.isclass(cls) and issubclass(cls, petri.Record)) or cls is petri.Record:
            continue
        fields = [f for f in dataclasses.fields(cls) if not f.name.startswith("_") and f.name != "extra"]
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # an annotation that names a type only a type checker imports
            hints = {}
        bases = [b.__name__ for b in cls.__bases__ if b is not petri.Record]
        out += [f"## `{name}`", ""]
        if bases:
            out += [f"Everything a {' / '.join(f'[`{b}`](#{b.lower()})' for b in bases)} has, and:", ""]
        out += [_paragraphs(inspect.cleandoc(cls.__doc__ or "")), ""]
        out += ["| key | type |", "| --- | --- |"]
        for f in fields:
            key = cls.aliases.get(f.name, f.name)  # the document's key (``from``), not the field's
            out.append(f"| `{key}` | {_cell(_type_name(hints.get(f.name, f.type)))} |")
        out.append("")
    return "\n".join(out)


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    text = getattr(t, "__name__", None) if isinstance(t, type) else None
    text = text or str(t)
    return re.sub(r"\b(typing|collections\.abc|orchestrator\.results|builtins)\.", "", text).replace("NoneType", "None")


# -------------------------------------------------------------------------- exit codes


def _errors() -> str:
    import petri

    for module in ("orchestrator.errors", "merge.errors", "snapshot.errors"):
        importlib.import_module(module)
    seen: dict[type, None] = {}

    def walk(cls: type) -> None:
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] in ("orchestrator", "merge", "snapshot") and sub not in seen:
                seen[sub] = None
                walk(sub)

    seen[petri.PetriError] = None
    walk(petri.PetriError)
    rows = sorted(seen, key=lambda c: (c.exit_code, c.__module__, c.__name__))
    out = ["| exit | error | category | message |", "| --- | --- | --- | --- |"]
    public = [getattr(petri, n) for n in ("UsageError", "NotFound", "Conflict", "Unsupported", "MarkersWritten")]
    for cls in rows:
        category = next((c.__name__ for c in public if issubclass(cls, c)), "PetriError")
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        out.append(f"| {cls.exit_code} | `{cls.__module__}.{cls.__name__}` | {category} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------ events


def _events() -> str:
    from orchestrator import events

    doc = events.__doc__ or ""
    # The module docstring's list of what each kind carries: its lines starting "- ``name``".
    listing = re.search(r"^- ``.*?(?=\n\n)", doc, re.S | re.M)
    described = listing[0].replace("``", "`") if listing else ""
    out = ["Every event has " + ", ".join(f"`{k}`" for k in events.COMMON) + ".", "",
           "| event | keys it always has, beside those |", "| --- | --- |"]
    for name, keys in events.KEYS.items():
        out.append(f"| `{name}` | {', '.join(f'`{k}`' for k in keys)} |")
    out += ["", "`via` is one of " + ", ".join(f"`{v}`" for v in sorted(events.VIAS)) + "; `schema` is "
            f"{events.SCHEMA}; the stream is `.petri/{events.FILE_NAME}`, rotated to "
            f"`.petri/{events.ROTATED_NAME}` past {events.ROTATE_BYTES >> 20} MiB.", ""]
    if described:
        out += ["What each kind carries (from `orchestrator.events`):", "", described, ""]
    return "\n".join(out)


# ---------------------------------------------------------------------- the config file


def _config_unknown_key() -> str:
    from pathlib import Path

    from orchestrator.config import parse_config
    from orchestrator.errors import ConfigError

    path = Path("/home/me/.config/petri/config.toml")
    try:
        parse_config(b"[limits]\nmemory = \"1G\"\n", path)
    except ConfigError as e:
        return f"```text\npetri: {e}\n```\n"
    raise AssertionError("an unknown key in the config file was accepted")


GENERATORS = {"cli": _cli, "records": _records, "errors": _errors, "events": _events,
              "config-unknown-key": _config_unknown_key}
