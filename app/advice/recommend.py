"""First-run recommendations: the curated list (recommendations.yaml beside this module) ranked for this
machine, per task (chat, coding, embeddings, speech).

Each entry gets a verdict: for a GGUF quantization the fit-before-download path (hub_fit: the remote
header through the same memory model a local file gets, the projector a pull fetches counted in its size);
for plain files (whisper.cpp, Piper) and whenever the hub does not answer, the file size against the
memory budget, said so in the entry's note. Ranking within a task: what fits first, then what runs at a
usable speed, then the list's own quality order.

Nothing is measured for a model not yet downloaded, so the speed is always the prediction: the figure
calibrated by this machine's measured answers where there are any (app/library/speeds.py), else the range
the memory bandwidth gives (docs/fit.md#speed). A model is usable when even the low end reaches the task's
pace, too slow when even the high end does not, and "maybe" between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from app.advice.explain import _hw_summary
from app.advice.inputs import AdviceInputs
from app.core.errors import (
    HubError,
    HubFileNotFoundError,
    HubOfflineError,
    HubUnreachableError,
    SettingsError,
)
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.fit.plan import SPEED_BAND, Budget, SpeedCalibration, bandwidth_bound, rate
from app.hardware.model import Hardware
from app.hub.quant import RepoFile
from app.hub.selection import pulled_projector

TASKS = ("chat", "coding", "embeddings", "speech")
MIB = 1 << 20
# tokens/s below which a model is "too slow to use" for the task: 5 tok/s is about reading pace for a chat
# answer; code answers are longer and read in bulk, so waiting at under 10 tok/s feels stalled
USABLE_TOK_S: Mapping[str, float] = {"chat": 5.0, "coding": 10.0}
# the size-only verdict: a model takes more than its file (KV cache, compute buffers), a fifth is typical
HEADROOM = 1.2
PARALLEL_ASKS = 4


@dataclass(frozen=True)
class Candidate:
    """One entry of the curated list; `rank` is its quality order within the task (0 is best)."""

    task: str
    rank: int
    repo: str
    quant: str | None  # a GGUF quantization; None for plain files
    files: tuple[str, ...]  # the exact files to fetch when there is no quantization
    size: int  # approximate bytes, from the list
    why: str
    vision: bool = False

    @property
    def refs(self) -> tuple[str, ...]:
        """What `switchyard pull` takes to fetch it (one per file for plain files)."""
        if self.quant:
            return (f"{self.repo}:{self.quant}",)
        return tuple(f"{self.repo}:{f}" for f in self.files)


@dataclass(frozen=True)
class Verdict:
    """Whether a candidate fits here; `source` is "hub" (its real header or sizes) or "list" (sizes
    from the list, when the hub did not answer). The speed is predicted: `tokens_per_s` where this
    machine's measurements calibrate it, else `tokens_per_s_range` (low, high) from the bandwidth."""

    verdict: str | None  # gpu, partial, cpu, too_large; None when unknown
    fits: bool | None
    summary: str
    tokens_per_s: float | None
    size: int  # what the download fetches, projector included
    source: str
    note: str | None = None
    projector: str | None = None  # the projector file a pull fetches beside the quantization
    tokens_per_s_range: tuple[float, float] | None = None
    calibrated: bool = False

    @property
    def predicted(self) -> tuple[float, float] | None:
        """The predicted speed as (low, high): one figure twice when calibrated; None when unknown."""
        if self.tokens_per_s is not None:
            return self.tokens_per_s, self.tokens_per_s
        return self.tokens_per_s_range


@dataclass(frozen=True)
class Recommendation:
    candidate: Candidate
    verdict: Verdict
    usable: bool | None  # fast enough for the task; None where speed is unknown or does not apply

    def public(self) -> dict[str, Any]:
        c, v = self.candidate, self.verdict
        return {
            "task": c.task,
            "repo": c.repo,
            "quant": c.quant,
            "files": list(c.files),
            "pull": list(c.refs),
            "why": c.why,
            "vision": c.vision or v.projector is not None,
            "projector": v.projector,
            "size": v.size,
            "verdict": v.verdict,
            "fits": v.fits,
            "summary": v.summary,
            "tokens_per_s": v.tokens_per_s,
            "tokens_per_s_range": list(v.tokens_per_s_range) if v.tokens_per_s_range else None,
            "calibrated": v.calibrated,
            "usable": self.usable,
            "usable_tok_s": USABLE_TOK_S.get(c.task),
            "source": v.source,
            "note": v.note,
        }


@dataclass(frozen=True)
class Recommendations:
    """Ranked entries per task, best first; `hub_problem` says why the hub was not asked (or failed)."""

    tasks: Mapping[str, tuple[Recommendation, ...]]
    hardware: Mapping[str, Any]
    hub_problem: str | None = None

    def best(self, task: str) -> Recommendation | None:
        ranked = self.tasks.get(task) or ()
        return ranked[0] if ranked and ranked[0].verdict.fits is not False else None

    def pace(self, task: str) -> str | None:
        """Said when nothing that fits is fast enough for `task` here (None: something is, or unknown)."""
        best = self.best(task)
        if best is None or best.usable is not False:
            return None
        r = best.public()
        return (
            f"nothing in the list is fast enough for {task} on this machine (it wants "
            f"{rate(r['usable_tok_s'])} tokens/s); the quickest that fits, {r['pull'][0]}, is predicted at "
            f"{predicted_words(r, tag='')}"
        )

    def public(self) -> dict[str, Any]:
        return {
            "hardware": dict(self.hardware),
            "hub_problem": self.hub_problem,
            "tasks": {t: [r.public() for r in rs] for t, rs in self.tasks.items()},
            "pace": {t: note for t in self.tasks if (note := self.pace(t))},
        }


# ---- the list ---------------------------------------------------------------------------------------
def load_candidates(text: str | None = None) -> tuple[Candidate, ...]:
    """The curated list (the packaged file, or `text` in its shape); a malformed entry is an error
    naming the entry."""
    if text is None:
        text = resources.files("app.advice").joinpath("recommendations.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise SettingsError("the recommendations list must map each task to a list of models")
    out: list[Candidate] = []
    for task, entries in doc.items():
        if task not in TASKS or not isinstance(entries, list):
            raise SettingsError(f"recommendations: {task!r} is not one of {', '.join(TASKS)} with a list")
        out.extend(_candidate(task, i, e) for i, e in enumerate(entries))
    return tuple(out)


def _candidate(task: str, rank: int, e: Any) -> Candidate:
    where = f"recommendations: {task} entry {rank + 1}"
    if not isinstance(e, dict) or not isinstance(e.get("repo"), str) or "/" not in e["repo"]:
        raise SettingsError(f"{where} needs `repo: owner/name`")
    quant, files = e.get("quant"), e.get("files") or []
    if bool(quant) == bool(files) or not all(isinstance(f, str) for f in files):
        raise SettingsError(f"{where} ({e['repo']}) needs either `quant` or a list of `files`, not both")
    size = e.get("size_mib")
    if not isinstance(size, int) or size < 1:
        raise SettingsError(f"{where} ({e['repo']}) needs `size_mib`, a whole number of MiB")
    return Candidate(
        task=task,
        rank=rank,
        repo=e["repo"],
        quant=str(quant) if quant else None,
        files=tuple(files),
        size=size * MIB,
        why=str(e.get("why") or ""),
        vision=bool(e.get("vision")),
    )


# ---- verdicts ---------------------------------------------------------------------------------------
def capped(hardware: Hardware, settings: Settings) -> Hardware:
    """The machine as the lanes may use it: `ram_budget_mib` caps the RAM all lanes take together, so a
    recommendation never names a model the supervisor would refuse to load."""
    if not settings.memory.ram_budget_mib:
        return hardware
    cap = settings.memory.ram_budget_mib * MIB
    mem = hardware.memory
    memory = dataclasses.replace(
        mem,
        total=min(mem.total, cap) if mem.total is not None else cap,
        available=min(mem.available, cap) if mem.available is not None else cap,
        cgroup_limit=min(mem.cgroup_limit, cap) if mem.cgroup_limit is not None else cap,
    )
    return dataclasses.replace(hardware, memory=memory)


def predicted_speed(
    read_bytes: int, *, hardware: Hardware, calibration: Mapping[str, SpeedCalibration] | None = None
) -> tuple[float | None, tuple[float, float] | None]:
    """The CPU path's predicted speed for a model reading `read_bytes` a token: (calibrated tokens/s, None)
    where this machine's measurements calibrate it, else (None, the bandwidth range); both None with no
    bandwidth measured. The same arithmetic as the fit plan's (app/fit/plan.py)."""
    if hardware.bandwidth is None:
        return None, None
    raw = bandwidth_bound(read_bytes, hardware.bandwidth.all_cores)
    cal = (calibration or {}).get("CPU")
    if cal is not None:
        return round(cal.predict(raw), 1), None
    return None, (round(raw * SPEED_BAND[0], 1), round(raw * SPEED_BAND[1], 1))


def size_verdict(
    c: Candidate,
    *,
    hardware: Hardware,
    size: int | None = None,
    note: str,
    calibration: Mapping[str, SpeedCalibration] | None = None,
) -> Verdict:
    """Bytes against the memory budget (GPU first, else RAM), with a fifth more for KV and buffers;
    `size` is the hub's figure where it answered, else the list's is used. On the CPU every weight is
    read per token: the speed is predicted from that (calibrated where `calibration` has the CPU)."""
    source = "hub" if size else "list"
    size = size or c.size
    need = int(size * HEADROOM)
    budget = Budget.of(hardware).devices
    gpu = max((v for k, v in budget.items() if k != "CPU"), default=0)
    ram = budget.get("CPU", 0)
    tps: float | None = None
    band: tuple[float, float] | None = None
    if gpu and need <= gpu:
        verdict, summary = "gpu", f"about {fmt_bytes(need)} in use; {fmt_bytes(gpu)} free on the GPU"
    elif hardware.memory.available is None:
        verdict, summary = None, f"about {fmt_bytes(need)} in use; this machine's free memory is unknown"
    elif need <= ram:
        verdict, summary = "cpu", f"about {fmt_bytes(need)} in use; {fmt_bytes(ram)} of RAM to spare"
        if c.task in USABLE_TOK_S:
            tps, band = predicted_speed(size, hardware=hardware, calibration=calibration)
    else:
        verdict, summary = "too_large", f"does not fit: needs about {fmt_bytes(need)}, {fmt_bytes(ram)} free"
    fits = None if verdict is None else verdict != "too_large"
    return Verdict(
        verdict, fits, summary, tps, size, source, note, tokens_per_s_range=band, calibrated=tps is not None
    )


def verdict_from_detail(
    c: Candidate,
    doc: Mapping[str, Any],
    *,
    hardware: Hardware,
    calibration: Mapping[str, SpeedCalibration] | None = None,
) -> Verdict:
    """The verdict from a hub model page (ModelDetail.public(), fit filled for `c.quant`); its speed is the
    fit plan's prediction (calibrated, else the bandwidth range). `calibration` serves the size-only
    verdicts, for files the memory model does not read."""
    if not c.quant:
        sizes = {f["path"]: f.get("size") for f in doc.get("files") or []}
        missing = [f for f in c.files if f not in sizes]
        if missing:
            raise HubFileNotFoundError(f"{c.repo} has no {missing[0]} any more; judged from the list's size")
        total = sum(int(sizes[f] or 0) for f in c.files) or None
        return size_verdict(
            c,
            hardware=hardware,
            size=total,
            note="judged from the file sizes on the hub",
            calibration=calibration,
        )
    choice = next(
        (
            q
            for q in doc.get("quantizations") or []
            if str(q.get("quant") or q["name"]).upper() == c.quant.upper()
        ),
        None,
    )
    if choice is None:
        raise HubFileNotFoundError(f"{c.repo} has no {c.quant} any more; judged from the list's size")
    projectors = [RepoFile(p["path"], p.get("size")) for p in doc.get("projectors") or []]
    proj = pulled_projector(projectors, c.repo)
    size = int(choice.get("size") or 0) + int((proj.size if proj else 0) or 0)
    v = ((doc.get("fit") or {}).get("quantizations") or {}).get(choice["name"]) or {}
    if v.get("verdict") is None:
        base = size_verdict(
            c,
            hardware=hardware,
            size=size or None,
            note=v.get("summary") or "not estimated",
            calibration=calibration,
        )
        return dataclasses.replace(base, projector=proj.path if proj else None)
    note = f"with the projector {proj.path}" if proj else None
    chosen = ((v.get("plan") or {}).get("chosen")) or {}
    band = chosen.get("tokens_per_s_range")
    tps = chosen.get("tokens_per_s", v.get("tokens_per_s"))
    return Verdict(
        v["verdict"],
        v.get("fits"),
        v.get("summary") or "",
        tps,
        size,
        "hub",
        note,
        proj.path if proj else None,
        tokens_per_s_range=(float(band[0]), float(band[1])) if band and tps is None else None,
        calibrated=bool(chosen.get("calibrated")),
    )


Asker = Callable[[Candidate], Verdict]


def hub_asker(client: Any, *, inputs: AdviceInputs) -> Asker:
    """Ask the hub through a HubClient (blocking): the model page, and the fit of the listed quant."""
    from app.advice.hub_fit import fit_detail

    inputs = dataclasses.replace(inputs, hardware=capped(inputs.hardware, inputs.settings))

    def ask(c: Candidate) -> Verdict:
        detail = client.detail(c.repo, card=False)
        if c.quant:
            fit_detail(detail, reader=client.reader, inputs=inputs, only=c.quant)
        return verdict_from_detail(c, detail.public(), hardware=inputs.hardware, calibration=inputs.speed)

    return ask


def predicted_words(r: dict[str, Any], *, tag: str = " predicted") -> str:
    """An entry's predicted speed for a column: the calibrated figure, else the bandwidth range, marked
    as predicted (nothing is measured before a download) and as slow where the task's pace is not met."""
    if r.get("tokens_per_s") is not None:
        speed = f"~{rate(r['tokens_per_s'])} tok/s{tag}"
    elif r.get("tokens_per_s_range"):
        low, high = r["tokens_per_s_range"]
        speed = f"{rate(low)}-{rate(high)} tok/s{tag}"
    else:
        return "-"
    if r["usable"] is False:
        return speed + " (slow)"
    return speed + (" (may be slow)" if r["usable"] is None and r.get("usable_tok_s") else "")


# ---- ranking ----------------------------------------------------------------------------------------
def usable(c: Candidate, v: Verdict) -> bool | None:
    """Fast enough for the task by the predicted speed: True when even its low end is, False when even its
    high end is not, None in between or where there is no prediction (GPU placements, no bandwidth)."""
    threshold = USABLE_TOK_S.get(c.task)
    if threshold is None or v.predicted is None:
        return None
    low, high = v.predicted
    if low >= threshold:
        return True
    return False if high < threshold else None


def _order(r: Recommendation) -> tuple[int, int, float, int]:
    three = {True: 0, None: 1, False: 2}
    # among the slow ones the quickest first: a model at 0.5 tokens/s is no first choice, whatever its rank
    slow = -r.verdict.predicted[1] if r.usable is False and r.verdict.predicted else 0.0
    return three[r.verdict.fits], three[r.usable], slow, r.candidate.rank


def rank(
    judged: Iterable[tuple[Candidate, Verdict]], *, hardware: Hardware, hub_problem: str | None = None
) -> Recommendations:
    """Per task, best first: fits, then usable speed (the slow ones quickest first), then the list's
    quality order."""
    by_task: dict[str, list[Recommendation]] = {t: [] for t in TASKS}
    for c, v in judged:
        by_task[c.task].append(Recommendation(c, v, usable(c, v)))
    tasks = {t: tuple(sorted(rs, key=_order)) for t, rs in by_task.items() if rs}
    return Recommendations(tasks=tasks, hardware=_hw_summary(hardware), hub_problem=hub_problem)


def recommend(
    inputs: AdviceInputs,
    *,
    ask: Asker | None,
    candidates: Iterable[Candidate] | None = None,
    task: str | None = None,
) -> Recommendations:
    """Judge and rank the list (blocking: run it in a thread). `ask` reaches the hub (None: offline); once
    the hub is offline or unreachable it is not asked again, and the rest are judged by size."""
    if task is not None and task not in TASKS:
        raise SettingsError(f"no task {task!r}; pick one of {', '.join(TASKS)}")
    hw = capped(inputs.hardware, inputs.settings)
    inputs = dataclasses.replace(inputs, hardware=hw)
    chosen = [c for c in candidates or load_candidates() if task is None or c.task == task]
    down: list[str] = [] if ask is not None else ["the hub was not asked (offline)"]

    def one(c: Candidate) -> tuple[Candidate, Verdict]:
        if not down and ask is not None:
            try:
                return c, ask(c)
            except (HubOfflineError, HubUnreachableError) as exc:
                down.append(exc.message)
            except HubError as exc:
                note = f"{exc.message}; judged from the list's size"
                return c, size_verdict(c, hardware=hw, note=note, calibration=inputs.speed)
        note = "the hub did not answer; judged from the list's size"
        return c, size_verdict(c, hardware=hw, note=note, calibration=inputs.speed)

    with ThreadPoolExecutor(max_workers=PARALLEL_ASKS) as pool:
        judged = list(pool.map(one, chosen))
    return rank(judged, hardware=hw, hub_problem=down[0] if down else None)
