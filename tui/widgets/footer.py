"""The key bar at the bottom of a screen: Textual's ``Footer``, recomposed only when the
keys it shows changed.

Why: Textual's footer throws its keys away and composes them anew after every change of
the screen's bindings, and a screen's bindings are "changed" each time it comes back into
view (``l``, then ``escape``: both screens' footers) or the focus moves, also when every
key, description and state is what it was. Composing them (a dozen ``FooterKey`` widgets,
each styled by the stylesheet) was 20-60 ms of ``l`` and ``escape`` on a loaded two-core
machine (bench_tui), and the widgets it dropped were the cyclic garbage that set off the
garbage collector's full passes. What is shown is what the footer composes: the same
bindings give the same keys, so keeping them changes nothing on the screen.

Caveat: the signature is what ``Footer.compose`` reads of the screen's bindings; a Textual
whose footer shows more than that would need it added here.
"""
from __future__ import annotations

from typing import Any

from textual.widgets import Footer as _TextualFooter


class Footer(_TextualFooter):
    """Textual's footer, recomposed only when the keys it would show changed."""

    _shown: tuple[Any, ...] | None = None  # the signature of the keys composed last

    def _signature(self) -> tuple[Any, ...]:
        keys = tuple(
            (binding.key, binding.action, binding.description, binding.show, enabled, tooltip,
             binding.tooltip, binding.group, self.app.get_key_display(binding))
            for (_, binding, enabled, tooltip) in self.screen.active_bindings.values())
        return (keys, self.show_command_palette, self.app.ENABLE_COMMAND_PALETTE)

    async def recompose(self) -> None:
        if not self.is_attached or not self._bindings_ready:
            await super().recompose()
            return
        shown = self._signature()
        if shown == self._shown and self.children:
            return  # the same keys: the widgets already there show them
        self._shown = shown
        await super().recompose()
