"""extra_args cannot override a flag the ledger budgeted for, in any spelling vLLM accepts:
short aliases, `--flag=value`, `--flag_with_underscores`, negated booleans."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_support import cli, reference_plain, refused, write_recipe

from recipegen.vllm_flags import load_flag_table

OWNED = ["--tensor-parallel-size", "--max-model-len", "--gpu-memory-utilization", "--port",
         "--host", "--model", "--served-model-name", "--speculative-config", "--cpu-offload-gb",
         "--worker-extension-cls", "--max-num-seqs"]


def _aliases() -> list[tuple[str, str]]:
    """(spelling, canonical) for every alias vLLM 0.33 declares of a flag the render owns."""
    table = load_flag_table()
    return sorted((flag, info["canonical"]) for flag, info in table.flags.items()
                  if info.get("canonical") in OWNED and flag != info["canonical"])


def test_the_alias_table_has_the_short_forms() -> None:
    aliases = dict(_aliases())
    assert aliases["-tp"] == "--tensor-parallel-size"
    assert aliases["-sc"] == "--speculative-config"


SPELLINGS = [
    ["-tp", "8"], ["-tp=8"], ["--tensor-parallel-size=8"], ["--tensor_parallel_size", "8"],
    ["--tensor_parallel_size=8"], ["-sc", '{"method": "ngram", "num_speculative_tokens": 9}'],
    ["--port=9999"], ["--max-model-len=2048"], ["--max_model_len", "2048"],
    ["--gpu-memory-utilization=0.5"], ["--host=0.0.0.0"], ["--served-model-name=x"],
    ["--cpu_offload_gb", "1"], ["--worker-extension-cls=x.Y"],
    *[[alias, "1"] for alias, _ in _aliases()],
]


@pytest.mark.parametrize("args", SPELLINGS, ids=[" ".join(a)[:30] for a in SPELLINGS])
def test_owned_flags_are_refused_in_every_spelling(project: Path, args: list[str]) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "hostile", doc)
    refused("render", "hostile", expect="extra_args")
    assert not (project / "compose" / "hostile").exists()


@pytest.mark.parametrize("args", [["-tp8"], ["-O3"], ["--tensor-parallel", "8"], ["8"],
                                  ["--enable-prefix-caching", "--", "--port", "1"]])
def test_spellings_outside_the_flag_table_are_refused(project: Path, args: list[str]) -> None:
    """Prefixes, glued short values and bare values are not checked flags: refused."""
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = args
    write_recipe(project, "hostile", doc)
    refused("render", "hostile")


def test_a_flag_the_render_leaves_alone_still_passes(project: Path) -> None:
    doc = reference_plain()
    doc["lanes"][0]["extra_args"] = ["--enable-prefix-caching", "--max-num-batched-tokens=8192"]
    write_recipe(project, "ok", doc)
    code, out = cli("render", "ok")
    assert code == 0, out
    text = (project / "compose" / "ok" / "compose.yaml").read_text()
    assert '"--max-num-batched-tokens=8192"' in text
