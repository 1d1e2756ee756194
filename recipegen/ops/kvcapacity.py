"""vLLM's KV cache capacity as the engine reports it: `/metrics` or the start-up log.

- `/metrics`: the info gauge `vllm:cache_config_info{...,kv_cache_size_tokens="N",num_gpu_blocks="B",
  block_size="S"} 1` (vLLM 0.33 `v1/metrics/loggers.py` log_metrics_info, labels from
  `CacheConfig.metrics_info()`; `kv_cache_size_tokens` is the group-aware capacity set by
  `update_kv_cache_capacity`, preferred over blocks × block size, which can be wrong for hybrid models).
- the log: `GPU KV cache size: 2,540,000 tokens, Maximum concurrency …` (`v1/core/kv_cache_utils.py`).
Pure parsing; fetching is the caller's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INFO_RE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.M)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_LOG_RE = re.compile(r"(?:GPU|[A-Z]+)(?: \+ host)? KV cache size: ([\d,]+) tokens")


@dataclass(frozen=True)
class KvCapacity:
    tokens: int
    source: str        # "metrics: kv_cache_size_tokens", "log", …


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def kv_from_metrics(text: str) -> KvCapacity | None:
    """Summed over engines (data-parallel ranks each report their own pool); None when absent."""
    total, source = 0, ""
    for m in _INFO_RE.finditer(text):
        labels = dict(_LABEL_RE.findall(m.group("labels")))
        tokens = _int(labels.get("kv_cache_size_tokens", "None"))
        if tokens is not None:
            total, source = total + tokens, "metrics: kv_cache_size_tokens"
            continue
        blocks, size = _int(labels.get("num_gpu_blocks", "None")), _int(labels.get("block_size", "None"))
        if blocks is not None and size is not None:
            total, source = total + blocks * size, "metrics: num_gpu_blocks × block_size"
    return KvCapacity(total, source) if source else None


def kv_from_log(text: str) -> KvCapacity | None:
    """The last capacity line of the log (the current boot's, when the log spans restarts)."""
    found = _LOG_RE.findall(text)
    if not found:
        return None
    return KvCapacity(int(found[-1].replace(",", "")), "log: KV cache size line")
