"""The stable-diffusion.cpp lane: `sd-server` behind `POST /v1/images/generations`.

No wheel ships stable-diffusion.cpp, so the lane runs a binary: `sd_server_path` when set (that one alone),
else the release pinned in engines.toml once `switchyard serve --pull-only` has put it in the engines folder
(runtime `bin`), else `sd-server` on PATH (`path`), in the order the runtime setting gives those two
(install/runtimes.py). Only `sd-server` speaks HTTP; the `sd` command-line tool is recognised so the note
can say what is missing. sd-server loads the model before it listens, so readiness is its
`GET /v1/models` answering. Its images API is OpenAI's shape with the sampling extras (steps, cfg, seed)
embedded in the prompt; app/server/surfaces/openai/images_engine.py does that translation in the gateway.

Memory is "runtime-managed": sd.cpp sizes its compute buffers per image size at generation time, so no
plan is made; the lane shows what the process holds once loaded.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import EngineUnavailableError, ModelBrokenError
from app.core.frozen import module_argv
from app.core.settings import Settings
from app.hardware.build_choice import ONE_BUILD
from app.hardware.cpu import usable_cores
from app.hardware.model import Hardware
from app.lanes.engines.kind import find_binary
from app.lanes.engines.plan import ApiStyle, DraftKind, LaunchPlan, StartContext
from app.lanes.install.releases import Installed, ReleaseFetcher
from app.lanes.install.runtimes import SD_SERVER, fetcher_for, find_sd_release, machine_now, sd_order
from app.lanes.proc import settings_env
from app.lanes.residency import Footprint
from app.library.model import ModelEntry
from app.routing.model import LaneInstall

BINARY = SD_SERVER
CLI_BINARY = "sd"
HEALTH_PATH = "/v1/models"
INSTALL_HINT = (
    "run `switchyard serve --pull-only` to download the pinned stable-diffusion.cpp release, or build it "
    "(github.com/leejet/stable-diffusion.cpp: cmake builds sd-server beside sd) and put sd-server on PATH, "
    "or set sd_server_path"
)
# Companion files a diffusion-model-only GGUF needs, found beside it by name: (flag, words in the name).
# The first flag whose words match a file claims it; a file with none of them is not a companion.
COMPANIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--vae", ("vae",)),
    ("--clip_l", ("clip_l", "clip-l")),
    ("--clip_g", ("clip_g", "clip-g")),
    ("--t5xxl", ("t5xxl", "t5-xxl", "umt5")),
    ("--llm", ("llm", "qwen", "text_encoder")),
)
_WEIGHTS = (".gguf", ".safetensors", ".sft")
VAE_PREFIX = "first_stage_model."  # a full checkpoint (sd.cpp's own conversions) carries its VAE


@dataclass(frozen=True)
class SDParams:
    model_path: str
    model_flag: str  # "--model" (a whole pipeline or checkpoint) or "--diffusion-model" (the DiT/UNet alone)
    companions: tuple[tuple[str, str], ...]  # (flag, path): VAE and text encoders beside a lone model
    threads: int
    extra_args: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def _version(path: str, stamp: tuple[int, int]) -> str | None:
    """The version line `sd-server --version` prints (cached per binary file and its mtime/size)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (out.stdout + "\n" + out.stderr).splitlines():
        if "version" in line.lower():
            return line.strip()[:200]
    return None  # an older build without --version prints its usage instead


def binary_version(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _version(path, (st.st_mtime_ns, st.st_size))


@dataclass(frozen=True)
class SDServer:
    """Where sd-server was found: `runtime` is "configured" (sd_server_path), "bin" (the pinned release)
    or "path"; `binary` None when nowhere, with the reason for every place passed over in `skipped`."""

    binary: str | None
    runtime: str | None
    skipped: tuple[tuple[str, str], ...] = ()  # (runtime, why)
    release: Installed | None = None

    def missing(self) -> str:
        """Why no sd-server was found, PATH first (the place most people look)."""
        why = dict(self.skipped)
        return "; ".join(why[rt] for rt in ("path", "bin") if rt in why)


def locate_sd_server(
    settings: Settings,
    hardware: Hardware | None = None,
    *,
    fetcher: ReleaseFetcher | None = None,
    env: Mapping[str, str] | None = None,
) -> SDServer:
    """sd_server_path when set (that one alone: a path the user chose is not silently replaced), else the
    release and PATH in `sd_order`. Never downloads."""
    if settings.sdcpp.sd_server_path:
        return SDServer(find_binary(BINARY, settings.sdcpp.sd_server_path), "configured")
    skipped: list[tuple[str, str]] = []
    for rt in sd_order(settings, env):
        if rt == "bin":
            hit, why = find_sd_release(machine_now(hardware), fetcher=fetcher or fetcher_for(settings))
            if hit is not None:
                return SDServer(str(hit.binary), rt, tuple(skipped), hit)
        else:
            exe = find_binary(BINARY, None)
            if exe is not None:
                return SDServer(exe, rt, tuple(skipped))
            why = "no executable sd-server was found on PATH"
        skipped.append((rt, str(why)))
    return SDServer(None, None, tuple(skipped))


def sd_install(settings: Settings, hardware: Hardware | None = None) -> LaneInstall:
    found = locate_sd_server(settings, hardware)
    exe = found.binary
    if exe is None:
        if settings.sdcpp.sd_server_path:
            missing = f"no executable sd-server was found at {settings.sdcpp.sd_server_path}"
        else:
            missing = found.missing()
        cli = find_binary(CLI_BINARY, None) if not settings.sdcpp.sd_server_path else None
        if cli is not None:
            note = (
                f"found sd (the command-line tool) at {cli}, but the lane needs sd-server, the HTTP server "
                f"built with it ({missing}): {INSTALL_HINT}"
            )
        else:
            note = f"{missing}: {INSTALL_HINT}"
            if "--pull-only" in missing:  # the release step said it already: the hint's alternative only
                note = f"{missing}; or {INSTALL_HINT.split(', or ', 1)[1]}"
        return LaneInstall("sd.cpp", False, None, note=note)
    version = binary_version(exe)
    where = f"{version or 'sd-server (version unknown)'} at {exe}"
    if found.release is not None:
        rel = found.release
        return LaneInstall("sd.cpp", True, where, note=f"runtime bin: release {rel.tag}, asset {rel.asset}")
    return LaneInstall("sd.cpp", True, where)


def _has_vae(path: Path) -> bool:
    import gguf  # imported here: only a diffusion GGUF needs its tensor table read

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception:  # a corrupt file: the engine will say so in its log
        return True
    return any(t.name.startswith(VAE_PREFIX) for t in reader.tensors)


def companions_beside(model: Path) -> tuple[tuple[str, str], ...]:
    """The VAE and text encoders next to a diffusion-model GGUF, by the words in their file names."""
    found: dict[str, str] = {}
    for p in sorted(model.parent.iterdir()):
        low = p.name.lower()
        if p == model or not p.is_file() or not low.endswith(_WEIGHTS):
            continue
        for flag, words in COMPANIONS:
            named = any(w in low for w in words) or (flag == "--vae" and low.startswith("ae."))  # FLUX's ae
            if flag not in found and named:
                found[flag] = str(p)
                break
    return tuple((flag, found[flag]) for flag, _ in COMPANIONS if flag in found)


def model_args(entry: ModelEntry) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(model flag, companions) for this model; raises ModelBrokenError for a lone diffusion model
    without a VAE beside it (sd.cpp could not decode its images)."""
    if entry.format == "diffusers" or entry.path.is_dir():
        return "--model", ()  # sd.cpp reads a diffusers folder itself
    if _has_vae(entry.path):
        return "--model", ()
    found = companions_beside(entry.path)
    if not any(flag == "--vae" for flag, _ in found):
        raise ModelBrokenError(
            f"{entry.id!r} is a diffusion model without its VAE and text encoders; put them beside "
            f"{entry.path.name} with 'vae', 'clip_l', 'clip_g', 't5xxl' or 'llm' in their file names "
            "(see docs/engines.md#the-sdcpp-lane), or use a diffusers folder or a full checkpoint",
            param="model",
        )
    return "--diffusion-model", found


def sd_argv(exe: str, params: SDParams, *, port: int, ppid: int) -> tuple[str, ...]:
    args = [*module_argv("app.lanes.guard"), str(ppid), "--", exe, params.model_flag, params.model_path]
    for flag, path in params.companions:
        args += [flag, path]
    args += ["--listen-ip", "127.0.0.1", "--listen-port", str(port), "--threads", str(params.threads)]
    return (*args, *params.extra_args)


class SDCppKind:
    lane = "sd.cpp"
    formats = frozenset({"diffusers", "gguf-diffusion"})
    offers = frozenset({"images"})
    memory = "runtime-managed"
    api_style = ApiStyle.OPENAI  # its images route; the gateway embeds the sampling extras in the prompt
    setting_keys: tuple[str, ...] = ("sd_extra_args", "sd_server_path")
    draft = DraftKind.NONE
    build_rule = ONE_BUILD  # the pinned release's binary
    install_estimate_s = 120  # the pinned release (`switchyard serve --pull-only`)

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        return None  # sd.cpp sizes its compute buffers per image: only the measured footprint is real

    def window(self, plan: LaunchPlan | None, entry: Callable[[], ModelEntry | None]) -> int | None:
        return None  # an image model has no context window

    def install(self, settings: Settings) -> LaneInstall:
        return sd_install(settings)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = sd_install(settings, hardware)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        return frozenset({"images"})

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        hardware, free_port, ppid = start.hardware, start.port, start.ppid
        found = locate_sd_server(settings, hardware)
        exe = found.binary
        if exe is None:
            raise EngineUnavailableError(
                f"cannot start {entry.id!r} on stable-diffusion.cpp: {sd_install(settings, hardware).note}"
            )
        flag, companions = model_args(entry)
        params = SDParams(
            model_path=str(entry.path),
            model_flag=flag,
            companions=companions,
            threads=settings.models.threads or usable_cores(),
            extra_args=tuple(shlex.split(settings.sdcpp.sd_extra_args)),
        )
        argv = sd_argv(exe, params, port=free_port, ppid=ppid)
        env = settings_env(settings, kind=self.lane)
        notes = tuple(f"runtime {rt} skipped: {why}" for rt, why in found.skipped)
        if found.release is not None:  # the release's shared libraries sit beside the binary
            var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
            libdir = str(Path(exe).parent)
            env[var] = f"{libdir}{os.pathsep}{env[var]}" if env.get(var) else libdir
            notes += (f"sd-server from stable-diffusion.cpp {found.release.tag} ({found.release.asset})",)
        return LaunchPlan(
            runtime="bin" if found.runtime == "bin" else "sd-server",
            argv=argv,
            env=env,
            health_path=HEALTH_PATH,
            port=free_port,
            params=params,
            engine=self.lane,
            api=self.api_style,
            memory=self.memory,
            notes=notes,
        )
