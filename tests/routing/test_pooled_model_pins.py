"""Issue 31, defect 7: `switchyard pin` refuses mistral.rs for embedding models and rerankers (it runs
generative models only: every request would fail 503), naming a reranker as a reranker."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.__main__ import main
from tests.support.tinymodels import EMBED, write_tiny_gguf, write_tiny_reranker


@pytest.mark.parametrize(("name", "what"), [("emb", "embedding model"), ("rr", "reranker")])
def test_pin_refuses_mistralrs_for_pooled_models(
    name: str, what: str, isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = isolated_env / "models"
    if name == "emb":
        write_tiny_gguf(models / "emb.gguf", EMBED)
    else:
        models.mkdir(parents=True, exist_ok=True)
        write_tiny_reranker(models / "rr.gguf")
    assert main(["pin", name, "mistral.rs"]) == 2
    err = capsys.readouterr().err
    assert f"a GGUF {what}" in err and "llama.cpp runs it" in err, err
    assert not (isolated_env / "pins.json").exists() or name not in (isolated_env / "pins.json").read_text()
    assert main(["pin", name, "llama.cpp"]) == 0  # its own lane is still accepted
