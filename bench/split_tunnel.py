"""What the split lane's tunnel costs per token: the same split run direct and through three serves.

Three `switchyard serve --tls` processes with their own homes on 127.0.0.1 (a heads MEDIUM split over b's
and c's RPC workers, reached through the peers' mutual-TLS WebSocket tunnels), beside the same build's
llama-server pointed straight at two bare rpc-servers on loopback (what llama.cpp's own docs describe, with
no authentication), and the same again through plain TCP relays standing where the serves stand (one
process on the head's side, one per worker: what the loopback hops alone cost). The bare sides run the
very argv of the tunnel's engines (read from the running processes: the head's flags and each worker's
`--threads`) with only the ports changed, so the sides differ by the path alone. Every "machine" here
shares the same cores: `--threads` (written into each home's settings) keeps their engines from fighting
over them (three engines of two threads each on two cores spin against each other and cost 10 to 260 ms
per token, whichever the path). Rounds alternate the three; each prints ms per generated token
(llama-server's own `timings`), the ratios, and the load average. docs/performance.md has the figures.

    .venv/bin/python bench/split_tunnel.py [--rounds 6] [--tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.lanes.peers import rpc
from tests.conftest import ServerProcess
from tests.support.tinymodels import MEDIUM, write_tiny_gguf

PROMPT = "The split lane says"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(server: ServerProcess, *args: str) -> dict[str, Any]:
    env = dict(os.environ, SWITCHYARD_HOME=str(server.home))
    done = subprocess.run(
        [sys.executable, "-m", "app", "peers", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout))


def client(server: ServerProcess) -> httpx.Client:
    return httpx.Client(verify=str(server.home / "tls" / "cert.pem"), timeout=300)


def per_token_ms(http: httpx.Client, url: str, tokens: int) -> float:
    body = {"model": "medium", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    doc = http.post(url, json=body).json()
    return float(doc["timings"]["predicted_per_token_ms"])


def engine_argv(server: ServerProcess, binary: str) -> list[str]:
    """The argv of the engine `binary` that `server` runs (under its guard: the engine is a child)."""
    for proc in psutil.Process(server.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = proc.cmdline()
            if argv and Path(argv[0]).name == binary:
                return argv
    raise RuntimeError(f"{binary} is not running under {server.url}")


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


async def _relay(pairs: list[tuple[int, int]]) -> None:
    """Plain TCP relays on loopback, copied the way the tunnel copies (a task per direction)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(rpc.CHUNK):
            writer.write(data)
            await writer.drain()
        writer.close()

    def serve(target: int) -> Any:
        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", target)
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)

        return conn

    servers = [await asyncio.start_server(serve(t), "127.0.0.1", listen) for listen, t in pairs]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def relay_main(spec: list[str]) -> int:
    pairs = [(int(a), int(b)) for a, _, b in (p.partition(":") for p in spec)]
    try:
        import uvloop  # as `switchyard serve` runs when it is installed

        uvloop.run(_relay(pairs))
    except ImportError:
        asyncio.run(_relay(pairs))
    return 0


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def listening(port: int, *, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def bare_split(
    head: list[str], workers: list[list[str]], *, relayed: bool, procs: list[subprocess.Popen[bytes]]
) -> str:
    """The tunnel's head and workers again, with only the ports changed: the head's --rpc straight at the
    workers, or (`relayed`) through a plain relay process on the head's side and one on each worker's,
    as the serves stand in the tunnel. Each process is added to `procs` as it starts (the caller's to
    stop, whatever fails here)."""
    ends: list[int] = []
    for argv in workers:
        port = free_port()
        procs.append(spawn(with_flag(argv, "--port", str(port))))
        ends.append(port)
    if relayed:  # each relay is probed once the one it forwards to listens (a probe opens the chain)
        here = sys.executable, str(Path(__file__).resolve()), "--relay"
        near = [free_port() for _ in ends]
        for far, worker_port in zip(near, ends, strict=True):
            procs.append(spawn([*here, f"{far}:{worker_port}"]))
        for port in (*ends, *near):
            listening(port)
        ends = [free_port() for _ in near]
        procs.append(spawn([*here, *(f"{a}:{b}" for a, b in zip(ends, near, strict=True))]))
    for port in ends:
        listening(port)
    port = free_port()
    argv = with_flag(with_flag(head, "--port", str(port)), "--rpc", ",".join(f"127.0.0.1:{p}" for p in ends))
    procs.append(spawn(argv))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if http.get(url + "/health").status_code == 200:
                    return url
            time.sleep(0.2)
    raise RuntimeError(f"the bare head on {url} did not get ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per engine, on both sides")
    ap.add_argument("--relay", nargs="+", metavar="LISTEN:TARGET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        return relay_main(args.relay)
    folder = rpc.rpc_bin()
    if folder is None:
        print(rpc.missing_build_advice())
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="split-bench-"))
    models, empty = tmp / "models", tmp / "empty"
    models.mkdir()
    empty.mkdir()
    write_tiny_gguf(models / "medium.gguf", MEDIUM)
    budgets = {"a": 576, "b": 40, "c": 52}  # MiB lent: the split needs all three (as in the test tier)
    servers: list[ServerProcess] = []
    direct: list[subprocess.Popen[bytes]] = []
    try:
        for name, mib in budgets.items():
            home = tmp / name
            home.mkdir()
            (home / "settings.json").write_text(
                json.dumps({"ram_budget_mib": mib, "memory_reserve_mib": 0, "threads": args.threads})
            )
            servers.append(ServerProcess(home, models if name == "a" else empty, "--tls"))
        a, b, c = (s.wait_ready(90) for s in servers)
        for server, name in ((b, "bee"), (c, "cee")):
            code = cli(server, "invite")["code"]
            cli(a, "add", server.url.split("//", 1)[1], "--code", code, "--name", name)
        with client(a) as http:
            loaded = http.post(a.url + "/api/models/medium/load", json={"split": ["bee", "cee"]})
            assert loaded.status_code == 200, loaded.text
            plan = http.get(a.url + "/api/splits").json()["heads"][0]["plan"]
        head = engine_argv(a, rpc.HEAD)
        workers = [engine_argv(w, rpc.WORKER) for w in (b, c)]
        url = bare_split(head, workers, relayed=False, procs=direct)
        relay_url = bare_split(head, workers, relayed=True, procs=direct)
        with httpx.Client(timeout=300) as bare, client(a) as http:
            sides = (
                (bare, url + "/v1/completions"),
                (bare, relay_url + "/v1/completions"),
                (http, a.api + "/completions"),
            )
            for side in sides:
                per_token_ms(*side, 8)  # warm each
            print(
                f"split {plan['engine_args']} of MEDIUM, {args.threads} thread(s) per engine, "
                f"{args.tokens} tokens per round, ms per token"
            )
            print(f"{'round':>5} {'direct':>8} {'relayed':>8} {'tunnel':>8}  t/d  t/r  load (1 min)")
            ratios, floors = [], []
            for i in range(args.rounds):
                d, r, t = (per_token_ms(*side, args.tokens) for side in sides)
                ratios.append(t / d)
                floors.append(t / r)
                load = os.getloadavg()[0]
                print(f"{i + 1:>5} {d:>8.2f} {r:>8.2f} {t:>8.2f} {t / d:4.2f} {t / r:4.2f}  {load:.2f}")
            print(
                f"median tunnel/direct {statistics.median(ratios):.2f}, "
                f"tunnel/relayed {statistics.median(floors):.2f}"
            )
    finally:
        for p in direct:
            p.terminate()
        for p in direct:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
