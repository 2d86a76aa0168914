"""The engine with its services composed around it: what the CLI, the API and the MCP
server open (``Engine.open``, ``Engine.init``).

``orchestrator.engine.Engine`` is the core (registry + store + backend + lock) and imports
no service. This subclass adds, around the core's operations, what the services know:
the audit trail (``audit.bind`` / ``touch``), KPI timings (``kpi.record``), forks of a
sandbox (``lineage.fork_source``), limits this machine can enforce and disk caps
(``runs.check_limits`` / ``after_fork``), staleness, and undoing a promotion (a stage
undoes the later stages of its pipeline first: ``stages.rollback_promotion``).

Why a subclass and not hooks inside the engine: none of these calls has to happen inside
an engine transaction (each runs before or after the core operation, outside its lock),
so the core needs no hook object; and every caller that already holds an ``Engine`` keeps
calling the same methods.

Caveats: code that builds a core ``orchestrator.engine.Engine`` directly gets no audit
entry ids, no KPI rows, no ``--from <sandbox>`` and only the syntax check of limits.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from . import audit, kpi
from . import engine as core
from .limits import Limits
from .registry import SandboxRow, SnapshotRow, now
import orchestrator

if TYPE_CHECKING:
    from .results import Rollback


class Engine(core.Engine):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        audit.bind(root, self.registry)  # the open audit scope learns which workspace it is about

    @classmethod
    def open(cls, start: Path | None = None, override: str | None = None, *, reap: bool = True) -> "Engine":
        engine = super().open(start, override, reap=reap)
        if reap:
            # A watch whose watcher died is recorded ``interrupted`` by the next command, not lost.
            if engine.registry.db.execute("SELECT 1 FROM watches WHERE state = 'watching' LIMIT 1").fetchone():
                engine.__dict__["_watches_interrupted"] = orchestrator.watch.settle_dead(engine)
        return engine

    def record_snapshot(self, row: SnapshotRow) -> SnapshotRow:
        row = super().record_snapshot(row)
        audit.touch(row.id)
        return row

    def fork_source(self, source: str) -> tuple[SnapshotRow, dict[str, Any]]:
        return orchestrator.lineage.fork_source(self, source)

    def fork(self, source: str = "live", n: int = 1, *, label: str | None = None,
             limits: Limits = core.NO_LIMITS, keep_expired: bool = False,
             ids: "list[str] | None" = None, system: bool = False,
             profile: str | None = None) -> list[SandboxRow]:
        started = now()
        made = super().fork(source, n, label=label, limits=limits, keep_expired=keep_expired, ids=ids,
                            system=system, profile=profile)
        if limits.disk_bytes:
            orchestrator.runs.after_fork(self, made)
        audit.touch(*(r.id for r in made))
        kpi.record(self.registry, "fork", now() - started, subject=made[0].id, detail={"n": n, "base": made[0].base})
        return made

    def destroy_sandbox(self, sb_id: str, *, state: str = "destroyed") -> None:
        super().destroy_sandbox(sb_id, state=state)
        audit.touch(sb_id)

    def check_limits(self, limits: Limits) -> dict[str, Any]:
        """Refuse limits this machine cannot enforce (exit 4) rather than pretend. Returns
        ``{"warnings": [...], "quotas_enabled": bool}``: what making them possible did (the
        first --disk on btrfs switches quotas on for the whole filesystem)."""
        got = super().check_limits(limits)
        if not (limits.mem_bytes or limits.cpus or limits.pids or limits.disk_bytes):
            return got  # nothing to enforce: keep the plain `petri fork` from importing the runner
        return orchestrator.runs.check_limits(self, limits)

    def staleness(self, row: SandboxRow, *, timed: bool = False) -> dict[str, Any] | None:
        """Live files changed since the sandbox's base, and which of them it changed too.
        ``timed``: append the computation's timing (``petri stats``); only a command that
        writes anyway asks for it (a race, for its winner): reading (``ls``, ``status``,
        the TUI, MCP) writes nothing, not even a timing row."""
        started = now()
        got = orchestrator.staleness.staleness(self, row)
        if timed:
            kpi.record(self.registry, "staleness", now() - started, subject=row.id)
        return got

    @contextmanager
    def one_look(self) -> Iterator[None]:
        """For a listing: every ``staleness`` inside looks at live once per base."""
        with orchestrator.staleness.one_look(self):
            yield

    def rollback_promotion(self, promo_id: str) -> Rollback:
        """Undo a promotion; a stage of a graduated promotion undoes the later stages of its
        pipeline first (orchestrator.stages)."""
        started = now()
        done = orchestrator.stages.rollback_promotion(self, promo_id)
        audit.touch(promo_id)
        kpi.record(self.registry, "rollback", now() - started, subject=promo_id, detail={"kind": "promotion"})
        return done

    def rollback_snapshot(self, ident: str) -> Rollback:
        done = super().rollback_snapshot(ident)
        audit.touch(done.restored)
        return done
