"""One base for the Python-packaged engine kinds, the JSON params mixin, and LaunchPlan by keyword only."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.errors import EngineStartError, EngineUnavailableError
from app.core.settings import Settings
from app.lanes.engines.mistralrs import MISTRALRS
from app.lanes.engines.mlx import MLX
from app.lanes.engines.piper import PIPER
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.lanes.engines.python_kind import PythonEngineKind
from app.lanes.engines.registry import engine_kinds
from app.lanes.engines.whisper import WHISPER
from app.lanes.workers.params import (
    LlamaParams,
    MistralRsParams,
    PiperParams,
    WhisperParams,
    worker_command_line,
)
from app.library.model import ModelEntry

REPO = Path(__file__).resolve().parents[3]
MISSING = PythonEngineKind(
    lane="piper",
    title="Nothing",
    runtime="nothing",
    module="no_such_engine_module_xyz",
    dists=("no-such-engine-dist",),
    hint="pip install no-such-engine-dist",
    formats=frozenset({"piper"}),
    offers=frozenset({"speech"}),
    memory="fixed",
    worker="app.lanes.workers.piper",
)


def test_the_four_python_engines_share_one_base_and_keep_their_data() -> None:
    kinds = engine_kinds()
    for kind in (PIPER, WHISPER, MLX, MISTRALRS):
        assert isinstance(kind, PythonEngineKind) and kinds[kind.lane] is kind
    assert (PIPER.runtime, WHISPER.runtime, MLX.runtime, MISTRALRS.runtime) == (
        "piper-tts",
        "pywhispercpp",
        "mlx-lm",
        "mistralrs",
    )
    assert MLX.worker is None and MLX.requires == (("mlx", "mlx"),)  # its own server, and two packages
    with pytest.raises(dataclasses.FrozenInstanceError):
        PIPER.lane = "other"  # type: ignore[misc]


def test_a_missing_engine_says_what_to_install_in_every_state() -> None:
    entry = ModelEntry("voice", Path("/nowhere/voice.onnx"), None, None, format="piper")
    install = MISSING.install(Settings())
    assert not install.installed and install.note == (
        "no-such-engine-dist is not installed: pip install no-such-engine-dist"
    )
    assert MISSING.start_refusal(Settings(), None) == install.note
    with pytest.raises(EngineUnavailableError, match=r"cannot start 'voice' on Nothing: no-such-engine-dist"):
        MISSING.build(entry, Settings(), StartContext(ppid=1, port=0, hardware=None))


def test_a_required_companion_module_must_import_too() -> None:
    here = dataclasses.replace(MISSING, module="json", requires=(("no_such_companion_xyz", "companion"),))
    install = here.install(Settings())
    assert not install.installed
    assert install.note == "no-such-engine-dist is here but companion is not: pip install no-such-engine-dist"
    assert dataclasses.replace(here, requires=(("json", "json"),)).install(Settings()).installed


def test_the_first_installed_distribution_gives_the_version() -> None:
    assert dataclasses.replace(MISSING, dists=("no-such-engine-dist", "aiohttp")).dist() == "aiohttp"
    assert MISSING.dist() == "no-such-engine-dist"  # none here: the first is named


def test_the_worker_plan_carries_the_kinds_environment_and_threads(tmp_path: Path) -> None:
    if not PIPER.install(Settings()).installed:
        pytest.skip("piper-tts is not installed")
    kind = dataclasses.replace(PIPER, env=(("SWITCHYARD_TEST_FLAG", "on"),), threads_env="SOME_THREADS")
    entry = ModelEntry("voice", tmp_path / "voice.onnx", None, None, format="piper")
    plan = kind.build(entry, Settings.flat(threads=3), StartContext(ppid=os.getpid(), port=0, hardware=None))
    assert plan.port is None and plan.engine == "piper" and plan.memory == "fixed"
    assert plan.env["SWITCHYARD_TEST_FLAG"] == "on" and plan.env["SOME_THREADS"] == "3"
    assert plan.env["PYTHONUNBUFFERED"] == "1" and "app.lanes.workers.piper" in plan.argv
    sent = PiperParams.from_json(plan.argv[plan.argv.index("--params") + 1])
    assert sent == plan.params and sent.config_path == str(tmp_path / "voice.onnx.json")


def test_launch_plan_fields_are_keyword_only() -> None:
    params = WhisperParams(model_path="m.bin", alias="m", threads=1)
    with pytest.raises(TypeError):
        LaunchPlan("x", (), {}, "/health", None, params)  # type: ignore[call-arg]
    plan = LaunchPlan(runtime="x", argv=(), env={}, health_path="/health", port=None, params=params)
    assert plan.public()["params"] == {"model_path": "m.bin", "alias": "m", "threads": 1}


def test_params_round_trip_and_lists_come_back_as_tuples() -> None:
    llama = LlamaParams("m.gguf", "m", 4096, 1, 2, "f16", "auto", -1, False, None)
    assert LlamaParams.from_json(llama.to_json()) == llama
    rs = MistralRsParams(model_path="a", alias="a", source="gguf", files=("a-1.gguf", "a-2.gguf"), max_seqs=2)
    back = MistralRsParams.from_json(rs.to_json())
    assert back == rs and isinstance(back.files, tuple)
    # a field with a default may be left out
    no_cache = (
        '{"model_path": "m", "alias": "m", "ctx_size": 1, "parallel": 1, "threads": 1, "kv_type": "f16",'
    )
    no_cache += ' "flash_attn": "on", "gpu_layers": 0, "embedding": true, "pooling": "mean"}'
    assert LlamaParams.from_json(no_cache).cache_ram_mib == 512


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"model_path": "m", "alias": "m", "threads": "4"}', "threads must be int, not str"),
        ('{"model_path": "m", "alias": "m", "threads": true}', "threads must be int, not bool"),
        ('{"model_path": "m", "alias": "m", "threads": 1.5}', "threads must be int, not float"),
        ('{"model_path": 7, "alias": "m", "threads": 1}', "model_path must be str, not int"),
        ('{"model_path": "m", "alias": "m", "threads": 1, "gpu": 0}', "unknown fields gpu"),
        ('["m", "m", 1]', "expected a JSON object, not list"),
        ("{not json", "Expecting property name"),
        ('{"model_path": "m", "alias": "m"}', "threads"),
    ],
)
def test_params_of_the_wrong_shape_are_refused_with_what_to_do(text: str, why: str) -> None:
    with pytest.raises(EngineStartError, match="restart Switchyard") as caught:
        WhisperParams.from_json(text)
    assert why in caught.value.message


def test_optional_and_tuple_fields_are_checked() -> None:
    base = '"model_path": "m", "alias": "m", "ctx_size": 1, "parallel": 1, "threads": 1, "kv_type": "f16",'
    base += ' "flash_attn": "on", "gpu_layers": 0, "embedding": false'
    assert LlamaParams.from_json("{" + base + ', "pooling": null}').pooling is None
    with pytest.raises(EngineStartError, match="pooling must be"):
        LlamaParams.from_json("{" + base + ', "pooling": 3}')
    rs = '{"model_path": "a", "alias": "a", "source": "gguf", "max_seqs": 1, "files": '
    with pytest.raises(EngineStartError, match="files must be"):
        MistralRsParams.from_json(rs + '"a.gguf"}')
    with pytest.raises(EngineStartError, match="files must be"):
        MistralRsParams.from_json(rs + "[1]}")


def test_a_worker_given_bad_params_exits_saying_so() -> None:
    run = [sys.executable, "-m", "app.lanes.workers.whisper", "--ppid", str(os.getpid())]
    out = subprocess.run(
        [*run, "--params", '{"model_path": "m", "alias": "m", "threads": "many"}'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode != 0
    assert "threads must be int, not str" in out.stderr and "restart Switchyard" in out.stderr


def test_the_worker_command_line_is_read_in_one_place() -> None:
    assert worker_command_line("app.lanes.x_worker", ["--ppid", "42", "--params", "{}"]) == (42, "{}")
    with pytest.raises(SystemExit):
        worker_command_line("app.lanes.x_worker", ["--ppid", "42"])  # argparse: --params is required
