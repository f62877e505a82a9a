"""Other apps' model stores laid out as those apps write them, for the app-store tests and the dashboard.

Ollama (0.5+): `models/manifests/registry.ollama.ai/<namespace>/<model>/<tag>` holds a Docker v2 manifest
whose layers name blobs `models/blobs/sha256-<hex>` by digest (the GGUF weights, the template, the license,
the params, and a config blob recording family and quantization). LM Studio (0.3+):
`~/.lmstudio/models/<publisher>/<repo>/<file>.gguf`. Jan (0.6+): `<data>/Jan/data/llamacpp/models/<id>/
model.gguf` beside model.yml. GPT4All: a flat folder, downloads in progress named `incomplete-<file>`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

_REGISTRY = "registry.ollama.ai"
TEMPLATE = "{{ if .System }}<|system|>{{ .System }}{{ end }}<|user|>{{ .Prompt }}<|assistant|>"


def _blob(models: Path, data: bytes, *, media: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    path = models / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}


def ollama_model(
    models: Path,
    gguf: Path,
    *,
    name: str,
    tag: str = "latest",
    namespace: str = "library",
    quant: str = "F32",
) -> Path:
    """`ollama pull`'s result for `namespace/name:tag` with `gguf` as its weights; returns the manifest."""
    weights = gguf.read_bytes()
    config = json.dumps(
        {
            "model_format": "gguf",
            "model_family": "llama",
            "model_families": ["llama"],
            "model_type": "1M",
            "file_type": quant,
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": _blob(models, config, media="application/vnd.docker.container.image.v1+json"),
        "layers": [
            _blob(models, weights, media="application/vnd.ollama.image.model"),
            _blob(models, TEMPLATE.encode(), media="application/vnd.ollama.image.template"),
            _blob(models, b"MIT License\n", media="application/vnd.ollama.image.license"),
            _blob(models, b'{"stop":["<|user|>"]}', media="application/vnd.ollama.image.params"),
        ],
    }
    path = models / "manifests" / _REGISTRY / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def lmstudio_model(models: Path, gguf: Path, *, publisher: str, repo: str, file: str) -> Path:
    dest = models / publisher / repo / file
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, dest)
    return dest


def jan_model(models: Path, gguf: Path, *, model_id: str) -> Path:
    folder = models / model_id
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, folder / "model.gguf")
    (folder / "model.yml").write_text(
        f"model_path: llamacpp/models/{model_id}/model.gguf\nname: {model_id}\n"
    )
    return folder / "model.gguf"


def fingerprint(*roots: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under `roots`: sha256, size and mtime, to show that nothing was written."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                st = p.stat()
                out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)
    return out
