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

Caveats: warm caches; the client and the server share the machine's two cores (as they do
on a developer's machine); p99 over 50 samples is close to the maximum.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args(argv)
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
