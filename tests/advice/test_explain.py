"""`switchyard explain`, `doctor` and `pin` as a user runs them, and the explain/hardware admin routes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, link_models
from tests.support.modelgen import write_diffusers


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SWITCHYARD_HOME": str(home),
        "HOME": str(home),
        "SWITCHYARD_NO_STARTER": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def home(tmp_path: Path, model_store: Path, large_model: Path) -> Path:
    h = tmp_path / "h"
    models = link_models(h / "models", model_store / "tiny.gguf", model_store / "embed.gguf", large_model)
    (models / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 16)
    return h


def test_explain_json_has_decision_and_fit(home: Path) -> None:
    out = cli(home, "explain", "tiny", "--json", "--local")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    d = doc["decision"]
    assert d["lane"] == "llama.cpp" and d["format"] == "gguf" and d["reasons"]
    assert {r["lane"] for r in d["rejections"]} == {
        "mistral.rs",
        "mlx",
        "vllm",
        "sglang",
        "sd.cpp",
        "whisper.cpp",
        "piper",
    }
    fit = doc["fit"]
    assert fit["verdict"] == "cpu" and fit["fits"]
    cpu = fit["chosen"]["devices"][0]
    assert cpu["device"] == "CPU" and cpu["weights"] > 0 and cpu["kv_cache"] == 2 << 20  # 8192 cells of tiny
    # bandwidth was measured and cached for the estimate; nothing measured yet, so a range
    assert fit["chosen"]["raw_tokens_per_s"] > 0 and fit["chosen"]["tokens_per_s"] is None
    lo, hi = doc["tokens_per_s_range"]
    assert 0 < lo < hi and doc["calibrated"] is False and doc["measured_tokens_per_s"] is None
    assert (home / "hardware.json").exists()
    assert doc["requested"] == {"ctx_size": 8192, "ctx_auto": True, "parallel": 4, "kv_type": "f16"}


def test_explain_text(home: Path) -> None:
    out = cli(home, "explain", "large", "--local", "--parallel", "1")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lane:   llama.cpp" in text and "turned down:" in text
    assert "placements:" in text and "largest context" in text and "tok/s" in text
    assert "weights" in text and "KV cache" in text


def test_explain_a_model_that_does_not_fit(home: Path) -> None:
    out = cli(home, "explain", "large", "--json", "--local", "--ctx-size", str(8 << 20), "--parallel", "1")
    doc = json.loads(out.stdout)
    fit = doc["fit"]
    assert fit["verdict"] == "too_large" and not fit["fits"] and fit["chosen"] is None
    assert any("context of" in a for a in fit["advice"]) and any("q8_0" in a for a in fit["advice"])
    assert doc["decision"]["lane"] is None
    assert doc["decision"]["rejections"][0]["kind"] == "does_not_fit"


def test_explain_broken_unknown_and_other_formats(home: Path, tmp_path: Path) -> None:
    broken = json.loads(cli(home, "explain", "broken", "--json", "--local").stdout)
    assert broken["decision"]["lane"] is None and "corrupt or the file is truncated" in broken["problem"]
    missing = cli(home, "explain", "nope", "--local")
    assert missing.returncode == 2 and "tiny" in missing.stderr and "does not exist" in missing.stderr
    pipe = tmp_path / "sd-pipeline"
    write_diffusers(pipe)
    doc = json.loads(cli(home, "explain", str(pipe), "--json").stdout)
    assert doc["format"] == "diffusers" and doc["fit"] is None and "no memory model" in doc["fit_problem"]
    sd = {r["lane"]: r for r in doc["decision"]["rejections"]}["sd.cpp"]
    assert sd["kind"] == "not_installed" and "no executable sd-server was found" in sd["message"]


def test_doctor(home: Path) -> None:
    out = cli(home, "doctor", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    lanes = {ln["lane"]: ln for ln in r["lanes"]}
    assert lanes["llama.cpp"]["installed"] and "xllamacpp" in lanes["llama.cpp"]["version"]
    assert r["hardware"]["cpu"]["usable_cores"] >= 1 and r["hardware"]["memory"]["total"] > 0
    assert r["models"] == {"dirs": [str(home / "models")], "servable": 3, "broken": 1, "no_lane_yet": 0}
    assert any("broken.gguf" in p["message"] and p["level"] == "warning" for p in r["problems"])
    text = cli(home, "doctor").stdout
    assert "lanes:" in text and "llama.cpp    installed" in text and "usable cores" in text


def test_pin_accepts_refuses_and_clears(home: Path) -> None:
    refused = cli(home, "pin", "tiny", "whisper.cpp")
    assert refused.returncode == 2 and "cannot pin tiny to whisper.cpp" in refused.stderr
    assert not (home / "pins.json").exists()
    wrong = cli(home, "pin", "tiny", "vllm")
    assert wrong.returncode == 2 and "vllm" in wrong.stderr.lower()
    ok = cli(home, "pin", "tiny", "llama.cpp")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((home / "pins.json").read_text()) == {"tiny": "llama.cpp"}
    assert "pinned to llama.cpp" in cli(home, "pin", "tiny").stdout
    doc = json.loads(cli(home, "explain", "tiny", "--json", "--local").stdout)
    assert doc["decision"]["pinned"] is True
    assert cli(home, "pin", "tiny", "--clear").returncode == 0
    assert json.loads((home / "pins.json").read_text()) == {}
    (home / "pins.json").write_text("{broken")
    bad = cli(home, "explain", "tiny", "--local")
    assert bad.returncode == 2 and "pins.json is not valid JSON" in bad.stderr


def get(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def test_explain_over_http_shows_predicted_and_measured(start_server: Any, home: Path) -> None:
    import urllib.request

    s = start_server(home / "models")
    urllib.request.urlopen(
        urllib.request.Request(
            s.url + "/api/models/tiny/load",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        ),
        timeout=60,
    ).read()
    doc = get(s.url + "/api/models/tiny/explain")
    loaded = doc["loaded"]
    assert loaded["state"] == "ready"
    pred = {d["device"]: d for d in loaded["predicted"]["devices"]}["CPU"]
    meas = loaded["measured"]["devices"]["CPU"]
    assert pred["kv_cache"] == meas["kv_cache"] and pred["weights"] > 0 and meas["weights"] > 0
    hw = get(s.url + "/api/hardware")
    assert hw["cpu"]["usable_cores"] >= 1 and hw["bandwidth"]["all_cores"] > 0
    # the CLI asks the running server, so it can show what is loaded
    text = cli(s.home, "explain", "tiny").stdout
    assert "predicted / measured" in text and "engine process RSS" in text


def test_last_measured_survives_the_server(start_server: Any, home: Path) -> None:
    import urllib.request

    s = start_server(home / "models")
    req = urllib.request.Request(
        s.url + "/api/models/tiny/load",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=60).read()
    s.stop()
    where = ("--models-dir", str(s.models_dir))
    doc = json.loads(cli(s.home, "explain", "tiny", "--json", "--local", *where).stdout)
    last = doc["last_measured"]
    assert last["measured"]["devices"]["CPU"]["kv_cache"] == last["predicted"]["devices"][0]["kv_cache"]
    assert "last load" in cli(s.home, "explain", "tiny", "--local", *where).stdout
    # a replaced file does not inherit the old figures
    model = s.models_dir / "tiny.gguf"
    data = model.read_bytes()
    model.unlink()  # a new file (the old one is a hard link to the session's shared model)
    model.write_bytes(data + b"\0" * 64)
    after = json.loads(cli(s.home, "explain", "tiny", "--json", "--local", *where).stdout)
    assert after["last_measured"] is None


def test_event_stream_carries_hardware_samples_and_lane_states(start_server: Any, home: Path) -> None:
    import threading
    import urllib.request

    s = start_server(home / "models")
    seen: list[str] = []

    def read() -> None:
        with urllib.request.urlopen(s.url + "/api/events", timeout=30) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("event: "):
                    seen.append(line.removeprefix("event: "))
                if "lane.ready" in seen and seen.count("hardware.sample") >= 2:
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    urllib.request.urlopen(
        urllib.request.Request(
            s.url + "/api/models/tiny/load",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        ),
        timeout=60,
    ).read()
    t.join(15)
    assert seen[0] == "snapshot"
    assert "lane.state" in seen and "lane.ready" in seen and seen.count("hardware.sample") >= 2


def test_explain_safetensors_on_an_nvidia_card_shows_engine_shares(tmp_path: Path) -> None:
    from app.advice.explain import entry_for_path, explain, render
    from app.advice.inputs import AdviceInputs
    from app.core.settings import Settings
    from tests.fit.test_fit import machine, nvidia
    from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir

    dims = LlamaDims(n_layer=4, hidden=256, heads=8, kv_heads=2, ff=512, vocab=1000)
    folder = tmp_path / "tiny-hf"
    write_hf_dir(folder, dims.config(max_position_embeddings=4096), llama_tensors(dims))
    hw = machine(ram_gib=64, gpus=(nvidia(24564),))
    doc = explain(entry_for_path(folder), inputs=AdviceInputs(Settings(), hw, pins={})).public()
    assert doc["format"] == "safetensors" and doc["fit"] is None
    shares = doc["gpu_shares"]
    assert set(shares) == {"vllm", "sglang"} and all(s["fits"] for s in shares.values())
    assert "--gpu-memory-utilization" in shares["vllm"]["share"]["argv"]
    assert "--mem-fraction-static" in shares["sglang"]["share"]["argv"]
    # vLLM is the first choice there, but not installed: the rejection says so and the share is shown
    vllm = {r["lane"]: r for r in doc["decision"]["rejections"]}["vllm"]
    assert vllm["kind"] == "not_installed"
    assert "memory on vllm: asks for" in render(doc)
    bare = AdviceInputs(Settings(), machine(ram_gib=64), pins={})
    cpu_only = explain(entry_for_path(folder), inputs=bare).public()
    assert cpu_only["gpu_shares"] is None and "NVIDIA GPU" in cpu_only["fit_problem"]


def test_explain_flags_beat_model_overrides_and_runtime_setting_counts(home: Path) -> None:
    (home / "settings.json").write_text(json.dumps({"model_overrides": {"tiny": {"ctx_size": 1024}}}))
    doc = json.loads(cli(home, "explain", "tiny", "--json", "--local", "--ctx-size", "2048").stdout)
    assert doc["requested"]["ctx_size"] == 2048 and doc["fit"]["chosen"]["ctx_size"] == 2048
    (home / "settings.json").write_text(json.dumps({"runtime": "llama-server"}))
    doc = json.loads(cli(home, "explain", "tiny", "--json", "--local").stdout)
    llama = {r["lane"]: r for r in doc["decision"]["rejections"]}["llama.cpp"]
    # with llama.cpp out of reach, mistral.rs is the other lane that reads GGUF (where it is installed)
    other = "mistral.rs" if importlib.util.find_spec("mistralrs") else None
    assert doc["decision"]["lane"] == other and llama["kind"] == "not_installed"
    assert "no executable llama-server" in llama["message"]
    dead = cli(home, "explain", "tiny", "--url", "http://127.0.0.1:9")
    assert dead.returncode == 2 and "no Switchyard server answers" in dead.stderr


def test_pin_clear_on_a_fresh_home(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    out = cli(fresh, "pin", "tiny", "--clear")
    assert out.returncode == 0 and "was not pinned" in out.stdout


async def test_supervisor_refuses_a_model_pinned_to_a_lane_it_cannot_start(
    tmp_path: Path, model_store: Path
) -> None:
    from app.core.errors import EngineUnavailableError
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.runtime import Runtime

    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    paths = Paths.from_env()
    paths.ensure()
    paths.pins_file.write_text(json.dumps({"tiny": "vllm"}))
    async with Runtime(settings=Settings.flat(models_dirs=(models,)), paths=paths) as rt:
        with pytest.raises(EngineUnavailableError, match="pinned to vllm"):
            await rt.supervisor.ensure("tiny")
        paths.pins_file.write_text(json.dumps({"tiny": "llama.cpp"}))
        assert (await rt.supervisor.ensure("tiny")).state.value == "ready"
