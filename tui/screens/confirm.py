"""The confirmation every mutating action passes through: what will happen, the equivalent
``petri`` command (kept up to date as fields are edited), for promote and rollback the
dry-run plan, and Confirm / Cancel. Dismisses with the field values, or None."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static, TextArea

from ..actions import Request, plan_text


class ConfirmScreen(ModalScreen[dict[str, str] | None]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 90%; max-width: 100; height: auto; max-height: 95%;
                               border: thick $primary; background: $surface; padding: 0 1; }
    ConfirmScreen .title { text-style: bold; }
    ConfirmScreen #command { background: $boost; padding: 0 1; margin: 1 0 0 0; }
    ConfirmScreen #plan { height: auto; max-height: 12; }
    ConfirmScreen Input { margin: 0; }
    ConfirmScreen TextArea { height: 6; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmScreen Button { margin-left: 2; }
    ConfirmScreen.danger > Vertical { border: thick $error; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "confirm", "Confirm", show=True)]

    def __init__(self, request: Request, plan_loader: Any = None) -> None:
        super().__init__(classes="danger" if request.danger else "")
        self.request = request
        self.plan_loader = plan_loader  # async () -> plan record, or None

    def compose(self) -> ComposeResult:
        r = self.request
        with Vertical():
            yield Label(r.title, classes="title")
            for f in r.fields:
                if f.checkbox:
                    yield Checkbox(f.label, value=f.value == "1", id=f"f-{f.name}")
                    continue
                yield Label(f.label)
                if f.multiline:
                    yield TextArea(f.value, id=f"f-{f.name}")
                else:
                    yield Input(f.value, placeholder=f.placeholder, id=f"f-{f.name}")
            yield Static(self._command_text(), id="command")
            if r.plan_of is not None:
                with VerticalScroll(id="plan"):
                    yield Static(Text("dry run: planning…", style="dim"), id="plan-body")
            with Horizontal():
                yield Button("Cancel (esc)", id="cancel")
                yield Button("Confirm (ctrl+s)", id="confirm", variant="error" if r.danger else "primary")

    def on_mount(self) -> None:
        if self.plan_loader is not None:
            self.run_worker(self._load_plan, exclusive=True)
        first = self.query("Input, TextArea")
        (first.first() if first else self.query_one("#confirm", Button)).focus()

    async def _load_plan(self) -> None:
        try:
            plan = await self.plan_loader()
            body = Text(plan_text(self.request.action, plan))
        except Exception as e:  # noqa: BLE001 - a plan that cannot be made is said, not raised
            body = Text(f"dry run failed: {e}", style="bold red")
        self.query_one("#plan-body", Static).update(body)

    def values(self) -> dict[str, str]:
        out = {}
        for f in self.request.fields:
            w = self.query_one(f"#f-{f.name}")
            if isinstance(w, Checkbox):
                out[f.name] = "1" if w.value else ""
            elif isinstance(w, TextArea):
                out[f.name] = w.text
            else:
                assert isinstance(w, Input)  # compose makes a Checkbox, a TextArea or an Input
                out[f.name] = w.value
        return out

    def _command_text(self, values: dict[str, str] | None = None) -> Text:
        return Text.assemble(("$ ", "dim"), (self.request.command(values), "bold"))

    def _changed(self) -> None:
        self.query_one("#command", Static).update(self._command_text(self.values()))

    def on_input_changed(self, _: Input.Changed) -> None:
        self._changed()

    def on_text_area_changed(self, _: TextArea.Changed) -> None:
        self._changed()

    def on_checkbox_changed(self, _: Checkbox.Changed) -> None:
        self._changed()

    def on_input_submitted(self, _: Input.Submitted) -> None:
        self.action_confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "confirm":
            self.action_confirm()
        else:
            self.action_cancel()

    def action_confirm(self) -> None:
        self.dismiss(self.values())

    def action_cancel(self) -> None:
        self.dismiss(None)
