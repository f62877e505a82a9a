"""Prebuilt upstream releases (llama-server, sd-server): pinned in engines.toml, downloaded once, verified.

Layout under the data dir:

    engines/<binary>-bin/<tag>/<platform key>/       the unpacked asset; `installed.json` marks it whole
    engines/<binary>-bin/.downloads/<asset>.part      a download in progress (removed when it fails)

An asset counts only once `installed.json` is written, after its sha256 matched and it was unpacked into a
temporary folder renamed into place, so a cut download or a tampered file never leaves a binary to run.
The releases API is GitHub's (`SWITCHYARD_RELEASES_API` points elsewhere: a mirror, or the tests' host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
import tomllib
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from app.core.errors import EngineInstallError, EngineUnavailableError
from app.lanes.install.store import MANIFEST

DEFAULT_API = "https://api.github.com"
CHUNK = 1 << 20


@dataclass(frozen=True)
class AssetPin:
    name: str  # the file name, {tag} filled in
    sha256: str  # "" where the manifest records none (the API's digest is used)


@dataclass(frozen=True)
class ReleaseSpec:
    """One binary's entry under [releases] in engines.toml."""

    binary: str
    repo: str
    tag: str
    assets: dict[str, AssetPin]  # by platform key, for the pinned tag
    image: str | None = None
    images: dict[str, str] = field(default_factory=dict)  # build -> image tag prefix

    def asset(self, key: str, *, tag: str | None = None) -> AssetPin | None:
        """The asset for `key` at `tag` (the pin when None); another tag's digest is never the pin's."""
        pin = self.assets.get(key)
        if pin is None or tag is None or tag == self.tag:
            return pin
        return AssetPin(pin.name.replace(self.tag, tag), "")

    def image_for(self, build: str, *, tag: str | None = None) -> str | None:
        prefix = self.images.get(build)
        if self.image is None or prefix is None:
            return None
        return f"{self.image}:{prefix}-{tag or self.tag}"


@dataclass(frozen=True)
class Installed:
    """An unpacked, verified asset."""

    binary: Path
    tag: str
    key: str
    asset: str
    sha256: str

    def public(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "binary": str(self.binary)}


@functools.lru_cache(maxsize=4)
def load_releases(path: Path = MANIFEST) -> dict[str, ReleaseSpec]:
    """The [releases] table by binary name. It ships with the code, so a broken one raises."""
    raw = tomllib.loads(path.read_text(encoding="utf-8")).get("releases", {})
    out: dict[str, ReleaseSpec] = {}
    for binary, r in raw.items():
        tag = str(r["tag"])
        assets = {
            key: AssetPin(str(a["name"]).replace("{tag}", tag), str(a.get("sha256", "")).lower())
            for key, a in r.get("assets", {}).items()
        }
        out[binary] = ReleaseSpec(
            binary, str(r["repo"]), tag, assets, r.get("image"), dict(r.get("images", {}))
        )
    return out


def platform_key(os_name: str, arch: str, build: str) -> str:
    return f"{os_name}-{arch}-{build}"


def releases_api() -> str:
    return os.environ.get("SWITCHYARD_RELEASES_API", DEFAULT_API).rstrip("/")


def _folder_name(text: str) -> str:
    if not text or "/" in text or "\\" in text or text in (".", "..") or text.startswith("."):
        raise EngineInstallError(f"release name {text!r} cannot be a folder name; pick another release tag")
    return text


class ReleaseFetcher:
    """Downloads, verifies and unpacks one release asset into `root` (SWITCHYARD_HOME/engines)."""

    def __init__(self, root: Path, *, offline: bool = False, api: str | None = None, timeout_s: float = 30):
        self.root = root
        self.offline = offline
        self.api = (api or releases_api()).rstrip("/")
        self.timeout_s = timeout_s

    def folder(self, spec: ReleaseSpec, *, tag: str, key: str) -> Path:
        return self.root / f"{spec.binary}-bin" / _folder_name(tag) / _folder_name(key)

    def cached(self, spec: ReleaseSpec, *, key: str, tag: str | None = None) -> Installed | None:
        """The verified, unpacked asset for `key` at `tag` (the pin), or None; never touches the network."""
        marker = self.folder(spec, tag=tag or spec.tag, key=key) / "installed.json"
        try:
            data = json.loads(marker.read_text(encoding="utf-8"))
            binary = Path(data["binary"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            return None
        return Installed(binary, str(data["tag"]), key, str(data["asset"]), str(data["sha256"]))

    def newest_cached(self, spec: ReleaseSpec, *, key: str) -> Installed | None:
        """The most recently installed tag for `key` (what `latest` last resolved to), or None."""
        found = []
        for folder in (self.root / f"{spec.binary}-bin").glob(f"*/{key}/installed.json"):
            hit = self.cached(spec, key=key, tag=folder.parent.parent.name)
            if hit is not None:
                found.append((folder.stat().st_mtime, hit))
        return max(found, key=lambda t: t[0])[1] if found else None

    def fetch(self, spec: ReleaseSpec, *, key: str, tag: str | None = None) -> Installed:
        """The asset for `key` at `tag` ("latest" asks the API which; None is the pin), downloaded once."""
        if tag != "latest" and (hit := self.cached(spec, key=key, tag=tag)) is not None:
            return hit
        if self.offline:
            raise EngineUnavailableError(
                f"{spec.binary} {tag or spec.tag} for {key} is not downloaded and Switchyard is offline; "
                "go online once and run `switchyard serve --pull-only`"
            )
        release = self._release(spec, tag or spec.tag)
        real_tag = str(release.get("tag_name") or tag or spec.tag)
        if (hit := self.cached(spec, key=key, tag=real_tag)) is not None:
            return hit
        pin = spec.asset(key, tag=real_tag)
        if pin is None:
            raise EngineUnavailableError(
                f"release {real_tag} of {spec.repo} has no {spec.binary} asset for {key}; "
                f"known: {', '.join(sorted(spec.assets)) or 'none'}"
            )
        url, digest = self._asset_url(release, pin, spec=spec, tag=real_tag)
        return self._install(spec, key=key, tag=real_tag, name=pin.name, url=url, sha256=digest)

    def _get_json(self, url: str) -> Any:
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.github+json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise EngineUnavailableError(
                f"the releases API answered {exc.code} for {url}; check the tag (or `latest`)"
            ) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EngineUnavailableError(
                f"cannot reach the releases API at {self.api} ({exc}); check the network, or set "
                "offline and use a runtime already downloaded"
            ) from exc

    def _release(self, spec: ReleaseSpec, tag: str) -> dict[str, Any]:
        where = "latest" if tag == "latest" else f"tags/{tag}"
        data = self._get_json(f"{self.api}/repos/{spec.repo}/releases/{where}")
        if not isinstance(data, dict) or not isinstance(data.get("assets"), list):
            raise EngineUnavailableError(f"the releases API gave no asset list for {spec.repo} {tag}")
        return data

    def _asset_url(
        self, release: dict[str, Any], pin: AssetPin, *, spec: ReleaseSpec, tag: str
    ) -> tuple[str, str]:
        for a in release["assets"]:
            if isinstance(a, dict) and a.get("name") == pin.name:
                published = str(a.get("digest") or "")
                digest = pin.sha256 or published.removeprefix("sha256:").lower()
                if not digest:
                    raise EngineInstallError(
                        f"{pin.name} of {spec.repo} {tag} has no published sha256 and engines.toml "
                        "records none; record its sha256 in engines.toml to use it"
                    )
                return str(a["browser_download_url"]), digest
        raise EngineUnavailableError(f"release {tag} of {spec.repo} does not list {pin.name}")

    def _install(
        self, spec: ReleaseSpec, *, key: str, tag: str, name: str, url: str, sha256: str
    ) -> Installed:
        downloads = self.root / f"{spec.binary}-bin" / ".downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        part = downloads / f"{_folder_name(name)}.part"
        try:
            got = self._download(url, part)
            if got != sha256:
                raise EngineInstallError(
                    f"{name} from {url} has sha256 {got}, expected {sha256}: refused and removed; "
                    "try again, and report it if it repeats"
                )
            final = self.folder(spec, tag=tag, key=key)
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=final.parent))
            try:
                binary = _unpack(part, staging, name=name, binary=spec.binary)
                shutil.rmtree(final, ignore_errors=True)
                staging.rename(final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        finally:
            part.unlink(missing_ok=True)
        installed = Installed(final / binary, tag, key, name, sha256)
        (final / "installed.json").write_text(json.dumps(installed.public()), encoding="utf-8")
        return installed

    def _download(self, url: str, part: Path) -> str:
        h = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp, part.open("wb") as out:
                while chunk := resp.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as exc:
            raise EngineUnavailableError(f"downloading {url} failed ({exc}); try again") from exc
        return h.hexdigest()


def _safe_member(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts:
        raise EngineInstallError(f"the archive holds {name!r}, outside its own folder: refused")
    return p


def _unpack(archive: Path, dest: Path, *, name: str, binary: str) -> PurePosixPath:
    """Unpack into `dest`; the binary's path inside (made executable). Upstream puts it in build/bin/
    (zip) or a versioned folder (tar): it is looked for anywhere."""
    found: list[PurePosixPath] = []
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                rel = _safe_member(info.filename)
                zf.extract(info, dest)
                mode = (info.external_attr >> 16) & 0o777
                if mode and not info.is_dir():
                    os.chmod(dest / rel, mode)
                if rel.name in (binary, f"{binary}.exe"):
                    found.append(rel)
    elif name.endswith((".tar.gz", ".tgz", ".tar.xz")):
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                rel = _safe_member(member.name)
                if member.issym() or member.islnk():
                    _safe_member(str(rel.parent / member.linkname))
                if rel.name in (binary, f"{binary}.exe") and member.isfile():
                    found.append(rel)
            tf.extractall(dest, filter="data")
    else:
        raise EngineInstallError(f"{name} is neither a zip nor a tar archive; pick another asset")
    if not found:
        raise EngineInstallError(f"{name} holds no {binary}; pick another asset or release")
    path = dest / min(found, key=lambda p: len(p.parts))
    with contextlib.suppress(OSError):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return min(found, key=lambda p: len(p.parts))
