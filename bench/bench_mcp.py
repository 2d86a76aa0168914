"""Time to first command through MCP.

On a btrfs image this bench makes and loop-mounts itself (released at the end, also on
Ctrl-C), with the demo's sample project as the workspace (btrfs backend), it times, 50 runs
each by default:

1. **floor**: ``bwrap ... true`` alone (the namespaces petri asks for, nothing else);
2. **API**: ``ws.fork(source=SNAP)`` + ``sb.run(["true"])`` through the public sync API
   (``petri.open``; one workspace object kept open);
3. **MCP**: a ``petri mcp`` server started once, driven by the MCP SDK's own client over
   stdio (as an agent's host would): ``sandbox_fork`` (from the snapshot) then ``sandbox_run``
   of ``true``, timed by the client from before the first request to after the second
   answer; each sandbox is removed (``sandbox_remove``) outside the timed part. Also the
   two calls apart, and an MCP ``ping`` (the protocol's own round trip).

Prints one markdown section on stdout (progress on stderr) for bench/RESULTS.md. Run as root
from the repository root: ``.venv/bin/python -m bench.bench_mcp`` (``--runs N``).

``--startup`` measures instead how long a new session takes (no loop image: the sample
project on the copy backend in a temporary directory): the SDK's client launching ``petri
mcp`` over stdio until ``initialize`` returns, and until ``tools/list`` returns (the SDK
loaded), beside the same client spawning and reaping ``python -c pass``, interleaved;
``--before DIR`` adds the same for the code in DIR (an earlier checkout, run by the same
interpreter with ``PYTHONPATH=DIR``).

Caveats: warm caches; the client and the server share the machine's two cores (as they do
on a developer's machine); p99 over 50 samples is close to the maximum.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_run import BWRAP_FLOOR
from bench.common import (REPO, Report, Samples, cli_env, fmt_s, log, loadavg, make_loopfs, measure, run,
                          sigterm_as_interrupt, sweep_stale_images, verdict)


async def mcp_samples(ws: os.PathLike, snap: str, runs: int) -> dict[str, Samples]:
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "orchestrator.cli", "mcp"], cwd=str(ws),
                                   env=cli_env())
    out = {k: Samples() for k in ("both", "fork", "run", "ping")}
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, client_info=types.Implementation(name="bench", version="1")) as s:
            await s.initialize()
            await s.list_tools()  # the client validates results against the output schemas

            async def call(name: str, args: dict) -> dict:
                res = await s.call_tool(name, args)
                if res.is_error:
                    raise RuntimeError(res.content[0].text)
                return res.structured_content

            async def once() -> tuple[float, float, str]:
                t0 = time.perf_counter()
                sb = (await call("sandbox_fork", {"from": snap}))["sandboxes"][0]["id"]
                t1 = time.perf_counter()
                doc = await call("sandbox_run", {"sandbox": sb, "argv": ["true"]})
                t2 = time.perf_counter()
                assert doc["exit_code"] == 0, doc
                return t1 - t0, t2 - t1, sb

            for _ in range(3):  # warm: imports, threads, the first cgroup
                *_, sb = await once()
                await call("sandbox_remove", {"ids": [sb]})
            for _ in range(runs):
                t_fork, t_run, sb = await once()
                out["both"].values.append(t_fork + t_run)
                out["fork"].values.append(t_fork)
                out["run"].values.append(t_run)
                await call("sandbox_remove", {"ids": [sb]})
            for _ in range(runs):
                t0 = time.perf_counter()
                await s.send_ping()
                out["ping"].values.append(time.perf_counter() - t0)
    return out


# What the `petri` script runs, so --before code is started the same way.
ENTRY = "import sys; from orchestrator.cli import main; sys.exit(main())"


async def startup_samples(ws: os.PathLike, runs: int, before: Path | None) -> dict[str, Samples]:
    """Spawn-to-initialized and spawn-to-tools/list of ``petri mcp`` (a new session each
    time), beside spawning and reaping ``python -c pass``, interleaved."""
    import anyio
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    out: dict[str, Samples] = {}

    async def floor() -> None:
        t0 = time.perf_counter()
        p = await anyio.open_process([sys.executable, "-c", "pass"])
        await p.wait()
        await p.aclose()
        out.setdefault("python -c pass", Samples()).values.append(time.perf_counter() - t0)

    async def session(label: str, env: dict[str, str]) -> None:
        params = StdioServerParameters(command=sys.executable, args=["-c", ENTRY, "mcp"], cwd=str(ws), env=env)
        t0 = time.perf_counter()
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w, client_info=types.Implementation(name="bench", version="1")) as s:
                await s.initialize()
                t1 = time.perf_counter()
                assert (await s.list_tools()).tools
                t2 = time.perf_counter()
        out.setdefault(f"{label}initialize", Samples()).values.append(t1 - t0)
        out.setdefault(f"{label}tools/list", Samples()).values.append(t2 - t0)

    units = [floor, lambda: session("", cli_env())]
    if before is not None:
        units.append(lambda: session("before: ", dict(cli_env(), PYTHONPATH=str(before.resolve()))))
    for unit in units:  # warm: bytecode, page cache
        await unit()
    out.clear()
    for i in range(runs):
        for k in range(len(units)):
            await units[(i + k) % len(units)]()
    return out


def startup(args: argparse.Namespace) -> int:
    import tempfile

    import anyio

    report = Report("MCP: a new session's start-up", [sys.argv[0], *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="petri-bench-mcp-") as tmp:
        ws = Path(tmp) / "mcp"
        ws.mkdir()
        run(["bash", REPO / "demo" / "sample_project.sh", ws])
        run([REPO / ".venv" / "bin" / "petri", "init", "--backend", "copy", "--json"], cwd=ws, env=cli_env())
        load_start = loadavg()
        got = anyio.run(startup_samples, ws, args.runs, args.before, backend="trio")
        load_end = loadavg()
        run([REPO / ".venv" / "bin" / "petri", "deinit", "--force", "--json"], cwd=ws, env=cli_env())
    base = got["python -c pass"]

    def row(what: str, s: Samples, target: str = "") -> list:
        return [what, s.n, fmt_s(s.p50), fmt_s(s.p99), fmt_s(min(s.values)), f"{s.p50 / base.p50:.1f}", target]

    rows = [row("spawn and reap `python -c pass` (floor)", base),
            row("`petri mcp`: spawn to `initialize` answered", got["initialize"],
                f"p50 <= 300 ms: {verdict(got['initialize'].p50, 0.300)}"),
            row("`petri mcp`: spawn to `tools/list` answered", got["tools/list"])]
    if args.before is not None:
        rows += [row(f"before ({args.before}): spawn to `initialize`", got["before: initialize"]),
                 row(f"before ({args.before}): spawn to `tools/list`", got["before: tools/list"])]
    report.section("Spawn to initialized",
                   f"The SDK's client (stdio_client + ClientSession) launching the server, {args.runs} sessions each, "
                   f"interleaved with the floor; the sample project on the copy backend. Load average {load_start} at "
                   f"the start, {load_end} at the end.")
    report.table(["what", "n", "p50", "p99", "min", "p50 / floor", "target"], rows)
    print(report.render())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--startup", action="store_true", help="time a new session's start-up only")
    ap.add_argument("--before", type=Path, help="with --startup: also the code in this earlier checkout")
    args = ap.parse_args(argv)
    if args.startup:
        return startup(args)
    if os.geteuid() != 0:
        print("bench_mcp: run as root (loop mounts, cgroups)", file=sys.stderr)
        return 1
    sigterm_as_interrupt()
    sweep_stale_images()
    report = Report("MCP: time to first command", [sys.argv[0], *(argv or sys.argv[1:])])
    fs = make_loopfs("btrfs", 2 << 30)
    pws = None
    try:
        import anyio
        import btrfsutil

        import petri

        assert fs.mount is not None
        ws = fs.mount / "mcp"
        btrfsutil.create_subvolume(ws)
        run(["bash", REPO / "demo" / "sample_project.sh", ws])
        pws = petri.init(ws, backend="btrfs")
        snap = pws.init_result.snapshot
        log(f"workspace {ws} on {fs.device}, snapshot {snap}")

        floor = measure(lambda: subprocess.run(BWRAP_FLOOR, check=True), runs=args.runs)

        def api_once() -> str:
            sb = pws.fork(source=snap)[0]
            assert sb.run(["true"]).exit_code == 0
            return sb.id

        def drop(sb_id: object) -> None:
            pws.remove(str(sb_id))

        drop(api_once())
        log("time to first command (API)")
        api = measure(api_once, runs=args.runs, after=drop)
        api_fork = measure(lambda: pws.fork(source=snap)[0].id, runs=args.runs, after=drop)
        log("time to first command (MCP)")
        got = anyio.run(mcp_samples, ws, snap, args.runs, backend="trio")

        def row(what: str, s: Samples, target: str = "") -> list:
            return [what, s.n, fmt_s(s.p50), fmt_s(s.p99), target]

        report.section("Time to first command through MCP (fork from a snapshot + run `true`)",
                       f"btrfs backend on a loop image, sample project; {args.runs} runs each. MCP figures are "
                       "measured by the SDK's client over stdio, one `petri mcp` server for all of them.")
        report.table(["what", "n", "p50", "p99", "target"], [
            row("`bwrap true` alone (floor)", floor),
            row("petri API (sync): fork + run", api),
            row("petri API (sync): fork alone", api_fork),
            row("MCP: `sandbox_fork` + `sandbox_run`", got["both"], f"p50 <= 25 ms: {verdict(got['both'].p50, 0.025)}"),
            row("MCP: `sandbox_fork` alone", got["fork"]),
            row("MCP: `sandbox_run` of `true` alone", got["run"]),
            row("MCP: `ping` (protocol round trip)", got["ping"]),
        ])
        report.text(f"MCP over the API (p50 difference, fork + run): {fmt_s(got['both'].p50 - api.p50)}; "
                    f"per call, fork: {fmt_s(got['fork'].p50 - api_fork.p50)}. Load average at the end: {loadavg()}.")
        print(report.render())
        return 0
    finally:
        if pws is not None:
            try:
                pws.deinit(force=True)
            except Exception as e:  # noqa: BLE001
                log(f"deinit failed: {e}")
        fs.release()


if __name__ == "__main__":
    sys.exit(main())
