"""The capability lane (issue 16): a second llama.cpp build for GGUF architectures the default one refuses.

Found by probing two real builds (app/lanes/arch_probe.py over every name in gguf_architectures.txt):
xllamacpp 2026.4.8672 refuses 31 architectures that 2026.10.11549 loads (among them `mellum`, JetBrains'
MoE) and loads none that 2026.10.11549 refuses. So the real test pins the default llama.cpp lane to the
older build (`engine install llama.cpp --version 2026.4.8672`, from PyPI) and registers the test
interpreter (2026.10.11549) as the capability build; a generated Mellum GGUF then runs on the capability
lane, a llama GGUF stays on the default one, and `explain` says why.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.core.errors import SettingsError
from app.formats.detect import detect_format
from app.hardware.model import CPUInfo, Hardware, MemoryInfo
from app.lanes import arch_probe, compat
from app.lanes.arch_probe import ArchCache, Build
from app.lanes.kind import dist_version
from app.routing import LaneInstall, decide
from tests.conftest import ServerProcess, wait_gone
from tests.tinymodels import CHATML, _vocab, write_tiny_gguf

REPO = Path(__file__).resolve().parents[1]
OLD_BUILD = "2026.4.8672"  # refuses mellum (probed); the test venv's xllamacpp loads it
HERE = Build("python", sys.executable, dist_version("xllamacpp"))
GiB = 1 << 30


def write_mellum_gguf(path: Path, *, seed: int = 7) -> Path:
    """A tiny Mellum (attention with q/k norms, a mixture of 4 experts) that llama.cpp really runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_embd, n_layer, n_head, n_kv, n_exp, n_used, n_ff_exp = 64, 2, 4, 2, 4, 2, 64
    hd = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "mellum")
    w.add_name("tiny-mellum")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp * n_used)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML)

    def t(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32) * 0.02
        w.add_tensor(name, np.ones(shape, dtype=np.float32) if name.endswith("norm.weight") else data)

    t("token_embd.weight", len(tokens), n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd)
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", hd * n_kv, n_embd)
        t(p + "attn_v.weight", hd * n_kv, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        t(p + "attn_q_norm.weight", hd)
        t(p + "attn_k_norm.weight", hd)
        t(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate_inp.weight", n_exp, n_embd)
        t(p + "ffn_gate_exps.weight", n_exp, n_ff_exp, n_embd)
        t(p + "ffn_up_exps.weight", n_exp, n_ff_exp, n_embd)
        t(p + "ffn_down_exps.weight", n_exp, n_embd, n_ff_exp)
    t("output_norm.weight", n_embd)
    t("output.weight", len(tokens), n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the probe -----------------------------------------------------------------------------------------
def test_a_probe_file_names_its_architecture_and_nothing_more(tmp_path: Path) -> None:
    path = arch_probe.write_probe(tmp_path / "p.gguf", "mellum")
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "mellum"
    assert int(reader.fields["mellum.block_count"].parts[-1][0]) == 1
    assert len(reader.tensors) == 0 and path.stat().st_size < 200


def test_a_build_says_which_architectures_it_loads() -> None:
    got = arch_probe.ask(HERE, ["llama", "mellum", "qwen3", "nosucharch", "../escape", ""])
    assert got == {"llama": True, "mellum": True, "qwen3": True, "nosucharch": False}


def test_a_python_without_xllamacpp_answers_nothing(tmp_path: Path) -> None:
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert arch_probe.ask(Build("python", str(bare / "bin" / "python")), ["llama"]) == {}


STANDIN = """#!{python}
# a stand-in llama-server (a fork's binary): it knows the architectures listed here and nothing else,
# and exits as llama-server does when the model does not load
import sys
import gguf
if "--version" in sys.argv:
    print("version: 9999 (forked)"); sys.exit(0)
path = sys.argv[sys.argv.index("-m") + 1]
field = gguf.GGUFReader(path).fields["general.architecture"]
arch = bytes(field.parts[field.data[0]]).decode()
if arch not in {known!r}:
    print(f"llama_model_load: error loading model: unknown model architecture: '{{arch}}'", file=sys.stderr)
else:
    print(f"llama_model_load: error loading model: key not found in model: {{arch}}.context_length",
          file=sys.stderr)
sys.exit(1)
"""


def standin_server(tmp_path: Path, known: set[str]) -> Path:
    exe = tmp_path / "fork" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(STANDIN.format(python=sys.executable, known=known))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_a_llama_server_binary_is_asked_one_file_at_a_time(tmp_path: Path) -> None:
    exe = standin_server(tmp_path, {"llama", "talkie"})
    got = arch_probe.ask(Build("llama-server", str(exe)), ["llama", "talkie", "mellum"])
    assert got == {"llama": True, "talkie": True, "mellum": False}


def test_answers_are_kept_per_build_and_asked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ArchCache(tmp_path / "archs.json")
    first = store.ensure(HERE, ["llama", "nosucharch"])
    assert first == {"llama": True, "nosucharch": False}
    kept = json.loads((tmp_path / "archs.json").read_text())["builds"][HERE.identity()]
    assert kept["loads"] == ["llama"] and kept["refuses"] == ["nosucharch"]

    asked: list[list[str]] = []
    real = arch_probe.ask
    monkeypatch.setattr(arch_probe, "ask", lambda b, names: asked.append(list(names)) or real(b, names))
    assert store.ensure(HERE, ["llama", "nosucharch"]) == first and asked == []  # from the file
    assert store.ensure(HERE, ["llama", "mellum"])["mellum"] is True and asked == [["mellum"]]
    other = Build("python", sys.executable, "0.0-other")  # another version: asked afresh
    store.ensure(other, ["llama"])
    assert asked[-1] == ["llama"]

    (tmp_path / "archs.json").write_text("{not json")  # damaged: asked again and rewritten
    assert store.ensure(HERE, ["llama"]) == {"llama": True}
    assert json.loads((tmp_path / "archs.json").read_text())["builds"][HERE.identity()]["loads"] == ["llama"]


# ---- registration --------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("SWITCHYARD_HOME", str(h))
    return h


def test_registration_checks_what_it_is_given(home: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="give one of --python"):
        compat.register()
    with pytest.raises(SettingsError, match="give one of --python"):
        compat.register(python=sys.executable, llama_server="/bin/true")
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(SettingsError, match="cannot import xllamacpp"):
        compat.register(python=str(bare / "bin" / "python"))
    (tmp_path / "plain").write_text("x")
    with pytest.raises(SettingsError, match="not an executable file"):
        compat.register(llama_server=str(tmp_path / "plain"))
    assert compat.registered() is None

    fork = compat.register(llama_server=str(standin_server(tmp_path, {"llama"})))
    assert fork.kind == "llama-server" and fork.version == "version: 9999 (forked)"
    assert compat.registered() == fork
    assert compat.unregister() is True and compat.registered() is None
    assert compat.unregister() is False


# ---- routing -------------------------------------------------------------------------------------------
CPU_BOX = Hardware(
    os="linux",
    arch="x86_64",
    cpu=CPUInfo("test cpu", 8, 16, 16, None, ("avx2", "fma")),
    memory=MemoryInfo(total=64 * GiB, available=48 * GiB, swap_total=0, swap_free=0, cgroup_limit=None),
    gpus=(),
    engine_devices=(),
    bandwidth=None,
)


def _installed(*, compat_on: bool) -> dict[str, LaneInstall]:
    out = {
        "llama.cpp": LaneInstall(
            "llama.cpp", True, "xllamacpp 2026.4.8672", rejected_architectures=frozenset({"mellum"})
        ),
        "mistral.rs": LaneInstall("mistral.rs", False, None, note="not installed"),
    }
    if compat_on:
        out["llama.cpp-compat"] = LaneInstall("llama.cpp-compat", True, "xllamacpp 2026.10.11549")
    return out


def test_decide_sends_a_refused_architecture_to_the_capability_build(tmp_path: Path) -> None:
    mellum = detect_format(write_mellum_gguf(tmp_path / "m.gguf"))
    llama = detect_format(write_tiny_gguf(tmp_path / "l.gguf"))

    d = decide(mellum, hardware=CPU_BOX, installed=_installed(compat_on=True), model_id="m")
    assert d.lane == "llama.cpp-compat"
    first = {r.lane: r for r in d.rejections}["llama.cpp"]
    assert first.kind == "architecture" and "does not load the mellum architecture" in first.message
    assert any("second llama.cpp build loads architectures" in r for r in d.reasons)

    d = decide(llama, hardware=CPU_BOX, installed=_installed(compat_on=True), model_id="l")
    assert d.lane == "llama.cpp"
    assert {r.lane: r.kind for r in d.rejections}["llama.cpp-compat"] == "lower_preference"

    # without a second build nothing is different from before: the lane is not even listed
    d = decide(llama, hardware=CPU_BOX, installed=_installed(compat_on=False), model_id="l")
    assert d.lane == "llama.cpp" and "llama.cpp-compat" not in {r.lane for r in d.rejections}
    d = decide(mellum, hardware=CPU_BOX, installed=_installed(compat_on=False), model_id="m")
    assert d.lane is None
    assert {r.lane: r.kind for r in d.rejections}["llama.cpp"] == "architecture"


# ---- the real thing: two builds, one server ------------------------------------------------------------
def _cli(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SWITCHYARD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_newer_architecture_runs_on_the_capability_build(tmp_path: Path) -> None:
    home = tmp_path / "home"
    models = tmp_path / "models"
    write_mellum_gguf(models / "tiny-mellum.gguf")
    write_tiny_gguf(models / "tiny-llama.gguf")

    old = _cli(home, "engine", "install", "llama.cpp", "--version", OLD_BUILD)
    assert old.returncode == 0, old.stderr + old.stdout
    reg = _cli(home, "engine", "register", "llama.cpp-compat", "--python", sys.executable)
    assert reg.returncode == 0, reg.stderr + reg.stdout
    assert "mellum" in reg.stdout  # named among the architectures only the capability build loads

    why = _cli(home, "explain", "tiny-mellum", "--json", "--models-dir", str(models))
    assert why.returncode == 0, why.stderr
    decision = json.loads(why.stdout)["decision"]
    assert decision["lane"] == "llama.cpp-compat"
    turned_down = {r["lane"]: r for r in decision["rejections"]}["llama.cpp"]
    assert turned_down["kind"] == "architecture" and OLD_BUILD in turned_down["message"]

    server = ServerProcess(home, models).wait_ready()
    try:
        for model in ("tiny-mellum", "tiny-llama"):
            status, body = _post(
                server.url + "/v1/completions", {"model": model, "prompt": "the", "max_tokens": 4}
            )
            assert status == 200, body
            assert body["usage"]["completion_tokens"] == 4
            with urllib.request.urlopen(f"{server.url}/api/lanes/{model}", timeout=30) as r:
                lane = json.loads(r.read())
            want = "llama.cpp-compat" if model == "tiny-mellum" else "llama.cpp"
            assert lane["engine"] == want, lane
        log = "\n".join(server.stderr)
        assert "lane tiny-mellum (llama.cpp-compat): ready" in log
    finally:
        pids = server.engine_pids()
        server.stop()
        wait_gone(pids, 5)
