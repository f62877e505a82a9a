"""The engine registry's contract (app/lanes/engines/registry.py) and the folder rule that keeps lane names in
app/lanes/engines/: every kind on disk is registered, every registered kind says what it is, and nothing
else in app/ compares a lane's name or keeps a list of lane ids."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import types
from pathlib import Path

import pytest

import app.lanes
from app.core.settings import Settings
from app.formats.detect import ModelKind
from app.hardware.build_choice import BUILDS, BuildRule
from app.lanes.engines.facts import FACTS, Needs
from app.lanes.engines.plan import CAPABILITIES, MEMORY_KINDS, ApiStyle, DraftKind
from app.lanes.engines.registry import KINDS, engine_kinds, kind_of
from app.library.model import LANE_FORMATS
from app.routing.engines import LANES

REPO = Path(__file__).resolve().parents[3]
APP = REPO / "app"


# ---- every kind on disk is registered ---------------------------------------------------------------
def _looks_like_kind(obj: object) -> bool:
    """A kind class or instance: the EngineKind members a lane start uses."""
    return all(hasattr(obj, a) for a in ("lane", "formats", "offers", "memory")) and all(
        callable(getattr(obj, m, None)) for m in ("build", "install", "start_refusal", "capabilities")
    )


def unregistered(module: types.ModuleType, kinds: tuple[object, ...]) -> list[str]:
    """The kinds `module` defines that the registry does not hold: an instance not registered, or a class
    that is neither a registered kind's class nor a base of one."""
    found = []
    for name, obj in vars(module).items():
        if isinstance(obj, type):
            protocol = getattr(obj, "_is_protocol", False)  # EngineKind itself
            if obj.__module__ != module.__name__ or protocol or not _looks_like_kind(obj):
                continue
            if not any(isinstance(k, obj) for k in kinds):
                found.append(f"{module.__name__}.{name} (class)")
        elif _looks_like_kind(obj) and not any(k is obj for k in kinds):
            found.append(f"{module.__name__}.{name}")
    return found


def _lane_modules() -> list[types.ModuleType]:
    """Every module of app/lanes but the workers (they import only their engine's environment)."""
    out = []
    for info in pkgutil.walk_packages(app.lanes.__path__, "app.lanes."):
        if info.name.startswith("app.lanes.workers") or info.name == "app.lanes.guard":
            continue
        out.append(importlib.import_module(info.name))
    return out


def test_every_kind_on_disk_is_registered() -> None:
    missing = [hit for module in _lane_modules() for hit in unregistered(module, KINDS)]
    assert missing == [], f"register these in app/lanes/engines/registry.py KINDS: {missing}"


def test_an_unregistered_kind_is_found() -> None:
    """The rule above catches a new kind module whose one registration line was forgotten."""
    module = types.ModuleType("app.lanes.engines.newkind")
    piper = engine_kinds()["piper"]
    assert dataclasses.is_dataclass(piper) and not isinstance(piper, type)
    module.NEWKIND = dataclasses.replace(piper, lane="newkind")  # type: ignore[attr-defined]

    class NewKind(type(engine_kinds()["sd.cpp"])):  # type: ignore[misc]
        lane = "newkind"

    NewKind.__module__ = module.__name__
    module.NewKind = NewKind  # type: ignore[attr-defined]
    assert unregistered(module, KINDS) == [
        "app.lanes.engines.newkind.NEWKIND",
        "app.lanes.engines.newkind.NewKind (class)",
    ]
    assert unregistered(module, (*KINDS, module.NEWKIND, NewKind())) == []  # type: ignore[attr-defined]


# ---- every registered kind says what it is ----------------------------------------------------------
def test_the_registry_holds_every_lane_once_in_routing_order() -> None:
    lanes = [k.lane for k in KINDS]
    assert lanes == list(LANES)  # routing titles and routes exactly the registered lanes
    assert list(engine_kinds()) == lanes
    assert all(kind_of(k.lane) is k for k in KINDS) and kind_of("no-such-lane") is None


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.lane)
def test_a_kind_declares_what_it_is(kind: object) -> None:
    fields = {f.name for f in Settings.fields()}
    k = kind_of(kind.lane)  # type: ignore[attr-defined]
    assert k is kind and k is not None
    assert k.formats and k.formats <= LANE_FORMATS | {m.value for m in ModelKind}
    assert k.offers and k.offers <= set(CAPABILITIES)
    assert k.memory in MEMORY_KINDS
    assert isinstance(k.api_style, ApiStyle)
    assert isinstance(k.draft, DraftKind)
    assert isinstance(k.setting_keys, tuple) and set(k.setting_keys) <= fields, k.setting_keys
    assert isinstance(k.install_estimate_s, int) and k.install_estimate_s > 0
    assert isinstance(k.build_rule, BuildRule) and k.build_rule.builds <= set(BUILDS)
    assert list(inspect.signature(k.build).parameters) == ["entry", "settings", "start"]
    assert callable(k.predict) and callable(k.window)


def test_each_lane_row_routes_only_what_its_kind_runs() -> None:
    """A lane's row in facts.py (what routing reads) and its kind (what starts it) agree: every route key
    is a format the kind runs, or a part of one, and a reason is given only for a route it has."""
    parts = {"gguf-pooled": "gguf", "safetensors-quantized": "safetensors"}
    for row in FACTS:
        kind = kind_of(row.id)
        assert kind is not None, f"{row.id} has a row in facts.py but no kind in registry.py"
        formats = {parts.get(key, key) for key in row.routes}
        # an Apple lane's kind runs plain safetensors only on Apple Silicon (mlx.py); elsewhere routing
        # turns it down by its `needs` before it would start
        allowed = {"safetensors"} if row.needs is Needs.APPLE else set()
        assert row.routes and formats - kind.formats <= allowed, (row.id, sorted(formats - kind.formats))
        assert set(row.reasons) <= set(row.routes), row.id
        assert not set(row.refusal_tips) & set(row.routes), row.id  # a tip is for what it does not read
        # one name for a lane in the window and in errors: a kind that titles itself uses the row's title
        assert getattr(kind, "title", None) in (None, row.title), (row.id, kind.title)  # type: ignore[attr-defined]


def test_each_setting_key_belongs_to_one_kind() -> None:
    owners: dict[str, list[str]] = {}
    for k in KINDS:
        for key in k.setting_keys:
            owners.setdefault(key, []).append(k.lane)
    assert {key: lanes for key, lanes in owners.items() if len(lanes) > 1} == {}


# ---- the folder rule: no lane names outside app/lanes/engines/ -------------------------------------
# The lane ids live in app/lanes/engines/ alone: its facts.py table says what routing needs of each lane
# (titles, routes, what machine it needs), so routing asks the table, not a name. Everything else asks a
# kind (app/fit/gpu_share.py plans with the ShareRule a kind declares), with no file excepted.
FORMAT_NAMES = {m.value for m in ModelKind}


def _mentions_lane(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return "lane" in text or "engine" in text


def lane_names_in(path: Path) -> list[str]:
    """Where `path` compares a lane's name, keys a dict by lane ids, indexes by one, or imports a list."""
    ids = set(LANES)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hits: list[str] = []

    def constants(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(*(constants(e) for e in node.elts)) if node.elts else set()
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("frozenset", "set", "tuple"):
            return set().union(*(constants(a) for a in node.args)) if node.args else set()
        return set()

    def named(values: set[str], other: ast.AST | None) -> set[str]:
        # "mlx" and "piper" are model formats too: a format comparison is not a lane's name
        return {
            v for v in values & ids if v not in FORMAT_NAMES or (other is not None and _mentions_lane(other))
        }

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                others = [s for j, s in enumerate(sides) if j != i]
                if found := named(constants(side), others[0] if others else None):
                    hits.append(f"{node.lineno}: compares {sorted(found)}")
        elif isinstance(node, ast.Dict):
            keys = set().union(*(constants(k) for k in node.keys if k is not None)) if node.keys else set()
            if found := named(keys, None):
                hits.append(f"{node.lineno}: a dict keyed by {sorted(found)}")
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) != "Literal":
            if found := named(constants(node.slice), node.value):
                hits.append(f"{node.lineno}: indexes by {sorted(found)}")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node in tree.body and node.value is not None:
            # a module's name for a lane id (LLAMA_CPP = "llama.cpp") is the start of a hand-kept list
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(node.value, ast.Constant) and (found := named(constants(node.value), target)):
                hits.append(f"{node.lineno}: names {sorted(found)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app."):
            # LANES is the vocabulary itself (a pin menu lists it); a subset of it is a list kept by hand
            lists = {a.name for a in node.names} & {"LLAMA_ENGINES", "CUDA_LANES"}
            # ... and so is one lane's id under its constant's name (LLAMA_CPP_COMPAT): the kind knows it
            lists |= {a.name for a in node.names if _constant(node.module or "", a.name) in ids}
            if lists:
                hits.append(f"{node.lineno}: imports {sorted(lists)}")
    return sorted(hits, key=lambda hit: int(hit.split(":")[0]))


def _constant(module: str, name: str) -> str | None:
    """The text `from module import name` binds, where it is text and the module imports here."""
    try:
        value = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return value if isinstance(value, str) else None


def _outside_engines() -> list[Path]:
    engines = APP / "lanes" / "engines"
    return [p for p in sorted(APP.rglob("*.py")) if not p.is_relative_to(engines)]


def test_the_rule_covers_routing() -> None:
    """Routing decides by each lane's row in app/lanes/engines/facts.py, never by a lane's name."""
    covered = _outside_engines()
    assert APP / "routing" / "traits.py" in covered and APP / "routing" / "decide.py" in covered


def test_no_lane_names_outside_the_engines() -> None:
    found = {str(p.relative_to(REPO)): hits for p in _outside_engines() if (hits := lane_names_in(p))}
    assert found == {}, "ask the kind (api_style, draft, predict, setting_keys) or the registry instead"


def test_the_rule_sees_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from app.routing.engines import LLAMA_ENGINES, title\n"
        "from app.lanes.engines.llamacpp.compat import LLAMA_CPP_COMPAT\n"
        "ok = entry.format == 'mlx' and method == 'mlx'\n"  # formats and quantization methods are fine
        "a = lane.engine == 'mlx'\n"
        "b = kind in ('llama.cpp', 'llama.cpp-compat')\n"
        "c = {'vllm': 600}\n"
        "d = lanes['llama.cpp']\n"
        "SD_CPP = 'sd.cpp'\n"
        "fmt = 'mlx'\n",
        encoding="utf-8",
    )
    assert lane_names_in(sample) == [
        "1: imports ['LLAMA_ENGINES']",
        "2: imports ['LLAMA_CPP_COMPAT']",
        "4: compares ['mlx']",
        "5: compares ['llama.cpp', 'llama.cpp-compat']",
        "6: a dict keyed by ['vllm']",
        "7: indexes by ['llama.cpp']",
        "8: names ['sd.cpp']",
    ]


def test_every_kind_with_a_worker_builds_its_params() -> None:
    """A kind with our worker names the worker's module and the function that builds its params (a
    `Worker`): the module is there and the builder is a function of the model and the settings."""
    import importlib.util
    import inspect

    from app.lanes.engines.python_kind import PythonEngineKind
    from app.lanes.engines.registry import KINDS

    with_worker = [k for k in KINDS if isinstance(k, PythonEngineKind) and k.worker is not None]
    assert len(with_worker) >= 3  # piper, whisper.cpp, mistral.rs: the check sees them
    lacking = [
        k.lane
        for k in with_worker
        if k.worker is None
        or importlib.util.find_spec(k.worker.module) is None
        or list(inspect.signature(k.worker.params).parameters) != ["entry", "settings"]
    ]
    assert not lacking, lacking
