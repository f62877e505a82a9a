"""Quantization names from hub file names, and files grouped into the choices a user picks from."""

from __future__ import annotations

import pytest

from app.hub.quant import RepoFile, group_gguf_files, parse_quant, pick


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("m-Q4_K_M.gguf", "Q4_K_M"),
        ("Llama-3-8B-Instruct.q5_k_s.gguf", "Q5_K_S"),
        ("x.IQ4_XS.gguf", "IQ4_XS"),
        ("UD-Q4_K_XL/m-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL"),
        ("m-fp16.gguf", "F16"),
        ("m.bf16.gguf", "BF16"),
        ("m-Q4_0_4_4.gguf", "Q4_0_4_4"),
        ("gpt-oss-MXFP4_MOE.gguf", "MXFP4_MOE"),
        ("qwen2.5-7b-instruct.gguf", None),
        ("Q8_0-model-Q2_K.gguf", "Q2_K"),  # the last token wins: it is the one the quantizer appended
    ],
)
def test_parse_quant(name: str, quant: str | None) -> None:
    assert parse_quant(name) == quant


def test_grouping_joins_parts_sorts_by_size_and_keeps_projectors_apart() -> None:
    files = [
        RepoFile("m-Q8_0.gguf", 800),
        RepoFile("m-Q4_K_M.gguf", 400),
        RepoFile("big/m-F16-00002-of-00002.gguf", 900),
        RepoFile("big/m-F16-00001-of-00002.gguf", 1000),
        RepoFile("mmproj-m-f16.gguf", 50),
        RepoFile("README.md", 10),
    ]
    g = group_gguf_files(files)
    assert [c.name for c in g.choices] == ["Q4_K_M", "Q8_0", "F16"]
    f16 = g.choices[2]
    assert [f.path for f in f16.files] == ["big/m-F16-00001-of-00002.gguf", "big/m-F16-00002-of-00002.gguf"]
    assert f16.size == 1900 and f16.complete and f16.parts_expected == 2
    assert [p.path for p in g.projectors] == ["mmproj-m-f16.gguf"]
    assert pick(g, "q8_0") is g.choices[1]
    assert pick(g, "m-Q4_K_M.gguf") is g.choices[0]
    assert pick(g, "Q3_K_S") is None


def test_missing_part_is_incomplete_and_same_quant_in_two_folders_stays_distinct() -> None:
    g = group_gguf_files(
        [
            RepoFile("a/m-Q4_K_M.gguf", 1),
            RepoFile("b/m-Q4_K_M.gguf", 2),
            RepoFile("m-Q6_K-00001-of-00003.gguf", 5),
        ]
    )
    names = {c.name: c for c in g.choices}
    assert set(names) == {"a/m-Q4_K_M", "b/m-Q4_K_M", "Q6_K"}
    assert not names["Q6_K"].complete
    assert group_gguf_files([RepoFile("x.gguf")]).choices[0].size is None
