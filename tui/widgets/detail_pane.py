"""The detail pane under the sandbox table: Status, Diff, Logs and Lineage of the sandbox
under the cursor. The screen loads what a tab shows (in a worker) and hands it down with
``show_*``; the pane only renders.

The tabs are composed just after the first paint of the rows (``build_soon``, ``Built`` says
when): the sandbox table shows first, and the pane's widgets (and their imports and CSS,
100-300 ms) do not delay it. They used to be composed after the first frame, which came before
the registry's rows: the rows then waited for the pane."""
from __future__ import annotations

from typing import Any, Sequence, TypeVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from .. import format as fmt

_W = TypeVar("_W", bound=Widget)


class DetailPane(Vertical):
    DEFAULT_CSS = """
    DetailPane { height: 1fr; }
    DetailPane TabbedContent { height: 1fr; }
    DetailPane VerticalScroll { height: 1fr; }
    DetailPane RichLog { height: 1fr; }
    """

    class Built(Message):
        """The tabs are there: what they show can be loaded."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.sandbox: str | None = None
        self.built = False  # the tabs are mounted
        self._tabs = False  # compose them (after the first paint)
        self._active = "tab-status"  # the tab to open with (a key may choose one before the tabs are built)
        self._runs: dict[str, list[Any]] = {}  # sandbox -> its runs, as last read in full
        self._services: dict[str, list[Any]] = {}  # sandbox -> its services, as last read in full
        self._status: tuple[Any, Any] | None = None  # what the Status tab shows (for the clock)
        self._clock: tuple[str, str, str] | None = None  # its age and time left as last drawn

    def on_mount(self) -> None:
        # The app asks for the tabs once the first rows are painted (``build_soon``); the
        # timer is for a pane whose rows never come (a read that failed, say).
        self.set_timer(2.0, self.build_soon)

    def build_soon(self) -> None:
        """Compose the tabs after the next refresh (the one that paints the rows)."""
        if not self._tabs:
            self._tabs = True
            self.call_after_refresh(self._build)

    async def _build(self) -> None:
        await self.recompose()
        # A key that chose a tab while the tabs were being composed went to a TabbedContent
        # not yet mounted, whose mount then opened ``initial`` over it: open that tab now.
        from textual.widgets import TabbedContent

        tabs = self.query(TabbedContent)
        if tabs and tabs.first().active != self._active:
            tabs.first().active = self._active
        self.built = True
        self.post_message(self.Built())

    def compose(self) -> ComposeResult:
        if not self._tabs:
            return
        from textual.widgets import TabbedContent, TabPane

        from .output_log import OutputLog

        with TabbedContent(initial=self._active):
            with TabPane("1 Status", id="tab-status"):
                with VerticalScroll():
                    yield Static("no sandbox selected", id="status-body")
            with TabPane("2 Diff", id="tab-diff"):
                with VerticalScroll():
                    yield Static("", id="diff-body")
            with TabPane("3 Logs", id="tab-logs"):
                yield OutputLog(id="logs-body", max_lines=2000, wrap=False, markup=False)
            with TabPane("4 Lineage", id="tab-lineage"):
                with VerticalScroll():
                    yield Static("", id="lineage-body")
            with TabPane("5 Review", id="tab-review"):
                with VerticalScroll():
                    yield Static("", id="review-body")

    @property
    def active(self) -> str:
        from textual.widgets import TabbedContent

        tabs = self.query(TabbedContent)
        return tabs.first().active if tabs and self.built else self._active

    @active.setter
    def active(self, tab: str) -> None:
        from textual.widgets import TabbedContent

        self._active = tab  # kept until the tabs are built (``_build`` opens it then)
        tabs = self.query(TabbedContent)
        if tabs and self.built:
            tabs.first().active = tab

    # -- attributes down ------------------------------------------------------------------------
    def _widget(self, selector: str, kind: type[_W]) -> _W | None:
        """The tab's body, or None once the pane is gone: a worker's answer may arrive after
        its screen closed (CI's parallel run saw NoMatches fail the app's worker)."""
        from textual.css.query import NoMatches
        try:
            return self.query_one(selector, kind)
        except NoMatches:
            return None

    def _update(self, selector: str, body: Any) -> None:
        w = self._widget(selector, Static)
        if w is not None:
            w.update(body)

    def show_status(self, info: Any, model: Any, now: float) -> None:
        """The Status tab; a record without runs (the table's) keeps the runs last read in full."""
        runs = info.runs
        if runs is not None:
            self._runs[info.id] = runs
        services = info.services
        if services is not None:
            self._services[info.id] = services
        self._status = (info, model)
        self._clock = (info.id, fmt.age(info.created_at, now), fmt.time_left(info.expires_at, now, info.state).plain)
        self._update("#status-body", status_table(info, model, now, self._runs.get(info.id),
                                                   self._services.get(info.id)))

    def tick(self, now: float) -> None:
        """Once a second, while the Status tab shows: age and time left move."""
        if self._status is not None and self.built and self.active == "tab-status":
            info, model = self._status
            clock = (info.id, fmt.age(info.created_at, now), fmt.time_left(info.expires_at, now, info.state).plain)
            if clock != self._clock:  # past a minute both move once a minute: no repaint in between
                self._clock = clock
                self._update("#status-body", status_table(info, model, now, self._runs.get(info.id),
                                                           self._services.get(info.id)))

    def show_diff(self, diff: Any) -> None:
        if diff is None:
            body: Any = Text("the sandbox's tree is gone: no diff", style="dim")
        else:
            body = Text()
            body.append(f"{diff.sandbox or self.sandbox} against {diff.base}: {len(diff.files)} file(s)\n",
                        style="dim")
            for f in diff.files:
                body.append(f"{f.status[:1].upper()} ", style="bold")
                body.append(f"{f.path}  ")
                body.append_text(fmt.lines(f.lines_added, f.lines_removed))
                body.append("\n")
            body.append("\n")
            body.append_text(fmt.patch(diff.patch))
        self._update("#diff-body", body)

    def show_logs(self, lines: Sequence[tuple[str, str]], header: str) -> None:
        from .output_log import OutputLog

        log = self._widget("#logs-body", OutputLog)
        if log is None:
            return
        log.clear()
        log.write(Text(header, style="bold"))
        log.write_output(lines)

    def append_logs(self, lines: Sequence[tuple[str, str]]) -> None:
        from .output_log import OutputLog

        log = self._widget("#logs-body", OutputLog)
        if log is not None:
            log.write_output(lines)

    def show_review(self, review: Any, error: str | None = None) -> None:
        if error is not None:
            body = Text(f"no review: {error}", style="red")
        elif review is None:
            body = Text("the sandbox is gone: nothing to review", style="dim")
        else:
            body = review_text(review)
        self._update("#review-body", body)

    def show_lineage(self, info: Any, model: Any) -> None:
        self._update("#lineage-body", lineage_text(info, model))


def status_table(info: Any, model: Any, now: float, runs: list[Any] | None = None,
                 services: list[Any] | None = None) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    lim, use = info.limits or {}, info.usage or {}
    hit, won = model.race_rank(info.id)
    stale = info.stale or {}
    rows: list[tuple[str, Any]] = [
        ("sandbox", Text(f"{info.id}  {info.label or ''}")),
        ("state", fmt.state(info.state)),
        ("path", info.path or "-"),
        ("backend", info.backend or "-"),
        ("base", info.base or "-"),
        ("age / left", Text(fmt.age(info.created_at, now) + " / ").append_text(
            fmt.time_left(info.expires_at, now, info.state))),
        ("memory", fmt.against(use.get("peak_memory_bytes"), lim.get("mem_bytes"))),
        ("disk", fmt.against(use.get("disk_bytes"), lim.get("disk_bytes"))),
        ("limits", ", ".join(f"{k}={v}" for k, v in lim.items() if v not in (None, False)) or "none"),
        ("last exit", fmt.exit_code(info.last_exit_code)),
        ("stale", Text(f"{stale.get('live_changed', 0)} live file(s) changed since the base; ").append_text(
            Text(f"overlapping: {', '.join(stale.get('overlapping') or []) or 'none'}",
                 style="bold red" if stale.get("overlapping") else "")) if info.stale else Text("?", style="dim")),
        ("race", Text(f"{hit[0]} rank {hit[1]}" + (" (winner)" if won else "")) if hit else Text("-", style="dim")),
    ]
    for r in list(runs if runs is not None else info.runs or [])[-3:]:
        argv = list(r.argv or [])
        cmd = argv[2] if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] else " ".join(map(str, argv))
        rows.append((f"run {r.run}", Text(f"exit {r.exit_code}  {fmt.seconds(r.duration_s)}  ")
                     .append(fmt.one_line(cmd, 60), style="dim")))
    for sv in (services if services is not None else info.services or []):
        rows.append((f"service {sv.get('name')}", _service_line(sv, now)))
    for k, v in rows:
        t.add_row(k, v)
    return t


def _service_line(sv: dict[str, Any], now: float) -> Text:
    """A service as ``petri services`` lists it: state, pid or exit, uptime, restarts, ports."""
    state = str(sv.get("state") or "?")
    line = Text(state, style="green" if state == "running" else "yellow" if state == "restarting" else "dim")
    if state == "running":
        line.append(f"  pid {sv.get('pid')}")
        if sv.get("started_at"):
            line.append(f"  up {fmt.age(sv['started_at'], now)}")
    elif sv.get("exit_code") is not None:
        line.append("  exit ").append_text(fmt.exit_code(sv.get("exit_code")))
    if sv.get("restarts"):
        line.append(f"  restarts {sv['restarts']}")
    if sv.get("ports"):
        line.append("  ports " + ", ".join(map(str, sv["ports"])))
    return line.append("  ").append(fmt.one_line(str(sv.get("command") or ""), 50), style="dim")


def review_text(r: Any) -> Text:
    """``petri review`` for the pane: the policy's verdicts and risk, the checks, staleness, and
    the commands to approve or reject (the patch is the Diff tab's)."""
    t = Text()
    t.append(f"{len(r.files)} file(s) changed, ", style="dim")
    t.append_text(fmt.lines(r.lines_added, r.lines_removed))
    rejected = r.rejected
    if rejected:
        t.append(f"\nrejected {rejected.get('at')}: {rejected.get('reason')}", style="bold red")
    t.append("\n\npolicy\n", style="bold")
    if not r.policy:
        t.append("  no [policy] in the config\n" if r.risk is not None else "  the tree is gone\n", style="dim")
    for v in r.policy:
        bad = not v.get("ok")
        mark = "high" if bad and v.get("rule") == "risk" else "FAIL" if bad else "ok"
        t.append(f"  {mark:4} ", style="bold red" if bad else "green")
        t.append(f"{v.get('rule'):<13} {fmt.one_line(v.get('detail'), 90)}\n")
    if r.risk is not None:
        req = r.risk_requires or []
        t.append("  risk ", style="dim").append(str(r.risk), style="bold red" if r.risk == "high" else "")
        t.append(f" (requires {', '.join(req)})\n" if req else "\n")
    t.append("\nchecks\n", style="bold")
    if not r.checks:
        t.append("  no check has run in this sandbox\n", style="dim")
    for c in r.checks:
        if c.get("kind") == "race":
            t.append(f"  race {c.get('race')}: rank {c.get('rank')}, "
                     f"{'passed' if c.get('passed') else 'failed'}{', the winner' if c.get('winner') else ''}\n")
            continue
        ok = c.get("ok")
        t.append("  pass " if ok else "  FAIL ", style="green" if ok else "bold red")
        what = f"stage {c.get('stage')}" if c.get("kind") == "stage" else f"run {c.get('run')} ({c.get('kind')})"
        t.append(f"{what}: ").append(fmt.one_line(str(c.get("command") or ""), 70), style="dim").append("\n")
    st = r.stale
    t.append("\nstale  ", style="bold")
    t.append("unknown\n" if st is None else
             f"{st.get('live_changed', 0)} live file(s) changed since the base, "
             f"{len(st.get('overlapping') or [])} of them changed here too\n")
    if r.approve or r.reject:
        t.append("\ndecide\n", style="bold")
        for c in r.approve:
            t.append("  approve  ", style="green").append(f"{c}\n")
        for c in r.reject:
            t.append("  reject   ", style="red").append(f"{c}\n")
    return t


def lineage_text(info: Any, model: Any) -> Text:
    """The snapshot -> sandbox -> fork-of-a-fork chain that the rows hold (parent,
    generation), with this sandbox's children."""
    chain = [info]
    seen = {info.id}
    while chain[0].parent and chain[0].parent in model.sandboxes and chain[0].parent not in seen:
        chain.insert(0, model.sandboxes[chain[0].parent])
        seen.add(chain[0].id)
    out = Text()
    root = chain[0]
    out.append(f"{root.base or '?'}", style="bold cyan")
    out.append("  snapshot\n", style="dim")
    if root.parent and root.parent not in model.sandboxes:
        out.append(f"└─ {root.parent}", style="dim")
        out.append("  (parent, gone)\n", style="dim")
    depth = 0
    for node in chain:
        pad = "   " * depth
        out.append(f"{pad}└─ ")
        out.append(node.id, style="bold reverse" if node.id == info.id else "bold")
        out.append(f"  gen {node.generation}  {node.label or ''}  ", style="")
        out.append_text(fmt.state(node.state))
        out.append("\n")
        depth += 1
    kids = [s for s in model.sandboxes.values() if s.parent == info.id]
    for k in kids:
        out.append("   " * depth + "└─ ")
        out.append(k.id, style="bold")
        out.append(f"  gen {k.generation}  {k.label or ''}  ")
        out.append_text(fmt.state(k.state))
        out.append("\n")
    if info.generation and not info.parent:
        out.append(f"(generation {info.generation}; parent not recorded)\n", style="dim")
    return out
