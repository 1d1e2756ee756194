"""What a checkpoint's `model.safetensors.index.json` (and, where present beside it, the shard
headers) says about its bytes: total size, and routed-expert vs other bytes by tensor name.

The index names every tensor and the file holding it, and gives the total size; each shard
starts with an 8-byte little-endian header length and a JSON header with every tensor's dtype,
shape and byte range, so the split is exact when the shards are there (only their headers are
read). Nothing in them is trusted: a shard is named by a plain file name beside the index
(no folder, no `..`, no absolute path), is a regular file, and its header must describe the
file exactly — every byte range inside the data, in order, without overlap or hole, of the
length its dtype and shape imply, the last one ending where the file ends — and name exactly
the tensors the index places in it. A tensor is a routed expert when its name has an
`.experts.` component (not `shared_experts`); decoder layers at or past `num_hidden_layers`
are MTP layers.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from recipegen.common.errors import InputError
from recipegen.modelimport.jsondoc import JsonDoc, load_json, parse_json

INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 2**20       # DeepSeek-V3's index is 8.9 MB
MAX_HEADER_BYTES = 100 * 2**20     # the safetensors library's own bound on a header
MAX_TENSORS = 2_000_000
MAX_SHARDS = 100_000
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

# Bits per element of each safetensors dtype (the format's own list; F4 packs two per byte).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


def _json_type(value: object) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")


def is_routed_expert(name: str) -> bool:
    return ".experts." in name and "shared_expert" not in name


_MTP_MODULE = re.compile(r"(?:^|\.)mtp\.")


def is_mtp_module(name: str) -> bool:
    """A tensor of a separate `mtp.` module (Qwen3-Next / Qwen3.5: `mtp.layers.0.…`, `mtp.fc.weight`), which vLLM
    loads only for speculative decoding: the model drops `mtp.` names (vLLM 0.33.0 vllm/model_executor/models/
    qwen3_next.py:823, qwen3_5.py:328, :478 `WeightsMapper(orig_to_new_prefix={"mtp.": None})`)."""
    return _MTP_MODULE.search(name) is not None


def mtp_layer_of(name: str, num_layers: int) -> int | None:
    """The MTP layer a tensor belongs to, as a number past the decoder layers: `layers.N` with N ≥ num_layers,
    or `mtp.layers.K` counted as num_layers + K (`mtp.fc` and the other `mtp.` tensors outside a layer: num_layers)."""
    lay = layer_of(name)
    if is_mtp_module(name):
        return num_layers + (lay or 0)
    return lay if lay is not None and lay >= num_layers else None


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
    doc = load_json(path, limit=MAX_INDEX_BYTES, what=INDEX_NAME)
    data = doc.data
    if not isinstance(data, dict):
        raise InputError("expected a JSON object with `weight_map`", file=doc.file, line=1)
    weight_map = data.get("weight_map")
    if weight_map is None:
        raise doc.error("missing `weight_map` (tensor name -> shard file)", ("weight_map",))
    if not isinstance(weight_map, dict):
        raise doc.error(f"`weight_map` must be an object (tensor name -> shard file), got a {_json_type(weight_map)}",
                        ("weight_map",))
    if not weight_map:
        raise doc.error("`weight_map` is empty: it names no tensor (tensor name -> shard file)", ("weight_map",))
    if len(weight_map) > MAX_TENSORS:
        raise doc.error(f"{len(weight_map):,} tensors (at most {MAX_TENSORS:,})", ("weight_map",))
    for name, shard in weight_map.items():
        _check_shard_name(doc, name, shard)
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise doc.error("expected an object", ("metadata",))
    total = (metadata or {}).get("total_size")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0):
        raise doc.error(f"expected a positive integer, got {total!r}", ("metadata", "total_size"))
    names = sorted(weight_map)
    facts = IndexFacts(str(path), total, names)
    facts.expert_bias_names = [n for n in names if is_routed_expert(n) and n.endswith("bias")]
    facts.mtp_layers = sorted({lay for n in names if (lay := mtp_layer_of(n, num_layers)) is not None})
    by_shard: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, set()).add(name)
    if len(by_shard) > MAX_SHARDS:
        raise doc.error(f"{len(by_shard):,} shard files (at most {MAX_SHARDS:,})", ("weight_map",))
    present = [s for s in by_shard if _entry(path.parent / s) is not None]
    if present and len(present) != len(by_shard):
        missing = sorted(set(by_shard) - set(present))
        raise InputError(f"{len(missing)} of the {len(by_shard)} shards the index names are not beside it "
                         f"(first: {missing[0]}); give all of them or none (then the index's total_size is used)",
                         file=doc.file, line=doc.line(("weight_map", sorted(by_shard[missing[0]])[0])),
                         field="weight_map")
    if present:
        experts = dense = mtp = 0
        for shard in sorted(by_shard):
            header = read_shard_header(path.parent / shard)
            _check_same_tensors(doc, shard, by_shard[shard], header)
            for name, nbytes in header.items():
                if mtp_layer_of(name, num_layers) is not None:
                    mtp += nbytes
                elif is_routed_expert(name):
                    experts += nbytes
                else:
                    dense += nbytes
        if total is not None and experts + dense + mtp != total:
            raise doc.error(f"metadata.total_size is {total:,} B, the shard headers describe "
                            f"{experts + dense + mtp:,} B of tensors", ("metadata", "total_size"))
        facts.exact_expert_bytes, facts.exact_dense_bytes, facts.exact_mtp_bytes = experts, dense, mtp
        facts.shards_read = len(by_shard)
    return facts


def _check_shard_name(doc: JsonDoc, name: str, shard: object) -> None:
    """A shard is a file beside the index: a plain name, never a path."""
    where = ("weight_map", name)
    if not isinstance(shard, str):
        raise doc.error(f"expected a shard file name, got {shard!r}", where)
    if not _SHARD_NAME.fullmatch(shard) or shard in (".", "..") or ".." in shard.split("."):
        raise doc.error(f"shard {shard!r} is not a plain file name beside the index (no folder, no '..', "
                        "no absolute path)", where)


def _entry(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _check_same_tensors(doc: JsonDoc, shard: str, indexed: set[str], header: dict[str, int]) -> None:
    missing = sorted(indexed - set(header))
    if missing:
        raise doc.error(f"the index places {missing[0]!r} in {shard}, whose header does not have it "
                        f"({len(missing)} such tensor(s))", ("weight_map", missing[0]))
    extra = sorted(set(header) - indexed)
    if extra:
        raise InputError(f"tensor {extra[0]!r} is in the header but not in {INDEX_NAME} "
                         f"({len(extra)} such tensor(s)): the index does not describe this shard",
                         file=shard, field=extra[0])


def read_shard_header(path: Path) -> dict[str, int]:
    """Tensor name -> bytes, from a safetensors shard's header, checked against the file."""
    file = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read the shard: {exc.strerror}", file=file) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError("a safetensors shard must be a regular file", file=file)
        size = info.st_size
        if size < 8:
            raise InputError(f"{size} bytes: too short for a safetensors header (8-byte length first)", file=file)
        (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        if length > MAX_HEADER_BYTES:
            raise InputError(f"header length {length:,} exceeds {MAX_HEADER_BYTES:,} bytes", file=file)
        if 8 + length > size:
            raise InputError(f"header length {length:,} runs past the end of the {size:,}-byte file (truncated?)",
                             file=file)
        raw = os.pread(fd, length, 8)
    except OSError as exc:
        raise InputError(f"cannot read the shard: {exc.strerror}", file=file) from None
    finally:
        os.close(fd)
    if len(raw) != length:
        raise InputError("the file shrank while its header was read", file=file)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("the header is not UTF-8 JSON", file=file) from None
    header = parse_json(text.rstrip(" "), f"{file} (header)", what="safetensors header").data
    if not isinstance(header, dict):
        raise InputError("the header is not a JSON object", file=file)
    return _check_header(header, file, size - 8 - length)


def _check_header(header: dict, file: str, data_bytes: int) -> dict[str, int]:
    out: dict[str, int] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise InputError("__metadata__ must map names to strings", file=file, field="__metadata__")
            continue
        if not isinstance(info, dict):
            raise InputError("expected {dtype, shape, data_offsets}", file=file, field=name)
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise InputError(f"unknown dtype {dtype!r}", file=file, field=name)
        if not isinstance(shape, list) or len(shape) > 8 or \
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape):
            raise InputError(f"shape {shape!r} is not a list of non-negative integers", file=file, field=name)
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise InputError(f"data_offsets {offsets!r} is not [begin, end]", file=file, field=name)
        begin, end = offsets
        if not 0 <= begin <= end:
            raise InputError(f"data_offsets [{begin}, {end}] are reversed or negative", file=file, field=name)
        if end > data_bytes:
            raise InputError(f"data_offsets end {end:,} lies past the {data_bytes:,} bytes of data the file holds "
                             "(truncated shard?)", file=file, field=name)
        numel = 1
        for d in shape:
            numel *= d
        bits = numel * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != end - begin:
            raise InputError(f"{dtype} {shape} is {bits / 8:,g} bytes, its byte range holds {end - begin:,}",
                             file=file, field=name)
        out[name] = end - begin
        ranges.append((begin, end, name))
    ranges.sort()
    at = 0
    for begin, end, name in ranges:
        if begin < at:
            raise InputError(f"byte range [{begin:,}, {end:,}) overlaps the previous tensor's (ends at {at:,})",
                             file=file, field=name)
        if begin > at:
            raise InputError(f"{begin - at:,} bytes before this tensor belong to no tensor (a hole at {at:,})",
                             file=file, field=name)
        at = end
    if at != data_bytes:
        raise InputError(f"the header's tensors cover {at:,} of the {data_bytes:,} data bytes the file holds",
                         file=file)
    return out
