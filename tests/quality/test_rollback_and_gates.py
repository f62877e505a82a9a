"""Issue 31, defect 9: `update MODEL --rollback` works while a gate is set, a second `--rollback` does not
move forward again, and `switchyard gate` refuses models that do not exist or can never be updated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.hub import cache_layout
from tests.conftest import REPO
from tests.support.fakehub import FakeHub
from tests.support.tinymodels import write_tiny_gguf

MODEL = "org/gated-GGUF/gated-Q8_0"


def switchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rollback_with_a_gate_and_twice(fake_hub: FakeHub, model_store: Path) -> None:
    fake_hub.add_repo("org/gated-GGUF", {"gated-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()})
    old = fake_hub.repos["org/gated-GGUF"].head.sha
    assert switchyard("pull", "org/gated-GGUF:Q8_0").returncode == 0
    new = fake_hub.commit("org/gated-GGUF", {"gated-Q8_0.gguf": (model_store / "tiny2.gguf").read_bytes()})
    r = switchyard("update", MODEL)
    assert r.returncode == 0, r.stdout + r.stderr
    rd = cache_layout.repo_folder(Path(os.environ["HF_HUB_CACHE"]), "org/gated-GGUF")
    assert cache_layout.read_ref(rd, "main") == new
    r = switchyard("gate", MODEL, "arithmetic", "0.8")
    assert r.returncode == 0, r.stderr

    r = switchyard("update", MODEL, "--rollback")  # before: "a gated update names one model"
    assert r.returncode == 0, r.stdout + r.stderr
    assert cache_layout.read_ref(rd, "main") == old
    r = switchyard("update", MODEL, "--rollback")  # before: moved forward to `new` again
    assert r.returncode == 2 and "already rolled back" in r.stderr, r.stdout + r.stderr
    assert cache_layout.read_ref(rd, "main") == old


def test_gate_refuses_what_update_can_never_change(isolated_env: Path) -> None:
    r = switchyard("gate", "no-such-model", "arithmetic", "0.8")
    assert r.returncode == 2 and "no model 'no-such-model' in the library" in r.stderr, r.stderr
    write_tiny_gguf(isolated_env / "models" / "local.gguf")
    r = switchyard("gate", "local", "arithmetic", "0.8")
    assert r.returncode == 2 and "not from Hugging Face" in r.stderr, r.stderr
    written = isolated_env / "settings.json"
    assert not written.exists() or '"gates"' not in written.read_text()
