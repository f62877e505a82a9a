"""Fit before download: GGUF headers read from the fake hub with Range requests only, the verdict equal to
the local fit of the same file, multi-part models, the read cache, growth and its cap, safetensors repos."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from app.advice.explain import explain
from app.advice.hub_fit import fit_detail
from app.advice.inputs import AdviceInputs
from app.core.errors import HeaderReadError
from app.core.paths import Paths
from app.core.settings import Settings
from app.formats.gguf_header import NeedMore, header_end
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.hardware.model import Hardware
from app.hardware.probe import probe
from app.hub.browse import Hub
from app.hub.range_reader import RangeReader, ReadCache
from app.hub.token import TokenStore
from app.lanes.engines.llamacpp.kind import fit_for
from app.library.model import ModelEntry
from tests.support.fakehub import FakeHub, gguf_repo_files
from tests.support.modelgen import DIMS_DEFAULT, GGUFSpec, llama_tensors, write_gguf, write_hf_dir
from tests.support.tinymodels import TinySpec, write_tiny_gguf

REPO = "org/tiny-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, large_model: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hub-fit")
    split = write_gguf(d / "split" / "m.gguf", GGUFSpec(n_layer=4, split_max_tensors=8))
    out = {"Q4_K_M": write_tiny_gguf(d / "a.gguf", TinySpec(seed=3)), "Q8_0": large_model}
    out.update({f"part{i}": p for i, p in enumerate(split.paths, 1)})
    return out


@pytest.fixture(scope="module")
def hardware() -> Hardware:
    return probe(engine=False)


def _hub() -> Hub:
    paths, settings = Paths.from_env(), Settings()
    return Hub(paths, settings, tokens=TokenStore(paths, settings, env={}))


def _add(hub: FakeHub, files: dict[str, Path], repo: str = REPO, **kw: object) -> None:
    content = gguf_repo_files("tiny", {"Q4_K_M": files["Q4_K_M"], "Q8_0": files["Q8_0"]})
    n = sum(1 for k in files if k.startswith("part"))
    for i in range(1, n + 1):
        content[f"tiny-Q2_K-{i:05d}-of-{n:05d}.gguf"] = files[f"part{i}"].read_bytes()
    hub.add_repo(repo, content, tags=["gguf"], **kw)  # type: ignore[arg-type]


def _local_entry(paths: list[Path]) -> ModelEntry:
    facts = read_gguf(paths[0])
    assert isinstance(facts, GGUFFacts)
    return ModelEntry("local", paths[0], facts, None, tuple(paths))


def test_header_end_matches_the_gguf_reader(files: dict[str, Path]) -> None:
    for key in ("Q4_K_M", "part1", "part2"):
        data = files[key].read_bytes()
        reader = gguf.GGUFReader(str(files[key]))
        end = header_end(data)
        assert isinstance(end, int)
        align = reader.alignment
        assert end <= reader.data_offset == (end + align - 1) // align * align
        short = header_end(data[: end - 1])
        assert isinstance(short, NeedMore) and end - 1 < short.at_least <= end
    assert isinstance(header_end(b"NOPE" + bytes(40)), GGUFProblem)


def test_hub_fit_reads_little_and_equals_local_fit(
    fake_hub: FakeHub, files: dict[str, Path], hardware: Hardware
) -> None:
    _add(fake_hub, files)
    hub = _hub()
    client = hub.client()
    detail = fit_detail(
        client.detail(REPO),
        reader=client.reader,
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
    )
    by_quant = detail.fit["quantizations"]  # type: ignore[index]
    assert sorted(by_quant) == ["Q2_K", "Q4_K_M", "Q8_0"]
    large = files["Q8_0"]
    assert large.stat().st_size > 10 * 2**20
    served = fake_hub.served[f"{REPO}/tiny-Q8_0.gguf"]
    assert 0 < served < large.stat().st_size // 10
    assert served == by_quant["Q8_0"]["header_bytes_fetched"]
    assert all(method == "GET" and rng and rng.startswith("bytes=") for method, _, rng in fake_hub.requests)
    locals_ = {
        "Q4_K_M": [files["Q4_K_M"]],
        "Q8_0": [large],
        "Q2_K": [files[k] for k in sorted(files) if k.startswith("part")],
    }
    for name, paths in locals_.items():
        on_hub = by_quant[name]
        local = fit_for(_local_entry(paths), hub.settings, hardware=hardware)
        assert not isinstance(local, GGUFProblem)
        assert on_hub["plan"] == local.public(), name
        assert on_hub["verdict"] == local.verdict and on_hub["summary"] == local.summary
        inputs = AdviceInputs(settings=hub.settings, hardware=hardware, pins={})
        doc = explain(_local_entry(paths), inputs=inputs).public()
        assert on_hub["lane"] == doc["decision"]["lane"] and on_hub["lane"] is not None
        assert on_hub["reasons"] == doc["decision"]["reasons"]
        assert on_hub["facts"] == doc["facts"]
    # every part of the multi-part model was read (each part has its own header and tensor table)
    n_parts = len(locals_["Q2_K"])
    assert n_parts > 1
    assert all(
        fake_hub.served[f"{REPO}/tiny-Q2_K-{i:05d}-of-{n_parts:05d}.gguf"] > 0 for i in range(1, n_parts + 1)
    )
    public = detail.public()
    assert public["fit"]["quantizations"]["Q8_0"]["max_ctx"] is not None


def test_cache_hit_makes_no_requests_and_corrupt_entries_are_reread(
    fake_hub: FakeHub, files: dict[str, Path], hardware: Hardware
) -> None:
    _add(fake_hub, files)
    hub = _hub()
    client = hub.client()
    detail = client.detail(REPO)
    first = fit_detail(
        detail, reader=client.reader, inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={})
    )
    verdicts = {k: v["summary"] for k, v in first.fit["quantizations"].items()}  # type: ignore[index]
    fake_hub.reset_counters()
    again = fit_detail(
        client.detail(REPO, card=False),
        reader=hub.reader(),
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
    )
    assert fake_hub.requests == [] and dict(fake_hub.served) == {}
    assert {k: v["summary"] for k, v in again.fit["quantizations"].items()} == verdicts  # type: ignore[index]
    assert all(v["header_bytes_fetched"] == 0 for v in again.fit["quantizations"].values())  # type: ignore[index]
    # damage every cached header: they are ignored, read again and written back
    records = [json.loads(p.read_text()) for p in hub.cache_root.glob("*.json")]
    keys = [p.with_suffix(".bin") for p, r in zip(hub.cache_root.glob("*.json"), records, strict=True)]
    bins = [k for k, r in zip(keys, records, strict=True) if r["kind"] == "gguf-header"]
    assert len(bins) == 2 + len([k for k in files if k.startswith("part")])
    for b in bins:
        b.write_bytes(b"garbage")
    fake_hub.reset_counters()
    third = fit_detail(
        client.detail(REPO, card=False),
        reader=hub.reader(),
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
    )
    assert {k: v["summary"] for k, v in third.fit["quantizations"].items()} == verdicts  # type: ignore[index]
    assert fake_hub.served[f"{REPO}/tiny-Q8_0.gguf"] > 0
    assert all(b.read_bytes() != b"garbage" for b in bins)


def test_range_grows_by_doubling_and_stops_at_the_cap(fake_hub: FakeHub, files: dict[str, Path]) -> None:
    _add(fake_hub, files)
    hub = _hub()
    config = hub.config()
    commit = fake_hub.repos[REPO].head.sha
    data = files["Q4_K_M"].read_bytes()
    end = header_end(data)
    assert isinstance(end, int) and end > 4096
    reader = RangeReader(config, ReadCache(hub.cache_root / "grow"), first=1024)
    prefix = reader.gguf_header(REPO, commit, "tiny-Q4_K_M.gguf")
    assert prefix.data == data[:end] and prefix.total == len(data)
    ranges = [rng for _, path, rng in fake_hub.requests if path == "tiny-Q4_K_M.gguf"]
    assert ranges[:3] == ["bytes=0-1023", "bytes=1024-2047", "bytes=2048-4095"]
    assert len(ranges) >= 3 and prefix.fetched < 2 * end
    capped = RangeReader(config, ReadCache(hub.cache_root / "cap"), first=1024, cap=4096)
    with pytest.raises(HeaderReadError, match="needs more than"):
        capped.gguf_header(REPO, commit, "tiny-Q4_K_M.gguf")


def test_server_ignoring_range_still_reads_only_a_prefix(
    fake_hub: FakeHub, files: dict[str, Path], hardware: Hardware
) -> None:
    _add(fake_hub, files)
    fake_hub.faults.no_range = True
    hub = _hub()
    client = hub.client()
    detail = fit_detail(
        client.detail(REPO),
        reader=client.reader,
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
        only="Q8_0",
    )
    on_hub = detail.fit["quantizations"]["Q8_0"]  # type: ignore[index]
    local = fit_for(_local_entry([files["Q8_0"]]), hub.settings, hardware=hardware)
    assert not isinstance(local, GGUFProblem) and on_hub["plan"] == local.public()
    assert on_hub["header_bytes_fetched"] < files["Q8_0"].stat().st_size // 10


def test_gated_fit_says_what_to_do(fake_hub: FakeHub, files: dict[str, Path], hardware: Hardware) -> None:
    _add(fake_hub, files, repo="meta/gated-GGUF", gated="auto")
    hub = _hub()
    client = hub.client()
    detail = fit_detail(
        client.detail("meta/gated-GGUF"),
        reader=client.reader,
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
    )
    for v in detail.fit["quantizations"].values():  # type: ignore[index]
        assert v["verdict"] is None and "switchyard hub login" in v["problem"]


def test_safetensors_repo_size_verdict(fake_hub: FakeHub, tmp_path: Path, hardware: Hardware) -> None:
    folder = tmp_path / "st"
    write_hf_dir(folder, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), shards=2)
    content = {p.name: p.read_bytes() for p in folder.iterdir()}
    fake_hub.add_repo("acme/llama-st", content, tags=["safetensors"], library_name="transformers")
    hub = _hub()
    client = hub.client()
    detail = fit_detail(
        client.detail("acme/llama-st"),
        reader=client.reader,
        inputs=AdviceInputs(settings=hub.settings, hardware=hardware, pins={}),
    )
    weights = detail.fit["safetensors"]  # type: ignore[index]
    shard_bytes = sum(len(v) for k, v in content.items() if k.endswith(".safetensors"))
    assert weights["parameters"] == DIMS_DEFAULT.logical_params()
    assert 0 < weights["weights_bytes"] < shard_bytes
    assert weights["verdict"] in ("gpu", "cpu") and weights["max_ctx"] is None and weights["max_ctx_reason"]
    assert weights["architectures"] == ["LlamaForCausalLM"]
    assert detail.fit["quantizations"] == {}  # type: ignore[index]
    json.dumps(detail.public())
