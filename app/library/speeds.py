"""Measured speeds in library.db: prompt and generation tokens/s per model, lane and device, from the
engine's own `timings` (llama.cpp's `prompt_per_second` / `predicted_per_second`), and the calibration of
the speed model they give this machine, per device (docs/fit.md#speed).

The gateway hands each finished answer's last bytes (or its decoded `timings`) to `SpeedRecorder` once; the
parse is small and runs on the event loop, the SQLite writes run in a worker thread, a burst of answers in
one transaction. A row keeps the median of its last
RECENT answers, so one answer slowed by a busy machine barely moves it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import LibraryError
from app.fit.plan import BANDWIDTH_BOUND_BYTES, CPU, SpeedCalibration, bandwidth_bound
from app.library.store import Library

log = logging.getLogger("switchyard.speeds")
RECENT = 9
MIN_TOKENS = 4  # fewer generated tokens time the first token's set-up, not the generation rate
FLUSH_S = 0.5  # how long an answer's speed waits for the rest of its burst before the batch is filed
_DECODER = json.JSONDecoder()
# memory bandwidth per device name (bytes/s), or the CPU's figure alone; None: none measured
Bandwidths = Mapping[str, float] | float | None


@dataclass(frozen=True)
class Speed:
    """One model on one lane and device: medians of its recent answers; `bytes_per_token` from its plan."""

    model_id: str
    lane: str
    device: str
    prompt_tps: float | None
    gen_tps: float
    bytes_per_token: int | None
    samples: int
    at: float
    # only the first answer after a load is behind it (weights still paging in): shown, never calibrates
    first_only: bool = False

    def public(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "device": self.device,
            "prompt_tokens_per_s": self.prompt_tps,
            "tokens_per_s": self.gen_tps,
            "samples": self.samples,
            "at": self.at,
            "first_answer_only": self.first_only,
        }


@dataclass(frozen=True)
class LoadKey:
    """Where a model runs now, as the recorder files its answers: the lane, the device of its placement,
    the plan's bytes per token, and which load this is (its first answer counts only until the next)."""

    lane: str
    device: str
    bytes_per_token: int | None
    load: object


def timings_from(data: bytes) -> tuple[float | None, float, int] | None:
    """(prompt tok/s, generation tok/s, generated tokens) from the last `"timings"` object in `data`; None
    when there is none or it timed fewer than MIN_TOKENS generated tokens."""
    at = data.rfind(b'"timings":')
    if at < 0:
        return None
    try:
        t, _ = _DECODER.raw_decode(data[at + 10 : at + 4096].decode("utf-8", "replace").lstrip())
    except ValueError:
        return None
    return rates_of(t)


def rates_of(t: object) -> tuple[float | None, float, int] | None:
    """`timings_from` for a `timings` object already decoded (the gateway decodes it once per answer)."""
    if not isinstance(t, dict):
        return None
    gen, n, prompt = t.get("predicted_per_second"), t.get("predicted_n"), t.get("prompt_per_second")
    if not isinstance(gen, int | float) or not isinstance(n, int) or n < MIN_TOKENS or gen <= 0:
        return None
    pps = float(prompt) if isinstance(prompt, int | float) and not isinstance(prompt, bool) else 0.0
    return (pps if pps > 0 else None), float(gen), n


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class SpeedStore:
    """The `speeds` table of library.db. Errors are LibraryError with what to do; a corrupt library.db is
    set aside and rebuilt when it is opened (app/library/db.py), which starts the measurements afresh."""

    def __init__(self, library: Library, *, calibrating: Collection[str] | None = None) -> None:
        """`calibrating`: the lanes whose speeds calibrate the model (the engine registry's
        `calibrating_lanes()`, passed by the owner: this layer sits below the engines); a store that is
        only written and read needs none."""
        self.library = library
        self.calibrating = calibrating

    def record(
        self,
        model_id: str,
        *,
        key: LoadKey,
        prompt_tps: float | None,
        gen_tps: float,
        at: float | None = None,
        first: bool = False,
    ) -> Speed | None:
        """File one answer. `first`: the first answer after a load, filed only where nothing else was
        measured (so one chat already shows a figure) and replaced by the next answer (None: not filed)."""
        sample = Sample(model_id, key, prompt_tps, gen_tps, at or time.time(), first)
        return self.record_many([sample])[0]

    def record_many(self, samples: Sequence[Sample]) -> list[Speed | None]:
        """File answers in the order given, in one transaction (one commit for a burst of answers); each
        as `record` files it. Returns what each filed (None: not filed)."""
        model_id = samples[0].model_id if samples else ""
        try:
            with self.library.db.transaction() as tx:
                out = []
                for sample in samples:
                    model_id = sample.model_id
                    out.append(_record_in(tx, sample))
                return out
        except sqlite3.Error as exc:
            raise LibraryError(
                f"could not record the measured speed of {model_id!r} in {self.library.path} ({exc}); "
                "if another program holds the file, close it; the next answer is recorded again"
            ) from exc

    def all(self) -> list[Speed]:
        return [self._row(r) for r in self._query("SELECT * FROM speeds ORDER BY model_id, at DESC")]

    def of(self, model_id: str) -> list[Speed]:
        """This model's rows, the most recent first."""
        return [
            self._row(r)
            for r in self._query("SELECT * FROM speeds WHERE model_id = ? ORDER BY at DESC", (model_id,))
        ]

    def calibration(self, *, bandwidth: Bandwidths) -> dict[str, SpeedCalibration]:
        """Per device, what the measurements on the store's `calibrating` lanes say about the speed model
        (empty: nothing to go on); `bandwidth` as `calibrate` takes it."""
        if self.calibrating is None:  # a programming error: an empty answer would hide it
            raise TypeError("SpeedStore.calibration needs the calibrating lanes: pass calibrating=")
        try:
            return calibrate(self.all(), bandwidth=bandwidth, lanes=self.calibrating)
        except LibraryError as exc:
            log.warning("%s", exc.message)
            return {}

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        try:
            return self.library.db.query(sql, args)
        except sqlite3.Error as exc:
            raise LibraryError(
                f"could not read measured speeds from {self.library.path} ({exc}); if the file is damaged, "
                "move it aside and Switchyard rebuilds the library on its next start"
            ) from exc

    @staticmethod
    def _row(r: sqlite3.Row) -> Speed:
        return Speed(
            r["model_id"], r["lane"], r["device"], r["prompt_tps"], r["gen_tps"], r["bytes_per_token"],
            r["samples"], r["at"], _first_only(r["recent"]),
        )  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One answer's measured rates, as the recorder hands it to the store."""

    model_id: str
    key: LoadKey
    prompt_tps: float | None
    gen_tps: float
    at: float
    first: bool = False


def _record_in(tx: sqlite3.Connection, sample: Sample) -> Speed | None:
    key, model_id = sample.key, sample.model_id
    row = tx.execute(
        "SELECT samples, recent FROM speeds WHERE model_id = ? AND lane = ? AND device = ?",
        (model_id, key.lane, key.device),
    ).fetchone()
    if sample.first and row is not None:
        return None
    # a first answer's row is replaced, not added to (_recent drops its entry)
    recent = _recent(row["recent"]) if row else []
    samples = (0 if row is None or _first_only(row["recent"]) else row["samples"]) + 1
    entry: list[float | str | None] = [sample.prompt_tps, sample.gen_tps, *([_FIRST] if sample.first else [])]
    recent = [*recent, entry][-RECENT:]
    speed = _speed_of(model_id, key, recent, samples, sample.at)
    tx.execute(
        "INSERT OR REPLACE INTO speeds(model_id, lane, device, prompt_tps, gen_tps, "
        "bytes_per_token, samples, recent, at) VALUES (?,?,?,?,?,?,?,?,?)",
        (
            model_id,
            key.lane,
            key.device,
            speed.prompt_tps,
            speed.gen_tps,
            key.bytes_per_token,
            speed.samples,
            json.dumps(recent),
            speed.at,
        ),
    )
    return speed


_FIRST = "first"  # marks a row's entry that is the first answer after a load (SpeedStore.record(first=))


def _first_only(text: str) -> bool:
    try:
        got = json.loads(text)
    except ValueError:
        return False
    return isinstance(got, list) and len(got) == 1 and isinstance(got[0], list) and got[0][2:] == [_FIRST]


def _recent(text: str) -> list[list[float | str | None]]:
    try:
        got = json.loads(text)
    except ValueError:
        return []  # a damaged list only loses the history, never the next sample
    return (
        [x for x in got if isinstance(x, list) and len(x) == 2 and _num(x[1])]
        if isinstance(got, list)
        else []
    )


def _speed_of(
    model_id: str, key: LoadKey, recent: list[list[float | str | None]], samples: int, at: float
) -> Speed:
    prompts = [x[0] for x in recent if isinstance(x[0], int | float)]
    gens = [x[1] for x in recent if isinstance(x[1], int | float)]
    return Speed(
        model_id,
        key.lane,
        key.device,
        round(statistics.median(prompts), 2) if prompts else None,
        round(statistics.median(gens), 2),
        key.bytes_per_token,
        samples,
        at,
        first_only=len(recent) == 1 and recent[0][2:] == [_FIRST],
    )


def calibrate(
    speeds: Iterable[Speed], *, bandwidth: Bandwidths, lanes: Collection[str]
) -> dict[str, SpeedCalibration]:
    """Each device's calibration from its own measurements on `lanes` (the engine registry's
    `calibrating_lanes()`: the kinds whose speeds the model fits), over its own bandwidth: `bandwidth`
    maps device names as the recorder files them ("CPU", "GPU") to bytes/s (plan.device_bandwidths),
    or is the CPU's figure alone; a device without one, or without a model read enough to teach the
    efficiency, is left out (its placements keep their range)."""
    bws: Mapping[str, float | None] = (
        {CPU: bandwidth} if isinstance(bandwidth, int | float) else (bandwidth or {})
    )
    rows = [s for s in speeds if s.lane in lanes and s.bytes_per_token and not s.first_only]
    out: dict[str, SpeedCalibration] = {}
    for device in sorted({s.device for s in rows}):
        bw = bws.get(device)
        cal = _calibrate_device([s for s in rows if s.device == device], bw) if bw and bw > 0 else None
        if cal is not None:
            out[device] = cal
    return out


def _calibrate_device(rows: list[Speed], bandwidth: float) -> SpeedCalibration | None:
    """The efficiency is the median, over models that read at least BANDWIDTH_BOUND_BYTES a token, of
    measured / bandwidth-bound speed; smaller models give the fixed per-token cost left once that
    efficiency is taken into account. None without such a model."""
    big = [s for s in rows if (s.bytes_per_token or 0) >= BANDWIDTH_BOUND_BYTES]
    if not big:
        return None

    def bound(s: Speed) -> float:
        return bandwidth_bound(s.bytes_per_token or 1, bandwidth)

    eff = statistics.median(s.gen_tps / bound(s) for s in big)
    small = [s for s in rows if s not in big]
    per_token = (
        statistics.median(max(0.0, 1 / s.gen_tps - 1 / (bound(s) * eff)) for s in small) if small else 0.0
    )
    if per_token:  # the large models pay the fixed cost too: take it out of their efficiency
        eff = statistics.median(1 / (max(1 / s.gen_tps - per_token, 1e-9) * bound(s)) for s in big)
    return SpeedCalibration(efficiency=eff, per_token_s=per_token, models=len(rows), bandwidth=bandwidth)


def machine_calibration(
    library: Library, *, bandwidth: Bandwidths, lanes: Collection[str]
) -> dict[str, SpeedCalibration]:
    """This machine's calibration from the speeds recorded in `library` (for commands that run without a
    server: `switchyard explain`, `switchyard recommend --local`); empty when nothing calibrates it."""
    return SpeedStore(library, calibrating=lanes).calibration(bandwidth=bandwidth)


class SpeedRecorder:
    """What the gateway calls once per answer; `where(model_id)` says where the model runs now (None: not
    on a lane this records, e.g. a remote). The first answer of each load is filed only where nothing was
    measured yet, and replaced by the next: its weights are still being paged in.

    Answers are filed in batches: the first one noted waits FLUSH_S for the others of its burst, and all
    of them go to SQLite in one transaction on a worker thread (one commit and one thread hand-off per
    batch, not per answer; every answer is still filed). One batch is written at a time, in order."""

    def __init__(self, store: SpeedStore, *, where: Callable[[str], LoadKey | None]) -> None:
        self.store = store
        self.where = where
        self._seen: dict[str, object] = {}  # model id -> the load whose first answer was seen
        # model id -> the last timings filed: a stream's end can be handed over twice, one answer counts once
        self._last: dict[str, tuple[float | None, float, int]] = {}
        self._queued: list[Sample] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future[None] | None = None

    def note(self, model_id: str | None, data: bytes) -> None:
        """Hand over an answer's last bytes; records in a worker thread, never raises."""
        self._note(model_id, lambda: timings_from(data))

    def note_timings(self, model_id: str | None, timings: object) -> None:
        """`note` for an answer whose `timings` object is decoded already (None: it had none)."""
        self._note(model_id, lambda: rates_of(timings))

    def _note(
        self, model_id: str | None, rates: Callable[[], tuple[float | None, float, int] | None]
    ) -> None:
        try:
            timings = rates() if model_id else None
            key = self.where(model_id) if model_id and timings else None
        except Exception:  # a lane between states must not fail the answer it measured
            log.debug("no speed recorded for %s", model_id, exc_info=True)
            return
        if timings is None or key is None or model_id is None or self._last.get(model_id) == timings:
            return
        self._last[model_id] = timings
        first = self._seen.get(model_id) is not key.load
        self._seen[model_id] = key.load
        self._queued.append(Sample(model_id, key, timings[0], timings[1], time.time(), first))
        if self._timer is None and self._writing is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._flush)

    def _flush(self) -> None:
        """Start writing what is queued (the timer's callback, or `drain`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None or not self._queued:
            return
        batch, self._queued = self._queued, []
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(None, self._write, batch)
        self._writing.add_done_callback(self._written)

    def _written(self, _: asyncio.Future[None]) -> None:
        self._writing = None
        if self._queued and self._timer is None:  # noted while the batch was written: the next batch
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._flush)

    def _write(self, batch: list[Sample]) -> None:
        try:
            self.store.record_many(batch)
        except LibraryError as exc:
            log.warning("%s", exc.message)

    async def drain(self) -> None:
        """File everything noted so far, now (tests, shutdown)."""
        while self._queued or self._writing is not None:
            if self._writing is not None:
                await asyncio.gather(self._writing, return_exceptions=True)
            self._flush()
