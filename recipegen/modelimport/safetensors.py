"""What a checkpoint's `model.safetensors.index.json` (and, where present beside it, the shard
headers) says about its bytes: total size, and routed-expert vs other bytes by tensor name.

The index names every tensor and the file holding it, and gives the total size; each shard
starts with an 8-byte little-endian header length and a JSON header with every tensor's dtype,
shape and byte range, so the split is exact when the shards are there (only their headers are
read). A tensor is a routed expert when its name has an `.experts.` component (not
`shared_experts`); decoder layers at or past `num_hidden_layers` are MTP layers.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from recipegen.common.errors import InputError

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def is_routed_expert(name: str) -> bool:
    return ".experts." in name and "shared_expert" not in name


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


@dataclass
class IndexFacts:
    """What the index (and shard headers) give."""

    file: str
    total_size: int | None
    names: list[str]
    expert_bias_names: list[str] = field(default_factory=list)
    mtp_layers: list[int] = field(default_factory=list)
    exact_expert_bytes: int | None = None     # from shard headers, layers < num_hidden_layers
    exact_dense_bytes: int | None = None      # from shard headers, layers < num_hidden_layers
    exact_mtp_bytes: int | None = None
    shards_read: int = 0


def read_index(path: Path, num_layers: int) -> IndexFacts:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError("missing `weight_map` (tensor name -> shard file)", file=str(path), field="weight_map")
    total = (data.get("metadata") or {}).get("total_size")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0):
        raise InputError(f"expected a positive integer, got {total!r}", file=str(path), field="metadata.total_size")
    names = sorted(weight_map)
    facts = IndexFacts(str(path), total, names)
    facts.expert_bias_names = [n for n in names if is_routed_expert(n) and n.endswith("bias")]
    facts.mtp_layers = sorted({lay for n in names if (lay := layer_of(n)) is not None and lay >= num_layers})
    shards = sorted(set(weight_map.values()))
    if shards and all((path.parent / s).is_file() for s in shards):
        experts = dense = mtp = 0
        for shard in shards:
            for name, nbytes in _header_sizes(path.parent / shard).items():
                lay = layer_of(name)
                if lay is not None and lay >= num_layers:
                    mtp += nbytes
                elif is_routed_expert(name):
                    experts += nbytes
                else:
                    dense += nbytes
        facts.exact_expert_bytes, facts.exact_dense_bytes, facts.exact_mtp_bytes = experts, dense, mtp
        facts.shards_read = len(shards)
    return facts


def _header_sizes(path: Path) -> dict[str, int]:
    """Tensor name -> bytes, from a safetensors shard's header only."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise InputError("too short for a safetensors header", file=str(path))
            (length,) = struct.unpack("<Q", head)
            if length > 100 * 2**20:
                raise InputError(f"header length {length} is not plausible", file=str(path))
            header = json.loads(f.read(length))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"header is not JSON: {exc.msg}", file=str(path)) from None
    out: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise InputError(f"tensor {name!r} has no data_offsets", file=str(path)) from None
        out[name] = int(end) - int(start)
    return out
