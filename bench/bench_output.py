"""Output at disk speed (issue 18.2): a command's output through petri against the same
command under bare bwrap, and the start-up of ``petri run``.

Part ``output``. A workspace on the host's /var/tmp (copy backend: the output path does not
depend on the backend) with one sandbox; in its tree a 50 MiB text file (base64 lines, 77
bytes each). Three commands: ``true`` (the fixed cost), ``seq 1 200000`` (200k short lines,
1.3 MB) and ``cat`` of the 50 MiB file. Each round runs every (path, command) once, in an
order rotated per round (interleaved, so load that comes and goes hits all alike):

- floors: bare ``bwrap`` (the namespaces petri asks for, nothing else; ``bench_run``'s
  ``BWRAP_FLOOR``) with its stdout on a file; the same on a terminal (a pty this bench
  makes and drains as fast as it can, as a terminal emulator would); and, for context, the
  same piped into ``tee LOG > FILE`` (the two writes petri's CLI must make: its saved log
  and its stdout);
- petri's CLI: ``petri run SB -- CMD`` as a whole process, stdout on a file, and on a pty;
- petri's API: ``Workspace.run`` in this process (the output saved, not printed);
- petri's MCP server: ``sandbox_run`` (``argv``) through the SDK's client over stdio, one
  ``petri mcp`` for all of it.

For each path: p50 and min, the ratio to its floor (file, or terminal for the pty rows), and
the *output path's* own cost: p50 of CMD minus p50 of ``true`` on the same path, against the
same difference for the floor. Every sample checks the bytes that came out; each run's saved
logs are removed after it (untimed). It also counts the ``run.output`` events the runs wrote
(coalesced: at most about ten a second).

Part ``startup``. ``petri run SB true`` as a whole process beside ``python -c pass`` (the
venv's interpreter) and bare ``bwrap ... true``, interleaved; then ``-X importtime`` of
``petri run SB true``: what is left of its imports, the biggest first, and whether trio is
among them.

Prints one markdown section on stdout (progress on stderr). Run as root from the repository
root: ``.venv/bin/python -m bench.bench_output`` (``--rounds 10``, ``--part output|startup``).

Caveats: warm page cache; /var/tmp is the host's disk (ext4 here), where the floors and
petri write alike; the pty is drained by a Python thread, which may itself be the limit on
a busy machine (it is the same for the floor and petri); on 2 cores the command, petri and
the drainer compete for CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench.bench_run import BWRAP_FLOOR
from bench.common import (CACHE, PETRI, REPO, Report, Samples, cli_env, fmt_ratio, fmt_s, loadavg, log, remove_path,
                          run, sigterm_as_interrupt, sweep_stale_work_dirs, verdict)

PY = REPO / ".venv" / "bin" / "python"
PAYLOAD = 50 << 20
SEQ_N = 200_000
RATIO_TARGET = 1.5
STARTUP_TARGET_S = 0.060


def floor_argv(cmd: list[str]) -> list[str]:
    return BWRAP_FLOOR[:BWRAP_FLOOR.index("--") + 1] + cmd


def make_payload(path: Path) -> None:
    """PAYLOAD bytes of base64 text lines (76 characters and a newline)."""
    import base64

    line_bytes = 57  # -> 76 characters of base64
    raw = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left = PAYLOAD
        i = 0
        while left > 0:
            chunk = b"".join(base64.b64encode(raw[j:j + line_bytes]) + b"\n"
                             for j in range(i % 4096, (1 << 20) - line_bytes, line_bytes))
            f.write(chunk[:left])
            left -= min(left, len(chunk))
            i += 1


class Pty:
    """A terminal for a child: the slave for its stdout/stderr, the master drained by a thread."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.got = 0
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 1 << 16)
            except OSError:
                return  # EIO: every slave closed
            if not chunk:
                return
            self.got += len(chunk)

    def finish(self) -> int:
        self.thread.join(30)
        os.close(self.master)
        return self.got


class SetupFailed(Exception):
    """A petri run that exited 125: the sandbox did not start (its words are the message)."""


def spawn_time(argv: list[str], env: dict[str, str], cwd: Path, *, out: Path | None = None,
               tty: bool = False, shell: bool = False, err: Path | None = None) -> tuple[float, int, int]:
    """Wall time of one process from spawn to reaped, its exit code, and the bytes its stdout
    got (a file's size, or what the pty carried); stderr to ``err`` (else nowhere) off a pty."""
    term = Pty() if tty else None
    if term is not None:
        fd_out = os.dup(term.slave)
        os.close(term.slave)
    else:
        assert out is not None
        fd_out = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    devnull = os.open(err if err is not None else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                      0o644)
    actions = [(os.POSIX_SPAWN_DUP2, fd_out, 1), (os.POSIX_SPAWN_DUP2, fd_out if tty else devnull, 2)]
    if shell:
        argv = ["/bin/sh", "-c", argv[0]]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions)
        os.close(fd_out)  # the pty's reader sees EOF once the child's copies are gone too
        fd_out = -1
        _, status = os.waitpid(pid, 0)
        if term is not None:
            got = term.finish()
        dt = time.perf_counter() - t0
    finally:
        os.chdir(old)
        if fd_out >= 0:
            os.close(fd_out)
        os.close(devnull)
    if term is None:
        assert out is not None
        got = out.stat().st_size
    return dt, os.waitstatus_to_exitcode(status), got


class McpClient:
    """One ``petri mcp`` server and an SDK client session, driven from this thread."""

    def __init__(self, ws: Path) -> None:
        self.ws = ws
        self._calls: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "McpClient":
        import queue

        self._q: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        self._err: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._err is not None:
            raise self._err
        return self

    def _serve(self) -> None:
        import anyio

        async def main() -> None:
            import mcp_types as types
            from mcp.client.session import ClientSession
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=str(PY), args=["-m", "orchestrator.cli", "mcp"], cwd=str(self.ws),
                                           env=cli_env())
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w, client_info=types.Implementation(name="bench", version="1")) as s:
                    await s.initialize()
                    await s.list_tools()
                    self._ready.set()
                    while True:
                        item = await anyio.to_thread.run_sync(self._q.get)
                        if item is None:
                            return
                        name, args, box, done = item
                        try:
                            t0 = time.perf_counter()
                            res = await s.call_tool(name, args)
                            box["dt"] = time.perf_counter() - t0
                            if res.is_error:
                                raise RuntimeError(res.content[0].text)
                            box["doc"] = res.structured_content
                        except BaseException as e:  # noqa: BLE001 - handed to the caller
                            box["err"] = e
                        done.set()

        try:
            anyio.run(main, backend="trio")
        except BaseException as e:  # noqa: BLE001
            self._err = e
            self._ready.set()

    def call(self, name: str, args: dict) -> tuple[float, dict]:
        box: dict[str, Any] = {}
        done = threading.Event()
        self._q.put((name, args, box, done))
        done.wait(600)
        if "err" in box:
            raise box["err"]
        return box["dt"], box["doc"]

    def __exit__(self, *exc: object) -> None:
        self._q.put(None)
        if self._thread is not None:
            self._thread.join(30)


def output_part(rep: Report, rounds: int) -> None:
    import petri

    env = cli_env()
    work = CACHE / f"work-{os.getpid()}"
    ws = work / "ws"
    ws.mkdir(parents=True)
    pws = None
    try:
        (ws / "README").write_text("bench_output\n")
        run([PETRI, "init", "--backend", "copy", "--json", ws], env=env)
        sb = json.loads(run([PETRI, "fork", "--json"], env=env, cwd=ws).stdout)["sandboxes"][0]
        tree = Path(sb["path"])
        logs = ws / ".petri" / "logs" / sb["id"]
        log(f"workspace {ws}, sandbox {sb['id']}; writing the {PAYLOAD >> 20} MiB payload")
        make_payload(tree / "payload.txt")
        payload_host = str(tree / "payload.txt")
        seq_bytes = len(subprocess.run(["seq", "1", str(SEQ_N)], capture_output=True, check=True).stdout)
        cmds = {  # name -> (argv inside the sandbox, argv for bare bwrap, bytes it prints)
            "true": (["true"], ["/bin/true"], 0),
            "seq": (["seq", "1", str(SEQ_N)], ["/usr/bin/seq", "1", str(SEQ_N)], seq_bytes),
            "50 MiB": (["cat", "payload.txt"], ["/bin/cat", payload_host], PAYLOAD),
        }
        out_file = work / "stdout"
        tee_log = work / "tee.log"
        pws = petri.open(ws)

        def drop_logs() -> None:
            for p in logs.glob("*"):
                if p.is_file():
                    p.unlink()
                else:
                    remove_path(p)

        err_file = work / "stderr"

        def floor(cmd: str, mode: str) -> float:
            inside, bare, size = cmds[cmd]
            if mode == "tee":
                line = " ".join(floor_argv(bare)) + f" | tee {tee_log}"
                dt, rc, got = spawn_time([line], env, work, out=out_file, shell=True, err=err_file)
            else:
                dt, rc, got = spawn_time(floor_argv(bare), env, work, out=out_file, tty=mode == "tty", err=err_file)
            said = err_file.read_text(errors="replace").strip() if mode != "tty" else ""
            if rc != 0 and said.startswith("bwrap:"):
                raise SetupFailed(said)
            if rc != 0 or (mode != "tty" and got != size) or (mode == "tty" and got < size):
                raise RuntimeError(f"floor {cmd} {mode}: exit {rc}, {got} bytes, expected {size}")
            return dt

        def cli(cmd: str, mode: str) -> float:
            inside, _, size = cmds[cmd]
            dt, rc, got = spawn_time([str(PETRI), "run", sb["id"], "--", *inside], env, ws, out=out_file,
                                     tty=mode == "tty", err=err_file)
            if rc == 125:
                raise SetupFailed(err_file.read_text(errors="replace").strip() or "(said nothing: on the pty)")
            if rc != 0 or (mode != "tty" and got != size) or (mode == "tty" and got < size):
                raise RuntimeError(f"petri run {cmd} {mode}: exit {rc}, {got} bytes, expected {size}")
            drop_logs()
            return dt

        def api(cmd: str) -> float:
            inside, _, size = cmds[cmd]
            t0 = time.perf_counter()
            r = pws.run(sb["id"], inside)
            dt = time.perf_counter() - t0
            got = (r.extra.get("output") or {}).get("stdout", {}).get("bytes")
            if r.exit_code == 125:
                raise SetupFailed(str(r.extra.get("setup_error")))
            if r.exit_code != 0 or got != size or os.path.getsize(r.stdout_path) != size:
                raise RuntimeError(f"API run {cmd}: exit {r.exit_code}, {got} bytes, expected {size}")
            drop_logs()
            return dt

        with McpClient(ws) as mcp:
            def via_mcp(cmd: str) -> float:
                inside, _, size = cmds[cmd]
                dt, doc = mcp.call("sandbox_run", {"sandbox": sb["id"], "argv": inside})
                if doc["exit_code"] == 125:
                    raise SetupFailed(str(doc.get("setup_error")))
                if doc["exit_code"] != 0 or doc["output"]["stdout"]["bytes"] != size:
                    raise RuntimeError(f"MCP run {cmd}: {doc}")
                drop_logs()
                return dt

            paths: dict[str, Callable[[str], float]] = {
                "bare bwrap > file (floor)": lambda c: floor(c, "file"),
                "bare bwrap on a terminal (floor)": lambda c: floor(c, "tty"),
                "bare bwrap | tee LOG > file (two writes)": lambda c: floor(c, "tee"),
                "petri run (CLI) > file": lambda c: cli(c, "file"),
                "petri run (CLI) on a terminal": lambda c: cli(c, "tty"),
                "API Workspace.run": api,
                "MCP sandbox_run": via_mcp,
            }
            cells = [(p, c) for c in cmds for p in paths]
            samples = {cell: Samples() for cell in cells}
            failed: list[str] = []

            def sample(p: str, c: str) -> float:
                # On a machine shared with other work, a sandbox can fail to start (bwrap
                # losing a race with someone's mounts; petri's runner retries that twice
                # itself): count it, say why, and take the sample again.
                for _ in range(3):
                    try:
                        return paths[p](c)
                    except SetupFailed as e:
                        failed.append(f"{p}, {c}: {e}")
                        log(f"setup failed ({p}, {c}): {e}")
                raise RuntimeError(f"{p}, {c}: the sandbox did not start three times: {failed[-1]}")

            log("warming every path")
            for p, c in cells:
                sample(p, c)
            events_before = sum(1 for _ in pws.events())
            load_start = loadavg()
            log(f"{rounds} rounds of {len(cells)} cells")
            for i in range(rounds):
                for k in range(len(cells)):
                    cell = cells[(i * 5 + k) % len(cells)]
                    samples[cell].values.append(sample(*cell))
                log(f"round {i + 1}/{rounds} done (load {loadavg()})")
            load_end = loadavg()
        evs = [e.to_json() for e in pws.events() if e.event in ("run.output", "run.finished")]
        floor_of = {p: ("bare bwrap on a terminal (floor)" if "terminal" in p else "bare bwrap > file (floor)")
                    for p in paths}
        rep.section("Output through petri against bare bwrap",
                    f"{rounds} interleaved rounds; copy backend on the host's /var/tmp; `seq` = `seq 1 {SEQ_N}` "
                    f"({seq_bytes:,} bytes, {SEQ_N:,} lines); `50 MiB` = `cat` of a {PAYLOAD:,}-byte file of "
                    f"77-byte lines. Load average {load_start} at the start, {load_end} at the end. "
                    "*Output path* = p50 of the command minus p50 of `true` on the same path: what moving the "
                    "output costs, start-up aside. The target (the issue's \"the output path within 1.5x of the "
                    "same command under bare bwrap writing to a file\") is read as output path <= 1.5 x the floor's "
                    "p50 for the command (the terminal rows against the floor on a terminal); beside it the same "
                    "from the minima (the least disturbed samples on a shared machine), the whole runs' ratio, "
                    "and the stricter reading, against the floor's own output path (its p50 minus its `true`).")
        for c in ("seq", "50 MiB"):
            rows = []
            for p in paths:
                s, t = samples[(p, c)], samples[(p, "true")]
                f, ft = samples[(floor_of[p], c)], samples[(floor_of[p], "true")]
                own, fown = max(s.p50 - t.p50, 0.0), f.p50 - ft.p50
                own_min = max(min(s.values) - min(t.values), 0.0)
                if "floor" in p or "tee" in p:
                    rows.append([p, s.n, fmt_s(s.p50), fmt_s(min(s.values)), fmt_s(t.p50), fmt_s(s.p50 - t.p50)]
                                + ["-"] * 5)
                    continue
                rows.append([p, s.n, fmt_s(s.p50), fmt_s(min(s.values)), fmt_s(t.p50), fmt_s(own),
                             fmt_ratio(own, f.p50), verdict(own / f.p50, RATIO_TARGET),
                             fmt_ratio(own_min, min(f.values)), fmt_ratio(s.p50, f.p50),
                             "-" if fown < 0.002 else fmt_ratio(own, fown)])
            rep.text(f"**{c}**\n")
            rep.table(["path", "n", "p50", "min", "p50 of `true`", "output path", "/ floor p50", f"<= {RATIO_TARGET}x",
                       "the same, of the minima", "whole p50 / floor p50", "/ floor's own output path"], rows)
        per_run: dict[tuple[str, int], int] = {}
        took: dict[tuple[str, int], float] = {}
        for e in evs:
            key = (e["sandbox"], e["run"])
            if e["event"] == "run.output":
                per_run[key] = per_run.get(key, 0) + 1
            else:
                took[key] = e.get("duration_s") or 0.0
        over = [k for k, n in per_run.items() if n > took.get(k, 0.0) * 10 + 2]
        busiest = max(per_run, key=lambda k: (per_run[k], took.get(k, 0.0)), default=None)
        if failed:
            rep.text(f"{len(failed)} samples did not start their sandbox (petri: exit 125; bare bwrap: its own "
                     "error) and were taken again: " + "; ".join(f"`{f[:300]}`" for f in failed[:5]))
        rep.text(f"`run.output` events: {sum(per_run.values())} for {len(took)} petri runs (warm-up included); "
                 f"runs with more than ten a second of their duration plus two: {len(over)}"
                 + (f"; the most for one run: {per_run[busiest]} events in {took.get(busiest, 0.0):.2f} s"
                    if busiest else "") + f". The stream held {events_before} events before the rounds.")
    finally:
        if pws is not None:
            pws.close()
        run([PETRI, "rm", "--all", "--json"], env=env, cwd=ws, check=False)
        run([PETRI, "deinit", "--force", "--json"], env=env, cwd=ws, check=False)
        remove_path(work)


def importtime(argv: list[str], env: dict[str, str], cwd: Path) -> list[tuple[int, int, int, str]]:
    """``-X importtime`` of ``argv`` (a python -m command): (self us, cumulative us, depth, name)."""
    cp = subprocess.run([str(PY), "-X", "importtime", *argv], env=env, cwd=cwd, capture_output=True, text=True)
    rows = []
    for line in cp.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        a, b, name = line.split(":", 1)[1].split("|")
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((int(a), int(b), depth, name.strip()))
    return rows


def startup_part(rep: Report, rounds: int) -> None:
    env = cli_env()
    work = CACHE / f"work-{os.getpid()}"
    ws = work / "ws"
    ws.mkdir(parents=True)
    try:
        (ws / "README").write_text("bench_output\n")
        run([PETRI, "init", "--backend", "copy", "--json", ws], env=env)
        sb = json.loads(run([PETRI, "fork", "--json"], env=env, cwd=ws).stdout)["sandboxes"][0]["id"]
        out = work / "stdout"
        cmds = {
            "python -c pass": [str(PY), "-c", "pass"],
            "bare `bwrap ... true`": floor_argv(["/bin/true"]),
            "`petri run SB true`": [str(PETRI), "run", sb, "--", "true"],
        }
        for argv in cmds.values():  # warm the bytecode and page caches
            for _ in range(3):
                spawn_time(argv, env, ws, out=out)
        samples = {k: Samples() for k in cmds}
        names = list(cmds)
        load_start = loadavg()
        for i in range(rounds):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                dt, rc, _ = spawn_time(cmds[name], env, ws, out=out)
                if rc != 0:
                    raise RuntimeError(f"{name} exited {rc}")
                samples[name].values.append(dt)
        load_end = loadavg()
        py, bw = samples["python -c pass"], samples["bare `bwrap ... true`"]
        rows = []
        for name, s in samples.items():
            rows.append([name, s.n, fmt_s(s.p50), fmt_s(min(s.values)), fmt_ratio(s.p50, py.p50),
                         fmt_ratio(s.p50, bw.p50),
                         verdict(s.p50, STARTUP_TARGET_S) if name.startswith("`petri") else ""])
        rep.section("Start-up of `petri run`",
                    f"Whole processes (spawn to reaped), {rounds} interleaved rounds, bytecode cached; "
                    f"load average {load_start} at the start, {load_end} at the end.")
        rep.table(["command", "n", "p50", "min", "/ python -c pass", "/ bare bwrap",
                   f"<= {STARTUP_TARGET_S * 1000:.0f} ms"], rows)
        import petri

        with petri.open(ws) as pws:  # the run alone: no interpreter, no imports, an engine kept open
            api = Samples()
            for i in range(rounds + 3):
                t0 = time.perf_counter()
                r = pws.run(sb, ["true"])
                if i >= 3:
                    api.values.append(time.perf_counter() - t0)
                assert r.exit_code == 0
        rep.text(f"The run alone, `Workspace.run(SB, [\"true\"])` in a warm process (no interpreter start, no "
                 f"imports): p50 {fmt_s(api.p50)}, min {fmt_s(min(api.values))}, {api.n} runs. What `petri run` "
                 "adds to it is the interpreter, the imports below and opening the workspace.")
        # What is left: the median of 5 -X importtime runs per module, top-level and the biggest self times.
        runs_ = [importtime(["-m", "orchestrator.cli", "run", sb, "--", "true"], env, ws) for _ in range(5)]
        by: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for r in runs_:
            for a, b, depth, name in r:
                by.setdefault((depth, name), []).append((a, b))

        def med(xs: list[int]) -> int:
            return sorted(xs)[len(xs) // 2]

        top = sorted(((med([b for _, b in v]), name) for (d, name), v in by.items() if d == 0), reverse=True)
        total = sum(b for b, _ in top)
        selfs = sorted(((med([a for a, _ in v]), name) for (d, name), v in by.items()), reverse=True)
        trio = any(name == "trio" for _, name in selfs)
        rep.text(f"`-X importtime` of `petri run SB true` (median of 5; importtime itself slows imports): "
                 f"{total / 1000:.1f} ms of imports in all; trio imported: {'yes' if trio else 'no'}.\n")
        rep.table(["top-level import (with what it imports)", "cumulative"],
                  [[f"`{n}`", f"{b / 1000:.1f} ms"] for b, n in top[:12]])
        rep.table(["module (its own time)", "self"], [[f"`{n}`", f"{a / 1000:.1f} ms"] for a, n in selfs[:15]])
    finally:
        run([PETRI, "rm", "--all", "--json"], env=env, cwd=ws, check=False)
        run([PETRI, "deinit", "--force", "--json"], env=env, cwd=ws, check=False)
        remove_path(work)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds of the output part")
    ap.add_argument("--startup-rounds", type=int, default=40)
    ap.add_argument("--part", choices=("all", "output", "startup"), default="all")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_output: run as root (cgroups)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    sweep_stale_work_dirs()
    rep = Report("Output at disk speed (bench_output)", [sys.argv[0], *(argv or sys.argv[1:])])
    try:
        if args.part in ("all", "output"):
            output_part(rep, args.rounds)
        if args.part in ("all", "startup"):
            startup_part(rep, args.startup_rounds)
    finally:
        print(rep.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
