"""Regenerate the shipped catalog models from the config.json fixtures they are imported from.

    python -m recipegen.modelimport.catalog          # rewrites recipegen/catalog/models/*.yaml
    python -m recipegen.modelimport.catalog --check  # exit 1 when a file is stale

The fixtures (`tests/fixtures/hf_configs/<name>/config.json`) are written from the public
config.json of each checkpoint below; the catalog file is exactly what `recipegen model import`
writes for it, so the two cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

from recipegen.modelimport import import_model

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path("tests") / "fixtures" / "hf_configs"
CATALOG = Path("recipegen") / "catalog" / "models"

# catalog name -> public checkpoint (Hugging Face repository) its config.json is from
CHECKPOINTS: dict[str, str] = {
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-235b-a22b-fp8": "Qwen/Qwen3-235B-A22B-FP8",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "kimi-k2-instruct": "moonshotai/Kimi-K2-Instruct",
    "glm-4.5-air": "zai-org/GLM-4.5-Air",
    "mixtral-8x7b-v0.1": "mistralai/Mixtral-8x7B-v0.1",
}


def render_all() -> dict[Path, str]:
    out = {}
    for name, checkpoint in CHECKPOINTS.items():
        _, text = import_model(FIXTURES / name, name=name, checkpoint=checkpoint)
        out[CATALOG / f"{name}.yaml"] = text
    return out


def main(argv: list[str]) -> int:
    import os

    from expert_residency.formats import atomic_write_text
    os.chdir(REPO)  # the generated header cites the fixture path relative to the repository
    stale = []
    for path, text in render_all().items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if "--check" in argv:
            stale.append(str(path))
        else:
            atomic_write_text(path, text)
            print(f"wrote {path}")
    if stale:
        print("stale: " + ", ".join(stale) + " — run python -m recipegen.modelimport.catalog", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
