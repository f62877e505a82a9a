"""Speculative decoding on the llama.cpp lane (issue 16): one real `serve` with tiny models that share a
tokenizer. A load body turns n-gram speculation on (applied, the lane restarted), a copy-heavy grammar
comes back byte-identical with llama.cpp's drafted/accepted counts in `timings` and in /metrics; a draft
model pairs by tokenizer and one with another tokenizer is refused with the reason; a generated LoRA
adapter loads with its base (and one of another shape is refused before the engine sees it)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.errors import SettingsError
from app.core.speculation import DRAFT_MAX_TEMPERATURE, adapters_of, speculation_of
from app.formats.detect import detect_format
from app.formats.gguf_adapter import read_adapter
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.lanes.engines.llamacpp.request_defaults import draft_unsuited
from app.library.drafts import choose_draft
from app.library.model import ModelEntry
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.loragen import write_tiny_lora

PASSAGE = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n" * 3
SHORT = "def add(a, b):\n    return a + b\n" * 2


def other_tokenizer(src: Path, dest: Path) -> Path:
    """A copy of `src` whose token list differs in one token of the same length (a different tokenizer
    with the same vocabulary size): the header changes, the weights do not."""
    data = src.read_bytes()
    word = "\u2581answer".encode()
    assert data.count(word) == 1
    dest.write_bytes(data.replace(word, "\u2581ANSWER".encode()))
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("spec")
    models = link_models(root / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    other_tokenizer(model_store / "tiny.gguf", models / "alien.gguf")
    write_tiny_lora(models / "lora.gguf")
    write_tiny_lora(models / "wide-lora.gguf", width=128)
    with running_server(root / "home", models) as s:
        yield s


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metric(server: ServerProcess, name: str, model: str) -> int:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.search(rf'^{name}\{{model="{re.escape(model)}"\}} (\d+)', text, re.M)
    return int(found.group(1)) if found else 0


def copy_answer(server: ServerProcess, model: str, passage: str = PASSAGE) -> tuple[str, dict[str, Any]]:
    """A greedy answer that a grammar forces to repeat `passage` from the prompt (as code editing does)."""
    client = openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Repeat this exactly:\n" + passage}],
        max_tokens=400,
        extra_body={"grammar": "root ::= " + json.dumps(passage), "temperature": 0},
    )
    return out.choices[0].message.content or "", dict((out.model_extra or {}).get("timings") or {})


def test_ngram_on_a_copy_heavy_grammar(server: ServerProcess) -> None:
    status, doc = call(server, "POST", "/api/models/tiny/load", {"speculative": {"type": "ngram_simple"}})
    assert status == 200, doc
    assert doc["change"]["not_applied"] == [] and doc["settings"]["speculative"] == {"type": "ngram_simple"}
    assert doc["params"]["spec_type"] == "ngram_simple"
    text, timings = copy_answer(server, "tiny")
    assert text == PASSAGE  # the grammar and speculation together: byte-identical
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert metric(server, "switchyard_draft_tokens_total", "tiny") >= timings["draft_n"]
    assert metric(server, "switchyard_draft_accepted_tokens_total", "tiny") >= timings["draft_n_accepted"]


def test_off_drafts_nothing(server: ServerProcess) -> None:
    status, doc = call(server, "POST", "/api/models/tiny/load", {"speculative": {"type": "off"}})
    assert status == 200 and doc["params"]["spec_type"] == "", doc
    text, timings = copy_answer(server, "tiny")
    assert text == PASSAGE and "draft_n" not in timings  # llama.cpp leaves draft_n out when off


DRAFT_TINY2 = {"speculative": {"type": "draft", "draft": "tiny2", "n_max": 8}}


def with_draft_tiny2(server: ServerProcess) -> dict[str, Any]:
    """tiny loaded with tiny2 as its draft model (each test that needs it sets it: no test relies on
    another's order)."""
    status, doc = call(server, "POST", "/api/models/tiny/load", DRAFT_TINY2)
    assert status == 200, doc
    return dict(doc)


def test_a_draft_model_with_the_same_tokenizer(server: ServerProcess) -> None:
    doc = with_draft_tiny2(server)
    assert doc["params"]["spec_type"] == "draft_simple" and doc["params"]["draft_path"].endswith("tiny2.gguf")
    text, timings = copy_answer(server, "tiny", SHORT)  # a random draft is mostly wrong: keep it short
    assert text == SHORT and timings["draft_n"] > 0


def lane_of(server: ServerProcess, model: str) -> dict[str, Any]:
    status, lanes = call(server, "GET", "/api/lanes")
    assert status == 200, lanes
    return dict(next(ln for ln in lanes["lanes"] if ln["id"] == model))


def engine_speculation_of(server: ServerProcess, model: str) -> dict[str, Any]:
    """What the engine's own /slots says, as /api/lanes/{id} reports it."""
    assert lane_of(server, model)["port"], "the lane is not running"
    status, lane = call(server, "GET", f"/api/lanes/{model}")
    assert status == 200, lane
    return dict(lane["speculation"])


def test_a_draft_lane_drafts_a_grammar_request_whatever_the_request_says(server: ServerProcess) -> None:
    """The shipped build ignores a request's own speculative fields: a grammar request (which a draft
    model does not pay on, draft_unsuited says why) drafts even when it asks for no drafts. If this
    fails, the engine honours them: then turn the draft off per request (docs/engines.md)."""
    with_draft_tiny2(server)
    client = openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)
    body = {"grammar": "root ::= " + json.dumps(SHORT), "temperature": 0}
    asked_off = {"speculative.n_max": 0, "speculative.types": "none", "speculative": {"n_max": 0}}
    messages: Any = [{"role": "user", "content": "Repeat this exactly:\n" + SHORT}]
    assert draft_unsuited({"messages": messages, **body}, max_temperature=DRAFT_MAX_TEMPERATURE) == "grammar"
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=100, extra_body={**body, **asked_off}
    )
    timings = dict((out.model_extra or {}).get("timings") or {})
    assert out.choices[0].message.content == SHORT and timings["draft_n"] > 0, timings
    # so the answer says the draft did not pay here, and /metrics counts such requests per reason
    assert timings["draft_unsuited"] == "grammar", timings
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        scrape = r.read().decode()
    assert 'switchyard_draft_unsuited_requests_total{model="tiny",reason="grammar"}' in scrape
    free = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, extra_body={"temperature": 0}
    )
    assert "draft_unsuited" not in dict((free.model_extra or {}).get("timings") or {})


def test_slots_show_whether_speculation_is_on(server: ServerProcess) -> None:
    with_draft_tiny2(server)
    assert engine_speculation_of(server, "tiny")["active"] is True  # before any request, too
    completion(server, "tiny")  # a slot names its type once it has served a request
    on = engine_speculation_of(server, "tiny")
    assert on["active"] is True and on["type"] == "draft-simple" and all(on["slots"]), on
    port = lane_of(server, "tiny")["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=30) as r:
        props = json.loads(r.read())["default_generation_settings"]["params"]
    assert props["speculative.types"] == "none"  # why /slots is read: /props says none even when on
    assert call(server, "POST", "/api/models/tiny/load", {"speculative": {"type": "off"}})[0] == 200
    off = engine_speculation_of(server, "tiny")
    assert off["active"] is False and off["slots"] and not any(off["slots"]), off


def test_explain_shows_the_pairing_and_the_drafts_memory(server: ServerProcess) -> None:
    with_draft_tiny2(server)
    status, doc = call(server, "GET", "/api/models/tiny/explain")
    assert status == 200, doc
    pairing = doc["speculation"]["pairing"]
    assert pairing["draft"] == "tiny2" and pairing["named"] and "tokenizer matches" in pairing["reason"]
    cpu = next(d for d in doc["fit"]["chosen"]["devices"] if d["device"] == "CPU")
    assert cpu["draft"] > (server.models_dir / "tiny2.gguf").stat().st_size  # its file and its KV cache


def test_explain_proposes_a_draft_and_says_why_others_are_not(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path, model_store / "tiny.gguf", model_store / "tiny2.gguf")
    other_tokenizer(model_store / "tiny.gguf", models / "alien.gguf")
    big = models / "big.gguf"
    big.write_bytes((models / "tiny.gguf").read_bytes() + b"\0" * 4096)  # the same tokenizer, larger

    def entry(name: str) -> ModelEntry:
        facts = read_gguf(models / f"{name}.gguf")
        assert isinstance(facts, GGUFFacts)
        return ModelEntry(id=name, path=models / f"{name}.gguf", facts=facts, problem=None)

    library = [entry(n) for n in ("tiny", "tiny2", "alien", "big")]
    got = choose_draft(library[3], library, named=None)
    assert got.draft is not None and got.draft.id in ("tiny", "tiny2") and not got.named
    assert "token list differs" in got.rejected["alien"]
    none = choose_draft(library[0], library, named=None)
    assert none.draft is None and "no smaller GGUF model" in none.reason


def test_a_draft_with_another_tokenizer_is_refused(server: ServerProcess) -> None:
    with_draft_tiny2(server)
    body = {"speculative": {"type": "draft", "draft": "alien"}}
    status, doc = call(server, "POST", "/api/models/tiny/load", body)
    assert status >= 400
    message = doc["error"]["message"]
    assert "alien" in message and "token list differs" in message, message
    # the previous settings are back: the lane still runs with the draft tiny2
    status, lanes = call(server, "GET", "/api/lanes")
    tiny = next(ln for ln in lanes["lanes"] if ln["id"] == "tiny")
    assert tiny["settings"]["speculative"]["draft"] == "tiny2"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"type": "eagle"}, "type must be one of"),
        ({"type": "ngram_mod", "size_n": 4}, "unknown keys ['size_n']"),
        ({"type": "draft", "n_max": 0}, "from 1 to 256"),
        ({"type": "draft", "n_min": 9, "n_max": 4}, "must not exceed n_max"),
        ("ngram", "must be an object"),
    ],
)
def test_bad_speculative_settings_say_what_to_do(value: Any, words: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(words)):
        speculation_of(value)


def test_speculative_shapes() -> None:
    assert speculation_of({"type": "ngram"}).type == "ngram_mod"
    assert speculation_of({"draft": "small", "n_max": 16}).type == "draft"  # the older shape
    assert [a.scale for a in adapters_of(["a.gguf", {"file": "b.gguf", "scale": 0.5}])] == [1.0, 0.5]
    with pytest.raises(SettingsError, match="scale from -4 to 4"):
        adapters_of([{"file": "a.gguf", "scale": 9}])


def completion(server: ServerProcess, model: str) -> str:
    client = openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)
    out = client.completions.create(model=model, prompt="hello", max_tokens=12, temperature=0)
    return out.choices[0].text


def test_a_lora_adapter_is_loaded_and_changes_the_answer(server: ServerProcess) -> None:
    assert call(server, "POST", "/api/models/tiny/load", {"speculative": {"type": "off"}})[0] == 200
    plain = completion(server, "tiny")
    body = {"lora": [{"file": "lora.gguf", "scale": 1.0}]}
    status, doc = call(server, "POST", "/api/models/tiny/load", body)
    assert status == 200, doc
    assert doc["params"]["lora_paths"][0].endswith("lora.gguf") and doc["params"]["lora_scales"] == [1.0]
    # greedy, same prompt: only the adapter differs; it applies under its own id, the base runs without it
    assert completion(server, "tiny+lora") != plain and completion(server, "tiny") == plain


def test_an_adapter_for_another_model_is_refused_before_the_engine(server: ServerProcess) -> None:
    status, doc = call(server, "POST", "/api/models/tiny/load", {"lora": [{"file": "wide-lora.gguf"}]})
    assert status >= 400
    message = doc["error"]["message"]
    assert "does not fit 'tiny'" in message and "expects [128, 128]" in message, message


def test_an_adapter_in_the_models_folder_says_what_it_is(server: ServerProcess) -> None:
    found = detect_format(server.models_dir / "lora.gguf")
    assert found.problem is not None and "a LoRA adapter, not a model" in found.problem
    facts = read_adapter(server.models_dir / "lora.gguf")
    assert facts is not None and facts.rank == 4 and "blk.0.attn_q.weight" in facts.targets


def test_llama_server_gets_the_same_settings_as_flags() -> None:
    from app.lanes.engines.llamacpp.spec import spec_argv
    from app.lanes.workers.params import LlamaParams

    base = dict(model_path="m.gguf", alias="m", ctx_size=512, parallel=1, threads=1, kv_type="f16")
    p = LlamaParams(
        **base,  # type: ignore[arg-type]
        flash_attn="auto",
        gpu_layers=0,
        embedding=False,
        pooling=None,
        spec_type="draft_simple",
        spec_n_max=8,
        draft_path="d.gguf",
        draft_gpu_layers=0,
        lora_paths=("a.gguf",),
        lora_scales=(0.5,),
    )
    args = spec_argv(p)
    assert args[:2] == ["--spec-type", "draft-simple"] and ["--spec-draft-n-max", "8"] == args[2:4]
    assert "--spec-draft-model" in args and args[-3:] == ["--lora-scaled", "a.gguf", "0.5"]
    assert LlamaParams.from_json(p.to_json()) == p  # the worker reads what the lane wrote
