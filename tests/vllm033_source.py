"""Where this machine keeps vLLM 0.33.0's unpacked source (contract tests read it, never import it).

One lookup for every test that checks recipegen or the runtime against the 0.33.0 source.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def vllm033_source(required: str = "__init__.py") -> Path | None:
    """The 0.33.0 `vllm/` folder that holds `required` (a path inside it), or None.

    Looked for in `$RECIPEGEN_VLLM033_SRC` (a folder that contains `vllm/`), then the repo's
    `.cache/vllm-0.33.0` (scripts/fetch-vllm033-source.sh), then /work/cache/vllm-0.33.0.
    """
    candidates = []
    if os.environ.get("RECIPEGEN_VLLM033_SRC"):
        candidates.append(Path(os.environ["RECIPEGEN_VLLM033_SRC"]) / "vllm")
    candidates += [REPO / ".cache" / "vllm-0.33.0" / "vllm", Path("/work/cache/vllm-0.33.0/vllm")]
    for candidate in candidates:
        if (candidate / required).is_file():
            return candidate
    return None
