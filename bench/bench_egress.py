"""The egress allow-list's cost: time to first byte through the proxy against ``--net``.

A sandbox with ``--net allow:127.0.0.1:PORT`` reaches an HTTP server on the host's loopback
only through its egress proxy (``orchestrator.sandbox.egress``); a sandbox with ``--net`` shares
the host's network and connects directly. This bench times, inside the sandboxes, one request
on a new connection from the start of ``connect`` to the response's status line (time to first
byte), three ways, in rounds that alternate them:

- **direct, ``--net``** (the baseline): ``GET /`` to 127.0.0.1:PORT;
- **proxy, plain HTTP**: ``GET http://127.0.0.1:PORT/`` to the proxy (what ``HTTP_PROXY`` does);
- **proxy, CONNECT tunnel**: ``CONNECT 127.0.0.1:PORT``, then ``GET /`` inside the tunnel (the
  path https takes, without TLS so that only the proxy's part is measured);

and, per round, what making the proxy costs: ``petri fork`` + the sandbox's first ``petri run
SB -- true`` (which makes its environment: the holder, ``/tmp``, and for the allow-list the
proxy), ``--net`` against ``--net allow:...``; with ``python3 -c pass`` sampled beside them.
The server is a ``ThreadingHTTPServer`` in this process answering 2 bytes. Prints markdown
(progress on stderr), the load average at the start and the end. Run as root from the
repository root: ``.venv/bin/python -m bench.bench_egress [--rounds 6] [--per-run 50]``.

Caveats: loopback only, so what is measured is the proxy's own work (a thread, a parse, a
resolve of an IP literal, a second connect) and not a real network's latency, beside which it
is smaller still; the server answers from this process, which is also timing the CLI.
"""
from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import (REPO, Report, Samples, cli_env, fmt_ratio, fmt_s, loadavg, log, make_loopfs,
                          sigterm_as_interrupt, sweep_stale_images)

PY = str(REPO / ".venv" / "bin" / "python")

# Inside the sandbox: N times, a new connection and one request; the time to the status line.
TTFB = r"""
import json, os, socket, sys, time
mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proxy = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1]) if mode != "direct" else None
out = []
for _ in range(n):
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", proxy or port))
    if mode == "direct":
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port)
    elif mode == "plain":
        s.sendall(b"GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (port, port))
    else:
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (port, port))
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200"), got
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port)
    first = s.recv(64)
    out.append(time.perf_counter() - t0)
    assert b" 200 " in first, first
    while s.recv(65536):
        pass
    s.close()
print(json.dumps(out))
"""


class Tiny(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


def petri(ws: Path, env: dict, *args: str) -> str:
    return subprocess.run([PY, "-m", "orchestrator.cli", *args], cwd=ws, env=env, check=True, capture_output=True,
                          text=True).stdout


def timed(argv: list, **kw) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-run", type=int, default=50)
    args = ap.parse_args(argv)
    sigterm_as_interrupt()
    sweep_stale_images()
    report = Report("bench_egress", sys.argv)
    load_start = loadavg()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tiny)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_port
    allow = f"allow:127.0.0.1:{port}"
    fs = make_loopfs("btrfs", 1 << 30)
    env = cli_env()
    ws = None
    try:
        import btrfsutil

        assert fs.mount is not None
        ws = fs.mount / "ws"
        btrfsutil.create_subvolume(ws)
        subprocess.run(["bash", REPO / "demo" / "sample_project.sh", ws], check=True, capture_output=True)
        snap = json.loads(petri(ws, env, "init", "--backend", "btrfs", "--json"))["snapshot"]
        sb_net = json.loads(petri(ws, env, "fork", "--from", snap, "--net", "--json"))["sandboxes"][0]["id"]
        sb_allow = json.loads(petri(ws, env, "fork", "--from", snap, "--net", allow, "--json"))["sandboxes"][0]["id"]
        s: dict[str, list[float]] = {}

        def add(key: str, vs: list[float]) -> None:
            s.setdefault(key, []).extend(vs)

        ways = [("direct, --net (baseline)", sb_net, "direct"), ("proxy, plain HTTP", sb_allow, "plain"),
                ("proxy, CONNECT tunnel", sb_allow, "connect")]
        for rnd in range(args.rounds):
            log(f"round {rnd + 1}/{args.rounds} (load {loadavg()})")
            for name, sb, mode in (ways if rnd % 2 == 0 else list(reversed(ways))):
                got = petri(ws, env, "run", sb, "--", "/usr/bin/python3", "-c", TTFB, mode, str(port),
                            str(args.per_run))
                add(name, json.loads(got)[5:])  # the first few: a new thread in the proxy, caches
            for name, flags in (("fork + first run, --net", ["--net"]), ("fork + first run, allow-list",
                                                                          ["--net", allow])):
                add("python3 -c pass", [timed([sys.executable, "-c", "pass"])])
                t0 = time.perf_counter()
                sb = json.loads(petri(ws, env, "fork", "--from", snap, *flags, "--json"))["sandboxes"][0]["id"]
                petri(ws, env, "run", sb, "--", "true")
                add(name, [time.perf_counter() - t0])
                petri(ws, env, "rm", sb)
        sm = {k: Samples(v) for k, v in s.items()}
        base = sm[ways[0][0]]
        rows = [[k, sm[k].n, fmt_s(sm[k].p50), fmt_s(sm[k].p99), fmt_ratio(sm[k].p50, base.p50),
                 fmt_s(sm[k].p50 - base.p50)] for k, _, _ in ways]
        report.section("Time to first byte of an allowed request: through the proxy against --net",
                       f"An HTTP server on the host's 127.0.0.1; inside the sandboxes a new connection and one request "
                       f"each, {args.per_run} per run (the first 5 of each run left out), {args.rounds} rounds "
                       f"alternating the three ways. Load average at start {load_start}, at end {loadavg()}.")
        report.table(["way", "n", "p50", "p99", "/ direct (p50)", "- direct (p50)"], rows)
        fb, fa, py = sm["fork + first run, --net"], sm["fork + first run, allow-list"], sm["python3 -c pass"]
        report.section("Making the proxy: petri fork + the first petri run SB -- true",
                       "btrfs backend on a loop image, the demo's sample project; one of each per round.")
        report.table(["what", "n", "p50", "p99", "/ --net (p50)", "- --net (p50)"],
                     [["`python3 -c pass` (floor)", py.n, fmt_s(py.p50), fmt_s(py.p99), "", ""],
                      ["fork + first run, `--net`", fb.n, fmt_s(fb.p50), fmt_s(fb.p99), "", ""],
                      ["fork + first run, `--net allow:...`", fa.n, fmt_s(fa.p50), fmt_s(fa.p99),
                       fmt_ratio(fa.p50, fb.p50), fmt_s(fa.p50 - fb.p50)]])
        print(report.render())
        return 0
    finally:
        if ws is not None:
            with contextlib.suppress(Exception):
                subprocess.run([PY, "-m", "orchestrator.cli", "deinit", "--force"], cwd=ws, env=env,
                               capture_output=True)
        fs.release()
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    sys.exit(main())
