"""The floor under any per-event relay on this machine: the CPU a bare uvloop protocol relay spends per
forwarded message, with no HTTP, no Python per event beyond `transport.write` in `data_received`.

A producer process writes `--events` messages of SSE size, one every `--gap-ms`, to a socket; a relay
process (this file, `--relay`) forwards each to a reader as it arrives. The relay's own CPU time (from
/proc/<pid>/task/*/schedstat) divided by the messages is the figure: what one wake-up and one send cost
here. Switchyard's byte relay (gateway/relay.py) does that much plus its frame tracking; its gateway
figure in docs/performance.md can be read against this one.

Three relays are measured, interleaved round by round: the uvloop protocol relay, a thread doing blocking
`recv_into` + `sendall` (no event loop at all), and a thread moving the bytes with `os.splice` through a
pipe (Linux; they never enter Python memory). The last two bound what any design with one wake-up per event
could reach here.

    .venv/bin/python bench/relay_floor.py                  # 3 rounds of 2000 events, 1 ms apart
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

EVENT = (
    b"data: "
    + b'{"choices":[{"index":0,"delta":{"content":"ab"}}],"object":"chat.completion.chunk"}'
    + b"\n\n"
)


def cpu_s(pid: int) -> float:
    """CPU time of every thread of `pid`, from schedstat (nanoseconds, not clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


MODES = ("uvloop", "thread", "splice") if hasattr(os, "splice") else ("uvloop", "thread")


def relay_blocking(listen_port: int, upstream_port: int, *, splice: bool) -> None:
    """The same relay without an event loop: one thread blocked in the read, sending what it got."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(1)
    print("ready", flush=True)
    down, _ = srv.accept()
    up = socket.create_connection(("127.0.0.1", upstream_port))
    if splice:
        r, w = os.pipe()
        while n := os.splice(up.fileno(), w, 1 << 16):
            while n:
                n -= os.splice(r, down.fileno(), n)
    else:
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        while n := up.recv_into(buf):
            down.sendall(view[:n])
    down.close()


def relay(listen_port: int, upstream_port: int, mode: str) -> None:
    """Accept one client; connect to the producer; forward every byte from it to the client."""
    if mode != "uvloop":
        relay_blocking(listen_port, upstream_port, splice=mode == "splice")
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    class Up(asyncio.Protocol):
        def __init__(self, down: asyncio.Transport, done: asyncio.Future[None]) -> None:
            self.down, self.done = down, done

        def data_received(self, data: bytes) -> None:
            self.down.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.down.close()
            if not self.done.done():
                self.done.set_result(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

        class Down(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)  # type: ignore[arg-type]

        server = await loop.create_server(Down, "127.0.0.1", listen_port)
        print("ready", flush=True)
        down = await accepted
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(lambda: Up(down, done), "127.0.0.1", upstream_port)
        await done
        server.close()

    asyncio.run(main())


def produce(sock: socket.socket, events: int, gap_s: float) -> None:
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    next_at = time.perf_counter()
    for _ in range(events):
        conn.sendall(EVENT)
        next_at += gap_s
        time.sleep(max(0.0, next_at - time.perf_counter()))  # sleeping, not spinning: the cores stay free
    conn.close()


def read_all(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port)) as s:
        n = 0
        while chunk := s.recv(1 << 16):
            n += len(chunk)
        return n


def one_round(events: int, gap_s: float, mode: str) -> float:
    import threading

    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(1)
    up_port = up.getsockname()[1]
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    listen_port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--relay", str(listen_port), str(up_port), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    before = cpu_s(proc.pid)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(read_all(listen_port)))
    reader.start()
    produce(up, events, gap_s)
    reader.join()
    after = cpu_s(proc.pid)
    proc.wait(timeout=10)
    up.close()
    assert got and got[0] == events * len(EVENT), got
    return (after - before) / events * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--relay", nargs=3, metavar=("LISTEN", "UPSTREAM", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--gap-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.relay:
        relay(int(args.relay[0]), int(args.relay[1]), args.relay[2])
        return
    figures: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:  # interleaved: machine noise lands on every relay alike
            figures[mode].append(one_round(args.events, args.gap_ms / 1000, mode))
    print(
        f"relay CPU per forwarded event ({args.rounds} rounds of {args.events} events, "
        f"{args.gap_ms:g} ms apart):"
    )
    for mode, f in figures.items():
        print(f"  {mode:7s} {statistics.median(f):6.1f} µs median; rounds {', '.join(f'{x:.1f}' for x in f)}")


if __name__ == "__main__":
    main()
