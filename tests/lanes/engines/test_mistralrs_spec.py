"""Speculative decoding on the mistral.rs lane (issue 16): what the installed `mistralrs` Runner offers (an
MTP assistant, nothing else), the same `speculative` setting mapped onto it, and every kind or knob it
lacks refused at the start with what the lane takes, through a real `switchyard serve`.

The Runner attaches an MTP assistant only under PagedAttention, which runs on CUDA and Metal, so on a
machine without either (this one) no draft run can happen: the worker is shown handing the assistant to
the real Runner, and the Runner's own refusal reaching the lane log, instead of an identical greedy answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.hardware.model import CPUInfo, GPUInfo, Hardware, MemoryInfo
from app.lanes.engines.mistralrs import DRAFT_SHAPE, MISTRALRS, SPEC_SHAPE, with_assistant
from app.lanes.engines.mistralrs_api import LaneParams
from app.lanes.engines.plan import StartContext
from app.library.model import ModelEntry
from tests.conftest import REPO, ServerProcess, link_models, running_server
from tests.lanes.engines.llamacpp.test_spec import other_tokenizer
from tests.lanes.engines.test_mistralrs import ANSWER, GRAMMAR, PINNED, cli, lanes
from tests.support.mlxgen import write_hf_llama

mistralrs = pytest.importorskip("mistralrs")
pytest.importorskip("tokenizers")

ASSISTANT = "org/assistant"  # a plain folder standing for an MTP assistant (mistral.rs reads folders)
# PagedAttention, which an MTP assistant needs, runs on CUDA and Metal only
PAGED = Path("/dev/nvidia0").exists() or (sys.platform == "darwin" and platform.machine() == "arm64")
no_paging = pytest.mark.skipif(PAGED, reason="this machine may run PagedAttention: the refusal differs")


def test_the_runner_offers_mtp_assistants_and_nothing_else() -> None:
    """What docs/engines.md says mistralrs offers, read from the installed wheel: the day a build brings a
    general draft model or n-gram lookup back, this fails and the lane can map more of the setting."""
    signature = mistralrs.Runner.__text_signature__
    assert "mtp_model=" in signature and "mtp_n_predict=" in signature
    assert "which_draft" not in signature and "speculative_gamma" not in signature  # removed upstream
    names = [n.lower() for n in dir(mistralrs)] + [n.lower() for n in dir(mistralrs.Which)]
    assert not [n for n in names if any(w in n for w in ("specul", "draft", "ngram"))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("mtp")
    return write_hf_llama(base / "target"), write_hf_llama(base / "assistant")


def run_worker(params: LaneParams, *, until_ready: bool) -> tuple[int | None, str]:
    """Our worker, as the lane starts it; (exit code, stderr). `until_ready`: stop it (SIGTERM) once it
    reports that it listens, and return (None, its ready line)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1", RAYON_NUM_THREADS="2", RUST_BACKTRACE="1")
    argv = [sys.executable, "-m", "app.lanes.workers.mistralrs", "--ppid", str(os.getpid())]
    proc = subprocess.Popen(
        [*argv, "--params", params.to_json()],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if until_ready else subprocess.PIPE,  # unread: it must not fill up
        text=True,
    )
    try:
        if until_ready:
            assert proc.stdout is not None
            line = next((ln for ln in proc.stdout if ln.startswith('{"switchyard"')), "")
            proc.terminate()
            proc.wait(30)
            return None, line
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@no_paging
def test_the_worker_hands_the_assistant_to_the_runner(folders: tuple[Path, Path]) -> None:
    target, assistant = folders
    base = LaneParams(model_path=str(target), alias="m", source="plain", files=(), max_seqs=1)
    _, ready = run_worker(base, until_ready=True)
    assert json.loads(ready)["ready"] is True  # the model alone loads
    spec = dataclasses.replace(base, mtp_model=str(assistant), mtp_n_predict=3)
    code, log = run_worker(spec, until_ready=False)
    # the same model with the assistant: the real Runner takes it and refuses it without PagedAttention
    assert code == 5, log
    assert "MTP speculative decoding currently requires PagedAttention" in log
    assert f"asked to draft with the MTP assistant {assistant}" in log and '{"type": "off"}' in log
    assert "<candle_core::error::Error>::bt" not in log  # the lane shows the reason, not a backtrace


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("mrs-spec")
    models = link_models(base / "models", model_store / "tiny.gguf")
    (models / f"{PINNED}.gguf").hardlink_to(models / "tiny.gguf")
    write_hf_llama(models / ASSISTANT)
    pinned = cli(base / "home", "pin", PINNED, "mistral.rs", "--models-dir", str(models))
    assert pinned.returncode == 0, pinned.stderr
    with running_server(base / "home", models) as s:
        yield s


def load(server: ServerProcess, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        server.url + f"/api/models/{PINNED}/load",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(server: ServerProcess) -> str:
    body = {"model": PINNED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, **GRAMMAR}
    req = urllib.request.Request(
        server.api + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return str(json.loads(r.read())["choices"][0]["message"]["content"])


OFF = '{"type": "off"}'
REFUSED = [  # (the setting, why it is refused, what the message offers instead)
    ({"type": "ngram"}, "mistral.rs has no n-gram speculation ('ngram_mod')", SPEC_SHAPE),
    ({"type": "ngram_cache"}, "mistral.rs has no n-gram speculation ('ngram_cache')", SPEC_SHAPE),
    (
        {"type": "draft", "draft": ASSISTANT, "p_min": 0.5},
        "mistral.rs has no p_min for its drafts",
        SPEC_SHAPE,
    ),
    ({"type": "draft", "n_max": 4}, "which the library cannot propose", DRAFT_SHAPE),
]
if not PAGED:
    REFUSED.append(
        ({"type": "draft", "draft": ASSISTANT, "n_max": 4}, "needs an NVIDIA (CUDA) or Apple", OFF)
    )


@pytest.mark.parametrize(("value", "words", "offers"), REFUSED)
def test_what_mistralrs_cannot_do_is_refused_at_the_start(
    server: ServerProcess, value: dict[str, Any], words: str, offers: str
) -> None:
    status, doc = load(server, {"speculative": value})
    assert status == 503, doc
    message = doc["error"]["message"]
    assert message.startswith(f"cannot start {PINNED!r} on mistral.rs: ") and words in message, message
    assert offers in message and "previous settings are back" in message, message
    assert doc["error"]["code"] == "engine_unavailable"
    assert lanes(server)[PINNED]["settings"]["speculative"] != value  # the load body was not kept
    # nothing was kept: the model loads as before and answers
    assert chat(server) == ANSWER


def test_off_loads_without_an_assistant(server: ServerProcess) -> None:
    status, doc = load(server, {"speculative": {"type": "off"}})
    assert status == 200, doc
    assert doc["state"] == "ready" and doc["engine"] == "mistral.rs", doc
    assert doc["params"]["mtp_model"] == "" and doc["params"]["mtp_n_predict"] == 0
    assert chat(server) == ANSWER


def gguf_entry(path: Path) -> ModelEntry:
    facts = read_gguf(path)
    assert isinstance(facts, GGUFFacts)
    return ModelEntry(id=path.stem, path=path, facts=facts, problem=None)


def test_the_assistant_passes_the_tokenizer_check_llamacpp_drafts_pass(
    tmp_path: Path, model_store: Path, folders: tuple[Path, Path]
) -> None:
    models = link_models(tmp_path, model_store / "tiny.gguf", model_store / "tiny2.gguf")
    other_tokenizer(model_store / "tiny.gguf", models / "alien.gguf")
    tiny, tiny2, alien = (gguf_entry(models / f"{n}.gguf") for n in ("tiny", "tiny2", "alien"))
    folder = ModelEntry(ASSISTANT, folders[1], None, None, format="safetensors", kind_name="chat")
    library = [tiny, tiny2, alien, folder]

    def paired(draft: str) -> ModelEntry:
        spec = {"type": "draft", "draft": draft, "n_max": 4}
        return with_assistant(tiny, Settings.flat(model_overrides={"tiny": {"speculative": spec}}), library)

    with pytest.raises(EngineUnavailableError, match="token list differs"):
        paired("alien")
    with pytest.raises(EngineUnavailableError, match="is not in the library"):
        paired("nosuch")
    # the folder assistant is compared too (drafts.py reads its tokenizer.json): its vocabulary differs
    with pytest.raises(EngineUnavailableError, match="its vocabulary has 128 tokens"):
        paired(ASSISTANT)
    same = paired("tiny2")
    assert same.draft == tiny2.path  # the same tokenizer: paired
    settings = Settings.flat(model_overrides={"tiny": {"speculative": {"type": "draft", "draft": "tiny2"}}})
    with pytest.raises(EngineUnavailableError, match=r"from a model folder .* the file tiny2\.gguf"):
        MISTRALRS.build(same, settings, StartContext(ppid=1, port=0, hardware=None))
    ngram = Settings.flat(model_overrides={"tiny": {"speculative": {"type": "ngram"}}})
    with pytest.raises(EngineUnavailableError, match=r"mistral\.rs has no n-gram speculation"):
        with_assistant(tiny, ngram, library)  # refused before any pairing, with what the lane can do


def machine(os_: str, arch: str, vendor: Any = None) -> Hardware:
    gpus = (
        ()
        if vendor is None
        else (GPUInfo(0, vendor, "gpu", 1 << 34, 1 << 34, 0, None, None, False, None, "nvml"),)
    )
    memory = MemoryInfo(total=1 << 36, available=1 << 35, swap_total=0, swap_free=0, cgroup_limit=None)
    cpu = CPUInfo("cpu", 8, 8, 8, None, ())
    return Hardware(os_, arch, cpu, memory, gpus, engine_devices=(), bandwidth=None)


HW = {
    "nvidia": machine("linux", "x86_64", "nvidia"),
    "apple": machine("darwin", "arm64", "apple"),
    "amd": machine("linux", "x86_64", "amd"),
    "cpu": machine("linux", "x86_64"),
}


def test_the_plan_carries_the_assistant_where_paging_runs(folders: tuple[Path, Path]) -> None:
    if not MISTRALRS.install(Settings()).installed:
        pytest.skip("mistralrs is not installed")
    target, assistant = folders
    entry = ModelEntry("org/t", target, None, None, format="safetensors", kind_name="chat", draft=assistant)
    spec = {"type": "draft", "draft": ASSISTANT, "n_max": 4}
    settings = Settings.flat(model_overrides={"org/t": {"speculative": spec}})
    for name in ("nvidia", "apple"):
        plan = MISTRALRS.build(entry, settings, StartContext(ppid=1, port=0, hardware=HW[name]))
        assert isinstance(plan.params, LaneParams)
        assert plan.params.mtp_model == str(assistant) and plan.params.mtp_n_predict == 4
        assert LaneParams.from_json(plan.params.to_json()) == plan.params  # what the worker reads
    for name in ("amd", "cpu"):  # no CUDA, no Metal: refused before the weights load
        with pytest.raises(EngineUnavailableError, match="only under PagedAttention"):
            MISTRALRS.build(entry, settings, StartContext(ppid=1, port=0, hardware=HW[name]))
    own = Settings.flat(model_overrides={"org/t": {"speculative": {"type": "draft", "draft": ASSISTANT}}})
    plan = MISTRALRS.build(entry, own, StartContext(ppid=1, port=0, hardware=HW["nvidia"]))
    assert isinstance(plan.params, LaneParams) and plan.params.mtp_n_predict == 0  # the assistant's own
    unpaired = ModelEntry("org/t", target, None, None, format="safetensors", kind_name="chat")
    with pytest.raises(EngineUnavailableError, match="was not paired with it"):
        MISTRALRS.build(unpaired, settings, StartContext(ppid=1, port=0, hardware=HW["nvidia"]))
    off = MISTRALRS.build(entry, Settings(), StartContext(ppid=1, port=0, hardware=HW["cpu"]))
    assert isinstance(off.params, LaneParams) and off.params.mtp_model == ""  # a stale draft is not loaded
