"""`recipegen model import`: a Hugging Face `config.json` (+ safetensors index) -> a model file.

`import_model(path, name=...)` returns the validated `Model` and its YAML text; every figure in
the text cites the config field, tensor name or vLLM source line it came from. The CLI
(`recipegen.cli.model_cmd`) only parses options and writes the file.
"""

from __future__ import annotations

from pathlib import Path

from recipegen.modelimport.build import describe, locate
from recipegen.modelimport.write import import_summary, model_from_document, to_yaml

__all__ = ["import_model", "import_summary", "describe", "locate", "to_yaml", "model_from_document"]


def import_model(path: Path, *, name: str | None = None, checkpoint: str | None = None):
    """(validated Model, YAML text) for a config.json or a checkpoint folder."""
    inp = locate(path)
    model_name = name or default_name(inp.config)
    doc = describe(inp, name=model_name, checkpoint=checkpoint)
    model = model_from_document(doc, str(inp.config))
    return model, to_yaml(doc, source=str(path))


def default_name(config: Path) -> str:
    """The folder's name, lowercased (`Qwen3-30B-A3B/config.json` -> `qwen3-30b-a3b`)."""
    import re
    base = config.parent.name or "model"
    return re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-") or "model"
