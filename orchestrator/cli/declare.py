"""Declaring ``petri`` commands with typer, without loading typer until it is needed.

A command module declares its commands as typer reads them (``Annotated[..., typer.Option(...)]``
parameters, ``@app.command()``), but the hot commands' fast path (``orchestrator.cli.fastpath``)
calls those same functions without typer, which with click costs ~20 ms of imports. So:

- ``typer`` (and ``click``) here are stand-ins that import the module on first attribute use. A command module
  with ``from __future__ import annotations`` only names ``typer.Option`` in annotations,
  which typer itself evaluates when it builds the command; the fast path never does.
- ``command_app()`` gives a ``Commands``: its ``command()`` records exactly what
  ``typer.Typer.command()`` would (the function and the arguments), and ``typer_app(cls)``
  builds the real typer app from the records when a command goes through typer
  (``orchestrator.cli.app.load_command``, which gives its command class: this module never
  imports the app, which imports it).

Caveat: a body that touches ``typer.`` at run time (``raise typer.Exit(n)``) loads typer
there; the hot commands' bodies return their exit code instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import click
    import typer
else:
    class _Lazy:
        """A module, imported when an attribute is first read."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, name: str) -> Any:
            import importlib
            return getattr(importlib.import_module(self._name), name)

    typer = _Lazy("typer")
    click = _Lazy("click")  # ``click.Choice(...)`` in an annotation, evaluated by typer

# Every command app's settings (the root's too: orchestrator.cli.app).
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Commands:
    """The commands of one module, as ``typer.Typer.command()`` would register them."""

    def __init__(self) -> None:
        self.registered: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def command(self, *args: Any, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.registered.append((fn, args, kw))
            return fn
        return register

    def typer_app(self, cls: type, wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
                  ) -> "typer.Typer":
        """The typer app of these commands, each a click command of class ``cls`` (the app's
        ``JsonHelpCommand``). ``wrap`` (tests) replaces each function with one of the same
        signature, e.g. to see what typer calls it with."""
        app = typer_app()
        for fn, args, kw in self.registered:
            app.command(*args, **{"cls": cls, **kw})(wrap(fn) if wrap else fn)
        return app


def command_app() -> Commands:
    """What a command module registers its commands on."""
    return Commands()


def typer_app(**kw: Any) -> "typer.Typer":
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                       context_settings=CONTEXT, **kw)
