"""How a llama.cpp lane's parameters and command lines are derived (both runtimes)."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.cpu import _cgroup_quota_cores, usable_cores
from app.lanes.engines.llamacpp.kind import (
    LlamaParams,
    build_plan,
    choose_runtime,
    llama_server_argv,
    plan_params,
    worker_argv,
)
from app.lanes.engines.plan import StartContext
from app.library.catalog import Catalog


@pytest.fixture
def catalog(tmp_path: Path, model_store: Path) -> Catalog:
    d = tmp_path / "m"
    d.mkdir()
    for name in ("tiny.gguf", "embed.gguf"):
        (d / name).write_bytes((model_store / name).read_bytes())
    c = Catalog([d])
    c.scan()
    return c


def test_automatic_context_is_per_slot_times_slots(catalog: Catalog) -> None:
    p = plan_params(catalog.get("tiny"), Settings.flat(parallel=3))
    assert p.parallel == 3 and p.ctx_size == 2048 * 3  # trained window 2048 < cap 4096
    assert p.alias == "tiny" and not p.embedding and p.pooling is None
    assert 1 <= p.threads <= (os.cpu_count() or 1)


def test_explicit_settings_and_overrides(catalog: Catalog) -> None:
    s = Settings.flat(
        ctx_size=1000,
        kv_type="q8_0",
        flash_attn="on",
        threads=1,
        gpu_layers=10,
        model_overrides={"tiny": {"ctx_size": 512, "parallel": 2}},
    )
    p = plan_params(catalog.get("tiny"), s)
    assert (p.ctx_size, p.parallel, p.kv_type, p.flash_attn, p.threads, p.gpu_layers) == (
        512,
        2,
        "q8_0",
        "on",
        1,
        10,
    )


def test_embedding_models_run_in_embedding_mode(catalog: Catalog) -> None:
    p = plan_params(catalog.get("embed"), Settings())
    assert p.embedding and p.pooling == "mean"


def test_worker_argv_round_trips_params(catalog: Catalog) -> None:
    p = plan_params(catalog.get("tiny"), Settings())
    argv = worker_argv(p, ppid=123)
    assert argv[:3] == (sys.executable, "-m", "app.lanes.workers.llamacpp")
    assert argv[argv.index("--ppid") + 1] == "123"
    assert LlamaParams.from_json(argv[argv.index("--params") + 1]) == p
    assert "shell" not in " ".join(argv)


def test_llama_server_argv(catalog: Catalog) -> None:
    p = plan_params(catalog.get("embed"), Settings.flat(gpu_layers=99, kv_type="q4_0"))
    argv = llama_server_argv("/opt/llama/llama-server", p, port=5555, ppid=42)
    assert argv[:6] == (sys.executable, "-m", "app.lanes.guard", "42", "--", "/opt/llama/llama-server")
    flags = dict(itertools.pairwise(argv[6:]))
    assert flags["--model"] == p.model_path and flags["--alias"] == "embed"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "5555"
    assert flags["--ctx-size"] == str(p.ctx_size) and flags["--parallel"] == str(p.parallel)
    assert flags["--cache-type-k"] == "q4_0" and flags["--cache-type-v"] == "q4_0"
    assert flags["--n-gpu-layers"] == "99"
    assert "--embedding" in argv and flags["--pooling"] == "mean"


def test_runtime_choice_names_what_to_install(tmp_path: Path, catalog: Catalog) -> None:
    assert choose_runtime(Settings()) == "xllamacpp"
    with pytest.raises(EngineUnavailableError, match="no executable llama-server"):
        choose_runtime(Settings.flat(runtime="llama-server", llama_server_path=str(tmp_path / "nope")))
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    s = Settings.flat(runtime="llama-server", llama_server_path=str(fake))
    assert choose_runtime(s) == "llama-server"
    plan = build_plan(catalog.get("tiny"), s, StartContext(ppid=1, port=4321, hardware=None))
    assert plan.runtime == "llama-server" and plan.port == 4321 and str(fake) in plan.argv


def test_engines_do_not_inherit_secrets(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_Zq8Xsecret")
    monkeypatch.setenv("SWITCHYARD_API_KEY", "sy-Zq8Xsecret")
    monkeypatch.setenv("GITHUB_TOKEN", "gh-Zq8Xsecret")
    monkeypatch.setenv("HTTPS_PROXY", "http://u:pw@proxy:3128")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    plan = build_plan(catalog.get("tiny"), Settings(), StartContext(ppid=1, port=4321, hardware=None))
    assert not {"HF_TOKEN", "SWITCHYARD_API_KEY", "GITHUB_TOKEN", "HTTPS_PROXY"} & set(plan.env)
    assert plan.env["LC_ALL"] == "C.UTF-8" and "PATH" in plan.env
    assert all("Zq8X" not in v and "pw@" not in v for v in plan.env.values())


def test_usable_cores_respects_affinity() -> None:
    n = usable_cores()
    if hasattr(os, "sched_getaffinity"):
        assert n <= len(os.sched_getaffinity(0))
    assert n >= 1


def test_cgroup_quota_parsing(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota_cores(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota_cores(tmp_path) is None
    assert _cgroup_quota_cores(tmp_path / "absent") is None
