"""Routing captures → histograms, streamed in chunks.

Two capture sources:

* vLLM's routed-experts capture (`--enable-return-routed-experts`, vLLM 0.33
  `vllm/entrypoints/openai/completion/protocol.py` and `.../chat_completion/protocol.py`,
  field `routed_experts` of each choice; encoded by `vllm/utils/serial_utils.py::numpy2base64`):
  base64 of `.npy` bytes, shape `(num_tokens - 1, num_layers, top_k)`, dtype uint8 when the
  model has ≤ 256 experts else uint16 (int32 accepted). The layer axis is indexed by the
  router's `layer_id` over all decoder layers
  (`vllm/model_executor/layers/fused_moe/routed_experts_capturer.py`). Ids are logical.
  Files: a response JSON object, a JSON list of responses, JSON Lines (one response per
  line), or a text file holding one bare base64 string per line.
* Raw arrays: a `.npy` file of shape `[tokens, layers, top_k]` with integer ids,
  memory-mapped and reduced chunk by chunk.

Layer axis: if it has as many entries as the histogram's MoE layers, entry i is MoE layer i;
otherwise it must cover every MoE layer index (entry = decoder layer index), and only the
MoE layers' columns are counted (dense layers carry no routing).

Shapes are checked before anything is allocated from them or read (docs/formats.md, "Checked from
the header"): a `routed_experts` `.npy` header must describe exactly the bytes after it; top_k is
from 1 to num_experts and the layer axis fits the geometry, from a raw `.npy`'s header before its
first chunk; at most 2^23 ids are converted to int64 at a time.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._io import UnreadableFile, open_regular_file
from .errors import FormatError
from .histogram import Histogram

ProgressFn = Callable[[int, int], None]  # (units done, units total)

DEFAULT_CHUNK_TOKENS = 1 << 14  # ~30 MB of int64 work arrays per chunk at 40 × top-6
# At most this many ids are converted to int64 at once (64 MiB), whatever a capture's shape:
# chunks and steps shrink to fit, down to one token.
_WORK_ITEMS = 1 << 23


def decode_routed_experts(b64: str, *, path: str | os.PathLike[str] | None = None,
                          line: int | None = None) -> np.ndarray:
    """vLLM's `routed_experts` string → array `(tokens, layers, top_k)`.

    The `.npy` header is read first and must describe exactly the bytes after it (a 3-D integer
    array of `tokens × layers × top_k` items): a header declaring a larger array than the
    string holds is refused before anything is allocated for it."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError("routed_experts is not valid base64", path=path, line=line,
                          field="routed_experts") from None
    buffer = io.BytesIO(raw)
    _npy_header(buffer, path=path, line=line)  # before np.load allocates what it declares
    buffer.seek(0)
    try:
        array = np.load(buffer, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(f"routed_experts is not a .npy array ({exc})", path=path, line=line,
                          field="routed_experts") from None
    return _check_capture_array(array, path=path, line=line, field="routed_experts")


def _npy_header(buffer: io.BytesIO, *, path: Any, line: int | None
                ) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of the `.npy` bytes in `buffer`, checked against the bytes that follow the
    header: a 3-D integer array whose `tokens × layers × top_k × itemsize` is exactly their
    count. Read with numpy's own header parser (bounded header size), nothing allocated."""
    from numpy.lib import format as npy_format

    def refuse(reason: str) -> FormatError:
        return FormatError(f"routed_experts is not a .npy array ({reason})", path=path, line=line,
                           field="routed_experts")

    try:
        version = npy_format.read_magic(buffer)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(buffer)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(buffer)
        else:
            raise refuse(f"unsupported .npy format version {version[0]}.{version[1]}")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise refuse(str(exc)) from None
    if len(shape) != 3 or any(int(n) < 0 for n in shape):
        raise FormatError(f"capture has shape {shape}, expected (tokens, layers, top_k)",
                          path=path, line=line, field="routed_experts")
    if dtype.kind not in "iu":
        raise FormatError(f"capture dtype {dtype} is not an integer type", path=path, line=line,
                          field="routed_experts")
    declared = math.prod(int(n) for n in shape) * dtype.itemsize  # Python ints: no overflow
    present = len(buffer.getbuffer()) - buffer.tell()
    if declared != present:
        raise FormatError(f"the .npy header declares shape {shape} of {dtype} ({declared:,} "
                          f"bytes) but {present:,} bytes follow it", path=path, line=line,
                          field="routed_experts")
    return tuple(int(n) for n in shape), dtype


def _check_capture_array(array: np.ndarray, *, path: Any = None, line: int | None = None,
                         field: str | None = None) -> np.ndarray:
    if array.ndim != 3:
        raise FormatError(f"capture has shape {array.shape}, expected (tokens, layers, top_k)",
                          path=path, line=line, field=field)
    if not np.issubdtype(array.dtype, np.integer):
        raise FormatError(f"capture dtype {array.dtype} is not an integer type", path=path,
                          line=line, field=field)
    return array


class HistogramAccumulator:
    """Adds `(tokens, layers, top_k)` id arrays into `[moe layers, experts]` counts."""

    def __init__(self, moe_layer_indices: Sequence[int], num_experts: int) -> None:
        from ._io import MAX_EXPERTS, MAX_LAYERS

        if not 0 < int(num_experts) <= MAX_EXPERTS or not 0 < len(moe_layer_indices) <= MAX_LAYERS:
            raise FormatError(f"geometry out of bounds: {len(moe_layer_indices)} layers x "
                              f"{num_experts} experts (at most {MAX_LAYERS} x {MAX_EXPERTS})",
                              field="num_experts")
        self.moe_layer_indices = tuple(int(i) for i in moe_layer_indices)
        self.num_experts = int(num_experts)
        self.counts = np.zeros((len(self.moe_layer_indices), self.num_experts), dtype=np.int64)
        self.tokens = 0
        self.top_k: int | None = None
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.split_known = True  # every add so far said how many rows were prompt rows
        n = len(self.moe_layer_indices)
        self._offsets = (np.arange(n, dtype=np.int64) * self.num_experts)[None, :, None]

    def _columns(self, num_capture_layers: int, path: Any, line: int | None = None
                 ) -> np.ndarray | slice:
        from ._io import MAX_LAYER_INDEX

        if num_capture_layers == len(self.moe_layer_indices):
            return slice(None)
        if max(self.moe_layer_indices) < num_capture_layers <= MAX_LAYER_INDEX + 1:
            return np.asarray(self.moe_layer_indices, dtype=np.int64)
        if num_capture_layers > MAX_LAYER_INDEX + 1:
            raise FormatError(f"capture has {num_capture_layers:,} layers, more than the "
                              f"{MAX_LAYER_INDEX + 1:,} any model's layer indices reach",
                              path=path, line=line, field="layers")
        raise FormatError(f"capture has {num_capture_layers} layers; the model has "
                          f"{len(self.moe_layer_indices)} MoE layers up to index "
                          f"{max(self.moe_layer_indices)}", path=path, line=line, field="layers")

    def check_shape(self, shape: Sequence[int], *, path: Any = None, line: int | None = None
                    ) -> np.ndarray | slice:
        """The layer columns of a `(tokens, layers, top_k)` capture that hold the MoE layers,
        once its shape fits the geometry: top_k from 1 to num_experts (a token picks an expert
        at most once) and a layer axis of the MoE layers or of every decoder layer. Checked
        from the shape alone, before any of the capture is read or converted."""
        if len(shape) != 3:
            raise FormatError(f"capture has shape {tuple(shape)}, expected (tokens, layers, "
                              "top_k)", path=path, line=line)
        top_k = int(shape[2])
        if not 1 <= top_k <= self.num_experts:
            raise FormatError(f"capture has top_k {top_k:,} (shape {tuple(int(n) for n in shape)}); "
                              f"a token picks from 1 to num_experts ({self.num_experts}) experts",
                              path=path, line=line, field="top_k")
        return self._columns(int(shape[1]), path, line)

    def add(self, ids: np.ndarray, *, prefill_rows: int | None = None,
            decode_only: bool = False, path: Any = None, line: int | None = None) -> None:
        """Count `(tokens, layers, top_k)` ids; the first `prefill_rows` rows are prompt rows
        (None: unknown). With `decode_only`, prompt rows are skipped — unknown is an error."""
        ids = _check_capture_array(np.asarray(ids), path=path, line=line)
        columns = self.check_shape(ids.shape, path=path, line=line)
        if prefill_rows is not None and not 0 <= prefill_rows <= ids.shape[0]:
            raise FormatError(f"prefill rows {prefill_rows} outside 0..{ids.shape[0]}",
                              path=path, line=line)
        if decode_only:
            if prefill_rows is None:
                raise FormatError("cannot tell prompt rows from decode rows here (needs vLLM "
                                  "responses with usage or token_ids); drop --decode-only",
                                  path=path, line=line, field="routed_experts")
            ids, prefill_rows = ids[prefill_rows:], 0
        if prefill_rows is None:
            self.split_known = False
        else:
            self.prefill_tokens += prefill_rows
            self.decode_tokens += int(ids.shape[0]) - prefill_rows
        if ids.shape[0] == 0:
            return
        if self.top_k is None:
            self.top_k = int(ids.shape[2])
        elif ids.shape[2] != self.top_k:
            raise FormatError(f"top_k {ids.shape[2]} differs from earlier captures "
                              f"({self.top_k})", path=path, line=line, field="top_k")
        rows = int(ids.shape[0])
        step = max(1, _WORK_ITEMS // (len(self.moe_layer_indices) * self.top_k))
        # every id is checked before any is counted: a refused capture leaves the counts as
        # they were (min/max in the capture's own dtype: no int64 copy, no wrap-around)
        for start in range(0, rows, step):
            part = ids[start:start + step, columns, :]
            lo, hi = int(part.min()), int(part.max())
            if lo < 0 or hi >= self.num_experts:
                bad = lo if lo < 0 else hi
                raise FormatError(f"expert id {bad} out of range 0..{self.num_experts - 1}",
                                  path=path, line=line, field="ids")
        for start in range(0, rows, step):
            picked = ids[start:start + step, columns, :].astype(np.int64)
            flat = (picked + self._offsets).ravel()
            self.counts += np.bincount(flat, minlength=self.counts.size).reshape(self.counts.shape)
        self.tokens += rows

    def histogram(self, *, source: str, model_revision: str = "",
                  meta: dict[str, Any] | None = None) -> Histogram:
        known = self.split_known and self.tokens > 0
        return Histogram(self.moe_layer_indices, self.num_experts, self.counts.copy(),
                         self.tokens, source=source, model_revision=model_revision,
                         top_k=self.top_k, meta=dict(meta or {}),
                         decode_tokens=self.decode_tokens if known else None,
                         prefill_tokens=self.prefill_tokens if known else None)


def iter_npy_chunks(path: str | os.PathLike[str], chunk_tokens: int = DEFAULT_CHUNK_TOKENS, *,
                    columns_for: Callable[[tuple[int, ...]], np.ndarray | slice] | None = None
                    ) -> Iterator[tuple[np.ndarray, int, int]]:
    """(chunk, tokens done, tokens total) over a raw `[tokens, layers, top_k]` `.npy`.

    `columns_for(shape)` (e.g. `HistogramAccumulator.check_shape`) checks the header's shape
    before any chunk is read and picks the layer columns each chunk keeps; a chunk holds at most
    `chunk_tokens` tokens and, past one token, no more than 2^23 ids."""
    try:
        _check_regular(path)
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise FormatError("no such file", path=path) from None
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(f"not a readable .npy array ({exc})", path=path) from None
    array = _check_capture_array(array, path=path)
    columns = columns_for(array.shape) if columns_for is not None else slice(None)
    layers = int(array.shape[1]) if isinstance(columns, slice) else len(columns)
    step = max(1, min(int(chunk_tokens), _WORK_ITEMS // max(1, layers * int(array.shape[2]))))
    total = int(array.shape[0])
    for start in range(0, total, step):
        stop = min(start + step, total)
        chunk = array[start:stop] if isinstance(columns, slice) else array[start:stop, columns, :]
        yield np.asarray(chunk), stop, total


def iter_vllm_capture(path: str | os.PathLike[str]
                      ) -> Iterator[tuple[np.ndarray, int | None, int | None, int, int]]:
    """(ids, prefill rows, line, bytes done, bytes total) for every `routed_experts` in a vLLM
    capture file. Prefill rows is None when the response does not tell (see `_prefill_rows`)."""
    try:
        yield from _iter_vllm_capture(path)
    except UnicodeDecodeError:
        raise FormatError("neither UTF-8 text (vLLM responses, base64 lines) nor a .npy array",
                          path=path) from None


def _iter_vllm_capture(path: str | os.PathLike[str]
                       ) -> Iterator[tuple[np.ndarray, int | None, int | None, int, int]]:
    p = Path(path)
    try:
        fd = open_regular_file(p)  # a FIFO or device is refused, not waited on
        total = os.fstat(fd).st_size
        handle = os.fdopen(fd, "r", encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("no such file", path=path) from None
    except OSError as exc:
        raise FormatError(f"cannot read ({exc.strerror})", path=path) from None
    with handle:
        first = handle.read(1)
        while first and first.isspace():
            first = handle.read(1)
        handle.seek(0)
        if first == "[" or (first == "{" and p.suffix == ".json"):
            doc = _json(handle.read(), path, None)
            docs = doc if isinstance(doc, list) else [doc]
            for doc_item in docs:
                for b64, prompt, output in _routed_experts_entries(doc_item, path, None):
                    ids = decode_routed_experts(b64, path=path)
                    yield ids, _prefill_rows(len(ids), prompt, output), None, total, total
            return
        done = 0
        for lineno, text in enumerate(handle, start=1):
            done += len(text.encode("utf-8"))
            stripped = text.strip()
            if not stripped:
                continue
            if stripped.startswith("{"):
                doc = _json(stripped, path, lineno)
                for b64, prompt, output in _routed_experts_entries(doc, path, lineno):
                    ids = decode_routed_experts(b64, path=path, line=lineno)
                    yield ids, _prefill_rows(len(ids), prompt, output), lineno, done, total
            else:
                ids = decode_routed_experts(stripped, path=path, line=lineno)
                yield ids, None, lineno, done, total


# A JSON integer in a response is a token count or an id: 19 digits hold any int64. Longer ones
# are refused before Python converts them (past 4,300 digits the conversion itself raises).
_MAX_INT_DIGITS = 19


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json(text: str, path: Any, line: int | None) -> Any:
    """One strict JSON document (bounded integers, no NaN/Infinity) or FormatError with its line."""
    try:
        return json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FormatError(f"not valid JSON ({exc.msg})", path=path,
                          line=line if line is not None else exc.lineno) from None
    except RecursionError:
        raise FormatError("JSON nested too deeply", path=path, line=line) from None
    except ValueError as exc:  # from parse_int / parse_constant
        raise FormatError(f"not a capture value ({exc})", path=path, line=line) from None


def _check_regular(path: str | os.PathLike[str]) -> None:
    try:
        os.close(open_regular_file(path))
    except UnreadableFile as exc:
        raise FormatError(f"{exc.strerror}: not a capture file", path=path) from None


def _prefill_rows(rows: int, prompt_tokens: int | None, output_tokens: int | None) -> int | None:
    """How many leading rows of a response's capture belong to the prompt.

    vLLM returns one row per forwarded token: the prompt (minus any
    `routed_experts_prompt_start` rows skipped at its start) and every output token but the
    last, which was sampled and never forwarded. So the last `output_tokens - 1` rows are
    decode rows and the rest prefill; None when the counts are unknown or do not fit.
    """
    if output_tokens is None or output_tokens < 1:
        return None
    prefill = rows - (output_tokens - 1)
    if prefill < 0 or (prompt_tokens is not None and prefill > prompt_tokens):
        return None
    return prefill


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _routed_experts_entries(doc: Any, path: Any, line: int | None
                            ) -> list[tuple[str, int | None, int | None]]:
    """(`routed_experts`, prompt tokens, output tokens) per choice of a completion / chat
    response, or of a bare object; token counts None where the response does not carry them
    (per-choice `token_ids` / `prompt_token_ids` with `return_token_ids`, else `usage` when the
    response has one choice)."""
    if not isinstance(doc, dict):
        raise FormatError("expected a response object", path=path, line=line)
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    raw_choices = doc.get("choices")
    if raw_choices is not None and not isinstance(raw_choices, list):
        raise FormatError(f"'choices' is a {type(raw_choices).__name__}, not a list of choices",
                          path=path, line=line, field="choices")
    choices = [c for c in (raw_choices or []) if isinstance(c, dict)]
    doc_prompt = (len(doc["prompt_token_ids"]) if isinstance(doc.get("prompt_token_ids"), list)
                  else _int_or_none(usage.get("prompt_tokens")))
    found: list[tuple[str, int | None, int | None]] = []
    if isinstance(doc.get("routed_experts"), str):
        found.append((doc["routed_experts"], doc_prompt,
                      _int_or_none(usage.get("completion_tokens"))))
    for choice in choices:
        if not isinstance(choice.get("routed_experts"), str):
            continue
        prompt = (len(choice["prompt_token_ids"]) if isinstance(choice.get("prompt_token_ids"),
                                                                list) else doc_prompt)
        if isinstance(choice.get("token_ids"), list):
            output = len(choice["token_ids"])
        elif len(choices) == 1:
            output = _int_or_none(usage.get("completion_tokens"))
        else:
            output = None
        found.append((choice["routed_experts"], prompt, output))
    if not found and "routed_experts" not in doc and not any(
            "routed_experts" in c for c in choices):
        raise FormatError("response has no routed_experts (was the server started with "
                          "--enable-return-routed-experts?)", path=path, line=line,
                          field="routed_experts")
    return found  # a null routed_experts (aborted request) contributes nothing


def capture_kind(path: str | os.PathLike[str]) -> str:
    """'npy' for raw arrays, 'vllm' for response files / base64 lines."""
    _check_regular(path)
    with open(path, "rb") as handle:
        magic = handle.read(6)
    return "npy" if magic == b"\x93NUMPY" else "vllm"


def histogram_from_captures(paths: Sequence[str | os.PathLike[str]], *,
                            moe_layer_indices: Sequence[int], num_experts: int,
                            source: str | None = None, model_revision: str = "",
                            chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                            progress: ProgressFn | None = None,
                            meta: dict[str, Any] | None = None,
                            decode_only: bool = False) -> Histogram:
    """Reduce capture files (raw `.npy` or vLLM responses, mixed) into one histogram.

    `progress(done, total)` is called after every chunk; units are bytes of input.
    `decode_only` counts only decode rows (vLLM responses that carry token counts); the
    histogram's decode/prefill split is filled in whenever every response tells it.
    """
    acc = HistogramAccumulator(moe_layer_indices, num_experts)
    sizes = []
    for path in paths:
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            raise FormatError("no such file", path=path) from None
    grand_total, base = sum(sizes), 0
    for path, size in zip(paths, sizes):
        if capture_kind(path) == "npy":
            if decode_only:
                raise FormatError("a raw .npy capture carries no prompt/decode split; "
                                  "drop --decode-only or capture decode rows only", path=path)
            for chunk, done, total in iter_npy_chunks(
                    path, chunk_tokens,
                    columns_for=lambda shape, path=path: acc.check_shape(shape, path=path)):
                acc.add(chunk, path=path)
                if progress:
                    progress(base + (size * done // total if total else size), grand_total)
        else:
            entries = 0
            for ids, prefill, line, done, total in iter_vllm_capture(path):
                entries += 1
                acc.add(ids, prefill_rows=prefill, decode_only=decode_only, path=path, line=line)
                if progress:
                    progress(base + (size * done // total if total else size), grand_total)
            if not entries:
                raise FormatError("holds no routed_experts at all (empty capture file?)",
                                  path=path)
        base += size
        if progress:
            progress(base, grand_total)
    meta = dict(meta or {})
    if decode_only:
        meta["decode_only"] = True
    if not paths:
        raise FormatError("no capture files")
    hist = acc.histogram(source=source or "capture: " + ", ".join(
        os.path.basename(str(p)) for p in paths), model_revision=model_revision, meta=meta)
    if hist.tokens == 0:
        # a zero-token histogram would build a row map from nothing
        raise FormatError("the captures hold no tokens" + (" in decode" if decode_only else ""),
                          path=paths[0] if len(paths) == 1 else None)
    return hist
