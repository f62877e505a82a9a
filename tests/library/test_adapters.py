"""LoRA adapter GGUFs in the library (issue 16): listed as adapters of the models llama.cpp would load them
on, never as models (broken or servable); one no model takes says why. Checked where a user sees them:
`switchyard ls` (text and --json), the catalog, GET /api/library, /v1/models and a request by the adapter's
name on a real server, and the Library page with its Tune panel."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # the Library page test builds a window

from app.core.errors import NoLaneForFormatError
from app.library.catalog import Catalog
from tests.cli.test_library import call
from tests.conftest import REPO, link_models, running_server
from tests.support.loragen import write_tiny_lora
from tests.support.tinymodels import CHAT, MEDIUM, write_tiny_gguf

SWITCHYARD = str(REPO / ".venv" / "bin" / "switchyard")


def write_other_arch_lora(path: Path, arch: str = "qwen2") -> Path:
    """An adapter shaped for the tiny model but for another architecture: no llama model takes it."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 8.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, CHAT.n_embd), np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((CHAT.n_embd, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def models(tmp_path: Path, model_store: Path) -> Path:
    """tiny (a model); my-adapter (made for tiny); wide-adapter (tiny's architecture, other widths: llama.cpp
    would refuse it on tiny); qwen-adapter (another architecture)."""
    d = link_models(tmp_path / "models", model_store / "tiny.gguf")
    write_tiny_lora(d / "my-adapter.gguf", CHAT)
    write_tiny_lora(d / "wide-adapter.gguf", CHAT, width=2 * CHAT.n_embd)
    write_other_arch_lora(d / "qwen-adapter.gguf")
    return d


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    return subprocess.run([SWITCHYARD, *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def check_adapters(models: dict[str, dict[str, Any]]) -> None:
    """What `ls --json` and GET /api/library say of the fixture's models."""
    assert models["tiny"]["status"] == "ok" and models["tiny"]["kind"] == "chat"
    mine = models["my-adapter"]
    assert (mine["kind"], mine["status"], mine["facts"]) == ("adapter", "adapter", None)
    assert mine["adapter"]["bases"] == ["tiny"] and mine["adapter"]["why"] is None
    assert (mine["adapter"]["architecture"], mine["adapter"]["type"], mine["adapter"]["rank"]) == (
        "llama",
        "lora",
        4,
    )
    assert mine["adapter"]["weights"] == CHAT.n_layer
    assert mine["problem"].startswith("LoRA adapter of tiny, not a model of its own")
    assert "model_overrides['tiny'].lora" in mine["problem"]
    wide = models["wide-adapter"]
    assert (wide["kind"], wide["status"], wide["adapter"]["bases"]) == ("adapter", "adapter", [])
    why = wide["adapter"]["why"]
    assert why.startswith("no base model in the library pairs with it (tiny: blk.0.attn_q.weight is")
    assert f"the adapter expects [{2 * CHAT.n_embd}, {2 * CHAT.n_embd}]" in why and why in wide["problem"]
    qwen = models["qwen-adapter"]
    assert qwen["status"] == "adapter" and qwen["adapter"]["bases"] == []
    assert "no qwen2 model is in the library" in qwen["adapter"]["why"]
    for m in (mine, wide, qwen):  # never the layer-table complaint of a damaged model
        assert "layers" not in m["problem"] and "broken" not in m["problem"]


def test_ls_lists_adapters_with_their_base_or_why_none(isolated_env: Path, models: Path) -> None:
    out = cli(isolated_env, "ls", "--json", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    listed = {m["id"]: m for m in json.loads(out.stdout)["models"]}
    check_adapters(listed)
    assert listed["my-adapter"]["adapter"]["loaded_by"] == []
    text = cli(isolated_env, "ls", "--models-dir", str(models))
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("my-adapter "))
    assert " adapter " in line and "adapter: LoRA adapter of tiny" in line and "broken" not in line
    # once tiny's lora setting names it, the listing says it is loaded with tiny
    isolated_env.mkdir(parents=True, exist_ok=True)
    lora = [{"file": "my-adapter.gguf", "scale": 0.5}]
    (isolated_env / "settings.json").write_text(json.dumps({"model_overrides": {"tiny": {"lora": lora}}}))
    out = cli(isolated_env, "ls", "--json", "--models-dir", str(models))
    mine = {m["id"]: m for m in json.loads(out.stdout)["models"]}["my-adapter"]
    assert mine["adapter"]["loaded_by"] == ["tiny"] and "loaded with tiny" in mine["problem"]
    # explain says what it is, not that its files are unusable
    why = cli(isolated_env, "explain", "my-adapter", "--json", "--models-dir", str(models))
    assert why.returncode == 0, why.stderr
    first = json.loads(why.stdout)["decision"]["reasons"][0]
    assert first.startswith("Nothing runs it on its own: a LoRA adapter, not a model"), first


def test_catalog_never_serves_an_adapter_and_pairs_again_as_models_change(
    tmp_path: Path, models: Path
) -> None:
    catalog = Catalog([models])
    catalog.scan()
    assert catalog.ids() == ["tiny"]  # the adapters are listed, not served
    entry = catalog.get("my-adapter", allow_broken=True)
    assert (entry.kind, entry.ok, entry.problem, entry.facts) == ("adapter", False, None, None)
    with pytest.raises(NoLaneForFormatError) as got:
        catalog.get("my-adapter")
    msg = got.value.message
    assert (
        msg.startswith("'my-adapter' is a LoRA adapter, not a model")
        and "model_overrides['tiny'].lora" in msg
    )
    with pytest.raises(NoLaneForFormatError, match="no base model in the library pairs with it"):
        catalog.get("wide-adapter")
    assert catalog.adapter("tiny") is None
    # a model of the wide adapter's shape arrives: it pairs with that one, and my-adapter does not
    write_tiny_gguf(models / "mid.gguf", MEDIUM)
    write_tiny_lora(models / "mid-style.gguf", MEDIUM)
    catalog.scan()
    pairing = catalog.adapter("mid-style")
    assert pairing is not None and pairing.bases == ("mid",)
    mine = catalog.adapter("my-adapter")
    assert mine is not None and mine.bases == ("tiny",)
    # its base gone: the adapter stays listed, saying no model of its architecture is left
    (models / "tiny.gguf").unlink()
    (models / "mid.gguf").unlink()
    catalog.scan()
    gone = catalog.adapter("my-adapter")
    assert gone is not None and gone.bases == ()
    assert gone.why is not None and "no llama model is in the library" in gone.why


def test_server_lists_but_never_serves_an_adapter(tmp_path: Path, models: Path) -> None:
    with running_server(tmp_path / "home", models) as s:
        code, lib = call(s.url + "/api/library")
        assert code == 200, lib
        check_adapters({m["id"]: m for m in lib["models"]})
        code, one = call(s.url + "/api/library/my-adapter")
        assert code == 200 and one["status"] == "adapter" and one["adapter"]["bases"] == ["tiny"]
        code, served = call(s.api + "/models")
        assert code == 200 and [m["id"] for m in served["data"]] == ["tiny"]
        body = {"model": "my-adapter", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        code, err = call(s.api + "/chat/completions", "POST", body)
        assert code == 422 and err["error"]["code"] == "no_lane_for_format", err
        assert "is a LoRA adapter, not a model" in err["error"]["message"]


def test_library_page_shows_an_adapter_of_its_base(
    qloop: asyncio.AbstractEventLoop, qapp: Any, isolated_env: Path, models: Path
) -> None:
    pytest.importorskip("PySide6")
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop
    from app.ui.pages.library import COLUMNS

    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=0)

    async def main() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            page: Any = desk.window.show_page("Library")
            await page.refresh()
            col = {name: i for i, name in enumerate(COLUMNS)}
            cells = {
                page.table.item(r, 0).text(): page.table.item(r, col["Fit"])
                for r in range(page.table.rowCount())
            }
            assert cells["my-adapter"].text() == "LoRA adapter of tiny"
            assert cells["my-adapter"].toolTip().startswith("LoRA adapter of tiny, not a model of its own")
            assert cells["wide-adapter"].text() == "LoRA adapter (no base model here)"
            assert "no base model in the library pairs with it" in cells["wide-adapter"].toolTip()
            assert "broken" not in {c.text() for c in cells.values()}
            # selected: the detail line says whose adapter it is; the Tune panel has nothing to set for it
            assert page.select("my-adapter")
            assert "LoRA adapter of tiny" in page.detail.text()
            tune = page.tune
            assert tune.model is None and not tune.isEnabled()
            assert tune.verdict.text() == (
                "my-adapter is a LoRA adapter of tiny: select tiny and tick it under LoRA adapters."
            )
            # and tiny's Tune panel offers it (the pairing helpers, from app/library/pairing.py)
            assert page.select("tiny")
            await tune.pairing
            assert [r.file for r in tune.adapters.rows] == ["my-adapter.gguf"]
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(main(), 120))
