"""Issue 31, defect 4 (its advice): a prompt longer than a one-slot model's context is told to raise
ctx_size (not to lower a `parallel` that is 1 already), and how to apply that to the running server."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.conftest import link_models, running_server


def test_too_long_prompt_advice_fits_the_settings(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(
        json.dumps({"model_overrides": {"tiny": {"parallel": 1, "ctx_size": 256}}})
    )
    with running_server(home, models) as s:
        client = openai.OpenAI(base_url=s.api, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as got:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "word " * 400}]
            )
    text = str(got.value)
    assert "raise ctx_size" in text and "lower parallel" not in text, text
    assert "PUT /api/settings" in text and "next start" in text, text


def test_the_advertised_context_is_what_the_engine_gives_a_slot(tmp_path: Path, model_store: Path) -> None:
    """ctx_size above the trained context (2048 here) with one slot: llama.cpp caps the slot at 2048, so
    /v1/models says 2048 (before: 8192) and a prompt between the two is the gateway's clear 400."""
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(
        json.dumps({"model_overrides": {"tiny": {"parallel": 1, "ctx_size": 8192}}})
    )
    with running_server(home, models) as s:
        client = openai.OpenAI(base_url=s.api, api_key="unused", max_retries=0)
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        listed = {m.id: m.model_extra for m in client.models.list()}
        assert listed["tiny"]["context_length"] == 2048, listed
        with pytest.raises(openai.BadRequestError) as got:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "word " * 1200}]
            )
    assert got.value.code == "context_length_exceeded" and "2048 tokens per request" in str(got.value)
