"""What a `tracing.span()` costs a request step: off (the default) and on (the SDK, an in-memory exporter).

Prints nanoseconds per `with span(...)` block beside an empty `with contextlib.nullcontext()` block, and
their ratio. Off, the span should cost about what the null context does; on is shown for scale. A print,
not a timed test: figures on a shared 2-core machine vary too much to assert on.

    .venv/bin/python bench/span_cost.py [--n 200000]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core import tracing


def per_call_ns(block: Callable[[], None], n: int) -> float:
    best = float("inf")
    for _ in range(5):  # the best of five rounds: the least disturbed by other processes
        t0 = time.perf_counter_ns()
        for _ in range(n):
            block()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def null_block() -> None:
    with contextlib.nullcontext():
        pass


def span_block() -> None:
    with tracing.span("switchyard.resolve", model="tiny", capability="chat"):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="blocks per round (off; on runs n / 20)")
    args = ap.parse_args()
    base = per_call_ns(null_block, args.n)
    off = per_call_ns(span_block, args.n)
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    print(f"null context      {base:8.0f} ns")
    print(
        f"span, tracing off {off:8.0f} ns   ratio {off / base:.2f}   (opentelemetry modules: {len(loaded)})"
    )
    try:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        print("span, tracing on: opentelemetry-sdk not installed (pip install 'switchyard[tracing]')")
        return
    exporter = InMemorySpanExporter()
    tracing.install(exporter)
    try:
        on = per_call_ns(span_block, max(1, args.n // 20))
    finally:
        tracing.shutdown()
    print(f"span, tracing on  {on:8.0f} ns   ratio {on / base:.1f}")


if __name__ == "__main__":
    main()
