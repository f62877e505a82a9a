"""Which runtime a lane starts on, tried in order, with the reason for every runtime passed over.

llama.cpp: `runtime = "auto"` tries `runtime_order` (docker, podman, bin, path, xllamacpp by default) and
takes the first that can run here; any other value tries that one alone. `SWITCHYARD_RUNTIME` overrides
the setting. Every step passed over keeps its reason (no docker daemon, no GPU runtime, no asset for this
platform, not downloaded, offline), so doctor and `engine ls` say why, and the lane start logs it.

sd-server (stable-diffusion.cpp): after a configured `sd_server_path`, `bin` (the pinned release) and
`path`, in the order the setting gives them. vLLM and SGLang: their Python package, else (auto) the
upstream image through docker or podman; `runtime = "docker"` or `"podman"` runs the image even where the
package is installed.

Nothing here downloads or pulls at a start: `bin` counts only once its release is in the engines folder
(`pull_only`, run by `switchyard serve --pull-only`), so a request never waits on an engine download.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import RUNTIME_ORDER, RUNTIMES, Settings
from app.formats.detect import ModelKind
from app.hardware.build_choice import Backend, backend_for
from app.hardware.model import Hardware
from app.hardware.probe import probe
from app.lanes.engines.llamacpp.kind import find_llama_server, xllamacpp_available
from app.lanes.install.containers import load_images
from app.lanes.install.releases import Installed, ReleaseFetcher, ReleaseSpec, load_releases, platform_key
from app.library.opening import opened_catalog
from app.routing.engines import title
from app.routing.model import LaneInstall

ENV_VAR = "SWITCHYARD_RUNTIME"
CONTAINER_CLIS = ("docker", "podman")
LLAMA_SERVER = "llama-server"
SD_SERVER = "sd-server"
SD_FORMATS = frozenset({ModelKind.GGUF_DIFFUSION, ModelKind.DIFFUSERS})  # what sd-server reads
SD_RUNTIMES = ("bin", "path")  # sd.cpp has no wheel and no image of its own
PACKAGE = "package"  # vLLM's and SGLang's Python package, in its engine environment or this one
Which = Callable[[str], str | None]


@dataclass(frozen=True)
class Step:
    """One runtime considered: chosen when `skipped` is None, else the reason it was passed over."""

    runtime: str
    skipped: str | None

    def public(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "skipped": self.skipped}


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime chosen (None: none can run), the build it runs, and every step in the order tried."""

    runtime: str | None
    build: str | None  # cpu, cuda12, cuda13, rocm, vulkan, metal; None where unknown (a binary on PATH)
    why: str
    steps: tuple[Step, ...]
    binary: str | None = None  # bin, path
    image: str | None = None  # docker, podman (a repository without a tag until the build is known)
    engine: str = "llama.cpp"  # how refusals name the engine

    def refusal(self) -> str:
        tried = "; ".join(f"{s.runtime}: {s.skipped}" for s in self.steps if s.skipped)
        return f"no {self.engine} runtime can start here ({tried})"

    def public(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "build": self.build,
            "why": self.why,
            "binary": self.binary,
            "image": self.image,
            "steps": [s.public() for s in self.steps],
        }


def runtime_setting(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The runtime asked for: SWITCHYARD_RUNTIME when set, else the setting."""
    value = (env if env is not None else os.environ).get(ENV_VAR, "").strip()
    if not value:
        return settings.llamacpp.runtime
    if value not in RUNTIMES:
        raise SettingsError(f"{ENV_VAR}={value!r} is not a runtime; use one of {', '.join(RUNTIMES)}")
    return value


def runtime_order(settings: Settings, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The runtimes to try, in order; `llama-server` is the older name of `path`."""
    wanted = runtime_setting(settings, env)
    if wanted == "auto":
        return tuple(
            r.strip() for r in settings.llamacpp.runtime_order.split(",") if r.strip() in RUNTIME_ORDER
        )
    return ("path",) if wanted == "llama-server" else (wanted,)


def llama_release() -> ReleaseSpec:
    return load_releases()[LLAMA_SERVER]


def fetcher_for(settings: Settings) -> ReleaseFetcher:
    return ReleaseFetcher(Paths.from_env().home / "engines", offline=settings.hub.offline)


def _tag(settings: Settings) -> str | None:
    return settings.llamacpp.llama_cpp_version or None


def machine_now(hardware: Hardware | None) -> Hardware:
    """The snapshot given, else a light probe of the GPUs (no llama.cpp, no bandwidth: milliseconds), so
    a listing without a snapshot names the same build a start would."""
    return hardware if hardware is not None else probe(engine=False)


def _container_gpu_problem(cli: str, build: str, info: str) -> str | None:
    """Why this container engine cannot reach the GPU for `build`, or None."""
    if build.startswith("cuda"):
        cdi = any(Path(p).exists() for p in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"))
        if "nvidia" not in info and not cdi:
            return (
                f"no GPU runtime: {cli} has no NVIDIA runtime or CDI spec (install nvidia-container-toolkit)"
            )
    if build == "rocm" and not Path("/dev/kfd").exists():
        return "no GPU runtime: /dev/kfd is missing (install the ROCm kernel driver)"
    if build == "vulkan" and not Path("/dev/dri").exists():
        return "no GPU runtime: /dev/dri is missing"
    return None


def container_info(cli: str, binary: str) -> str | None:
    """`CLI info` as text when the daemon answers (the runtimes it lists included), else None."""
    try:
        done = subprocess.run(
            [binary, "info", "--format", "{{json .}}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _try_container(
    cli: str, backend: Backend, *, auto: bool, which: Which, tag: str | None
) -> tuple[str | None, str | None]:
    """(image, None) when `cli` can run llama.cpp's image for this backend, else (None, reason)."""
    found = which(cli)
    if found is None:
        return None, f"{cli} is not on PATH"
    if backend.build == "metal":
        return None, "containers cannot reach Metal on macOS"
    if auto and backend.build == "cpu":
        return None, "CPU build: the binary or the wheel runs it without a container"
    info = container_info(cli, found)
    if info is None:
        return None, f"no {cli} daemon answers (`{cli} info` failed)"
    if (problem := _container_gpu_problem(cli, backend.build, info.lower())) is not None:
        return None, problem
    image = llama_release().image_for(backend.build, tag=tag)
    if image is None:
        return None, f"no llama.cpp image for the {backend.build} build"
    return image, None


def _try_bin(
    backend: Backend, hardware: Hardware, *, fetcher: ReleaseFetcher, tag: str | None
) -> tuple[Installed | None, str | None]:
    spec = llama_release()
    key = platform_key(hardware.os, hardware.arch, backend.build)
    if spec.asset(key, tag=tag) is None:
        return None, f"no asset for this platform ({key}) in llama.cpp {tag or spec.tag}"
    hit = fetcher.newest_cached(spec, key=key) if tag == "latest" else fetcher.cached(spec, key=key, tag=tag)
    if hit is None:
        offline = "; offline" if fetcher.offline else ""
        pull = "run `switchyard serve --pull-only`"
        return None, f"llama.cpp {tag or spec.tag} ({key}) is not downloaded{offline}: {pull}"
    return hit, None


def choose_runtime(
    settings: Settings,
    hardware: Hardware | None,
    *,
    env: Mapping[str, str] | None = None,
    which: Which = shutil.which,
    fetcher: ReleaseFetcher | None = None,
) -> RuntimeChoice:
    """The first runtime in order that can start llama.cpp here, with every step's reason."""
    order = runtime_order(settings, env)
    auto = runtime_setting(settings, env) == "auto"
    hardware = machine_now(hardware)
    backend = backend_for(hardware)
    fetcher = fetcher or fetcher_for(settings)
    tag = _tag(settings)
    steps: list[Step] = []
    for rt in order:
        if rt in CONTAINER_CLIS:
            image, why = _try_container(rt, backend, auto=auto, which=which, tag=tag)
            if image is not None:
                steps.append(Step(rt, None))
                return RuntimeChoice(rt, backend.build, backend.reason, tuple(steps), image=image)
        elif rt == "bin":
            hit, why = _try_bin(backend, hardware, fetcher=fetcher, tag=tag)
            if hit is not None:
                steps.append(Step(rt, None))
                why_bin = f"{backend.reason}; llama.cpp {hit.tag} release asset {hit.asset}"
                return RuntimeChoice(rt, backend.build, why_bin, tuple(steps), binary=str(hit.binary))
        elif rt == "path":
            binary = find_llama_server(settings)
            where = (
                f"at {settings.llamacpp.llama_server_path}"
                if settings.llamacpp.llama_server_path
                else "on PATH"
            )
            why = None if binary else f"no executable llama-server {where}"
            if binary is not None:
                steps.append(Step(rt, None))
                return RuntimeChoice(rt, None, f"{binary}, as it was built", tuple(steps), binary=binary)
        else:  # xllamacpp
            why = None if xllamacpp_available() else "xllamacpp is not installed (`pip install xllamacpp`)"
            if why is None:
                steps.append(Step(rt, None))
                build = "cpu"  # the PyPI wheel is a CPU build
                lost = "" if backend.build == "cpu" else f" (this machine could run {backend.build})"
                return RuntimeChoice(rt, build, f"the xllamacpp wheel is a CPU build{lost}", tuple(steps))
        steps.append(Step(rt, why))
    return RuntimeChoice(None, None, "nothing can run llama.cpp here", tuple(steps))


# ---- vLLM and SGLang: the package, or the upstream image -------------------------------------------
def _engine_order(settings: Settings, env: Mapping[str, str] | None) -> tuple[str, ...]:
    wanted = runtime_setting(settings, env)
    if wanted in CONTAINER_CLIS:
        return (wanted,)
    if wanted == "auto":
        return (PACKAGE, *(r for r in runtime_order(settings, env) if r in CONTAINER_CLIS))
    return (PACKAGE,)  # bin, path, xllamacpp: llama.cpp's runtimes; these engines run from their package


def _try_engine_container(
    cli: str, lane: str, hardware: Hardware | None, *, which: Which
) -> tuple[str | None, str | None, str | None]:
    """(image, build, None) when `cli` can run the lane's image on an NVIDIA card, else (None, None, why).
    Without `hardware` (an install check) the image is the repository alone: the tag follows the card's
    driver, known at the start."""
    spec = load_images()[lane]
    found = which(cli)
    if found is None:
        return None, None, f"{cli} is not on PATH"
    info = container_info(cli, found)
    if info is None:
        return None, None, f"no {cli} daemon answers (`{cli} info` failed)"
    if (problem := _container_gpu_problem(cli, "cuda12", info.lower())) is not None:
        return None, None, problem
    if hardware is None:
        return spec.image, None, None
    backend = backend_for(hardware)
    image = spec.image_for(backend.build)
    if image is None:
        builds = ", ".join(sorted(spec.tags))
        return None, None, f"no {title(lane)} image for the {backend.build} build (there is one for {builds})"
    return image, backend.build, None


def choose_engine_runtime(
    lane: str,
    settings: Settings,
    *,
    package: LaneInstall,
    hardware: Hardware | None,
    env: Mapping[str, str] | None = None,
    which: Which = shutil.which,
) -> RuntimeChoice:
    """How vLLM or SGLang starts here: its Python package (`package` says whether it is installed), else,
    in `auto` or where the setting names one, its upstream image through docker or podman."""
    steps: list[Step] = []
    for rt in _engine_order(settings, env):
        if rt == PACKAGE:
            why = None if package.installed else (package.note or f"{lane} is not installed")
            if why is None:
                steps.append(Step(rt, None))
                why_package = package.version or f"the {lane} package"
                return RuntimeChoice(rt, None, why_package, tuple(steps), engine=title(lane))
        else:
            image, build, why = _try_engine_container(rt, lane, hardware, which=which)
            if image is not None:
                steps.append(Step(rt, None))
                why_image = f"the upstream image {image}"
                if steps and steps[0].runtime == PACKAGE:  # auto, and the package is not here
                    why_image = f"{title(lane)} is not installed as a package, so {why_image} runs"
                return RuntimeChoice(rt, build, why_image, tuple(steps), image=image, engine=title(lane))
        steps.append(Step(rt, why))
    return RuntimeChoice(None, None, f"nothing can run {title(lane)} here", tuple(steps), engine=title(lane))


def engine_install(
    lane: str,
    settings: Settings,
    *,
    package: LaneInstall,
    env: Mapping[str, str] | None = None,
    which: Which = shutil.which,
) -> LaneInstall:
    """What the vLLM or SGLang lane reports: its package when that runs it, else the image a container
    CLI can run, else why neither can (the package's own words first: they say what to install)."""
    choice = choose_engine_runtime(lane, settings, package=package, hardware=None, env=env, which=which)
    if choice.runtime == PACKAGE:
        return package
    if choice.runtime is not None:
        where = f"{choice.image} through {choice.runtime}"
        return LaneInstall(lane, True, where, note=f"runtime {choice.runtime}: {choice.why}")
    containers = [s for s in choice.steps if s.runtime != PACKAGE and s.skipped]
    if len(containers) == len(choice.steps):  # docker or podman was asked for by name
        return LaneInstall(lane, False, package.version, note=choice.refusal())
    tried = "; ".join(f"{s.runtime}: {s.skipped}" for s in containers)
    note = package.note + (f"; nor can a container run its image ({tried})" if tried else "")
    return LaneInstall(lane, False, package.version, note=note)


# ---- sd-server: a configured path, the pinned release, PATH -----------------------------------------
def sd_release() -> ReleaseSpec:
    return load_releases()[SD_SERVER]


def sd_order(settings: Settings, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where sd-server is looked for when `sd_server_path` is not set: bin and path in the order the
    runtime setting gives them; a setting that names neither (docker, podman and xllamacpp are llama.cpp's
    alone) looks in both, the release first."""
    return tuple(r for r in runtime_order(settings, env) if r in SD_RUNTIMES) or SD_RUNTIMES


def sd_key(hardware: Hardware) -> tuple[str, str]:
    """The sd-server asset's platform key here, and why: the build's own where upstream ships one, else
    the CPU build for the same system (an image lane has no other way to run)."""
    backend = backend_for(hardware)
    key = platform_key(hardware.os, hardware.arch, backend.build)
    if sd_release().asset(key) is not None or backend.build == "cpu":
        return key, backend.reason
    cpu = platform_key(hardware.os, hardware.arch, "cpu")
    return cpu, f"{backend.reason}; stable-diffusion.cpp ships no {backend.build} build here: the CPU build"


def find_sd_release(hardware: Hardware, *, fetcher: ReleaseFetcher) -> tuple[Installed | None, str | None]:
    """The pinned sd-server release when it is in the engines folder, else why not; never downloads."""
    spec = sd_release()
    key, _why = sd_key(hardware)
    if spec.asset(key) is None:
        return None, f"stable-diffusion.cpp {spec.tag} has no sd-server asset for this platform ({key})"
    hit = fetcher.cached(spec, key=key)
    if hit is None:
        offline = "; offline" if fetcher.offline else ""
        return None, (
            f"stable-diffusion.cpp {spec.tag} ({key}) is not downloaded{offline}: "
            "run `switchyard serve --pull-only`"
        )
    return hit, None


def sd_needed(settings: Settings) -> list[str]:
    """The library's models that run on the sd.cpp lane (diffusers folders, diffusion GGUFs)."""
    with opened_catalog(settings, Paths.from_env(), notice=lambda _text: None) as (_library, catalog):
        # the image-generation formats: sd-server is the one engine that reads them
        return sorted(e.id for e in catalog.scan() if e.model_format().kind in SD_FORMATS)


def _pull_sd(settings: Settings, hardware: Hardware, fetcher: ReleaseFetcher) -> str:
    if settings.sdcpp.sd_server_path:
        return f"sd-server: sd_server_path is set ({settings.sdcpp.sd_server_path}): nothing to pull"
    if "bin" not in sd_order(settings):
        return "sd-server: the runtime setting does not use a downloaded release: nothing to pull"
    models = sd_needed(settings)
    if not models:
        return "sd-server: no model in the library runs on stable-diffusion.cpp: nothing to pull"
    key, why = sd_key(hardware)
    got = fetcher.fetch(sd_release(), key=key)
    return (
        f"stable-diffusion.cpp {got.tag} ({key}, {why}) for {', '.join(models[:3])}"
        f"{' …' if len(models) > 3 else ''}: {got.binary} (sha256 {got.sha256[:12]}…)"
    )


def pull_only(
    settings: Settings,
    hardware: Hardware | None,
    *,
    fetcher: ReleaseFetcher | None = None,
    tag: str | None = None,
) -> list[str]:
    """Fetch the releases the `bin` runtime would run (`serve --pull-only`); lines to print: llama.cpp's,
    and sd-server's when a model in the library runs on the sd.cpp lane.

    `tag` (`engine update --latest` passes "latest") wins over llama_cpp_version; sd-server is always its
    pin. A binary whose runtimes leave out `bin` is not pulled. Errors (offline, no asset, a bad digest)
    raise, so the command exits non-zero and says what to do; a failed update leaves the release already
    there in use."""
    hardware = machine_now(hardware)
    fetcher = fetcher or fetcher_for(settings)
    if "bin" not in runtime_order(settings):
        lines = [
            f"runtime {runtime_setting(settings)!r} does not use a downloaded llama.cpp: nothing to pull"
        ]
    else:
        backend = backend_for(hardware)
        key = platform_key(hardware.os, hardware.arch, backend.build)
        got = fetcher.fetch(llama_release(), key=key, tag=tag or _tag(settings))
        lines = [f"llama.cpp {got.tag} ({key}, {backend.reason}): {got.binary} (sha256 {got.sha256[:12]}…)"]
    return [*lines, _pull_sd(settings, hardware, fetcher)]


def doctor_rows(settings: Settings, hardware: Hardware | None) -> list[dict[str, Any]]:
    """One row per runtime in the order tried: chosen, skipped with its reason, or not reached."""
    choice = choose_runtime(settings, hardware)
    seen = {s.runtime: s for s in choice.steps}
    rows = []
    for rt in runtime_order(settings):
        step = seen.get(rt)
        state = "not tried" if step is None else ("chosen" if step.skipped is None else "skipped")
        rows.append({"runtime": rt, "state": state, "reason": step.skipped if step else None})
    return rows
