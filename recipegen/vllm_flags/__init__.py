"""The `vllm serve` flags a vLLM version accepts, and a checker for a rendered argv (the
`--moe-backend` value a lane gets is chosen in `recipegen.vllm_flags.moe_backend`).

The table is generated from vLLM's source by `recipegen.vllm_flags.generate` and committed
under `recipegen/data/vllm_flags/vllm-<version>.json`; regenerate it with
`python -m recipegen.vllm_flags.generate <vllm package folder> --out <that file>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

TARGET_VLLM_VERSION = "0.33.0"



@dataclass(frozen=True)
class FlagTable:
    vllm_version: str
    flags: dict[str, dict[str, Any]]
    source_sha256: dict[str, str]

    def __contains__(self, flag: str) -> bool:
        return flag in self.flags

    def kind(self, flag: str) -> str:
        return str(self.flags[flag]["kind"])

    def choices(self, flag: str) -> list[str] | None:
        choices = self.flags[flag].get("choices")
        return list(choices) if choices is not None else None


@lru_cache(maxsize=4)
def load_flag_table(vllm_version: str = TARGET_VLLM_VERSION) -> FlagTable:
    """The committed flag table for `vllm_version` (a LookupError when none is committed)."""
    name = f"vllm-{vllm_version}.json"
    resource = resources.files("recipegen") / "data" / "vllm_flags" / name
    if not resource.is_file():
        raise LookupError(f"no vLLM flag table for version {vllm_version} ({name})")
    data = json.loads(resource.read_text(encoding="utf-8"))
    return FlagTable(data["vllm_version"], data["flags"], data["source_sha256"])


def argv_problems(argv: list[str], table: FlagTable) -> list[str]:
    """What is wrong with `vllm serve <argv>` for this table: unknown flags, missing values,
    values outside a flag's choices, values given to on/off flags. Empty when fine.

    Only the canonical spellings count (no `--flag_name` or `--flag.key` forms): the renderer
    writes canonical flags, and a stricter check catches a typo in the renderer. The same reader as
    a lane's `extra_args` (`recipegen.vllm_flags.args.parse_args`); a flag may repeat here (the
    profile boot's flags come last on purpose: the last one counts, as in vLLM).
    """
    from recipegen.vllm_flags.args import parse_args

    parsed = parse_args(argv, table, positional_first=True, canonical_only=True, allow_repeats=True)
    return [message for _, message in parsed.problems]
