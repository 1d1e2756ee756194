"""Shared file formats of the expert residency runtime (standard library + numpy only).

- `RowMap`, `load_rowmap`, `save_rowmap`: per-layer hot/cold expert ids in bank row order.
- `Histogram`, `load_histogram`, `save_histogram`, `merge_histograms`: routing counts.
- `content_hash` / `shape_hash` (methods of RowMap; canonical encodings in `hashes`).
- `StartupReport`, `format_report_line`, `parse_report_line`, `find_report_lines`.
- Capture readers (vLLM `routed_experts` base64 `.npy`, raw `[tokens, layers, top_k]`
  `.npy`) in `capture`.
- `FormatError(ValueError)` with `path`, `line`, `field`.
- `atomic_write_text` / `atomic_write_bytes`: the one temp-file + rename writer (recipegen
  uses it too).

docs/formats.md documents every field and both hash encodings.
"""

from ._io import atomic_write_bytes, atomic_write_text
from .capture import (
    HistogramAccumulator,
    decode_routed_experts,
    histogram_from_captures,
    iter_npy_chunks,
    iter_vllm_capture,
)
from .errors import FormatError
from .histogram import (
    HISTOGRAM_VERSION,
    Histogram,
    format_histogram,
    load_histogram,
    merge_histograms,
    parse_histogram,
    save_histogram,
)
from .report import (
    MODES,
    REPORT_TAG,
    REPORT_VERSION,
    StartupReport,
    expand_counts,
    find_report_lines,
    format_report_line,
    parse_report_line,
    report_for_rowmap,
    summarize_counts,
)
from .rowmap import ROWMAP_VERSION, RowMap, format_rowmap, load_rowmap, parse_rowmap, save_rowmap, verify_content_hash

__all__ = [
    "atomic_write_bytes", "atomic_write_text",
    "FormatError", "HistogramAccumulator", "decode_routed_experts", "histogram_from_captures",
    "iter_npy_chunks", "iter_vllm_capture",
    "HISTOGRAM_VERSION", "Histogram", "format_histogram", "load_histogram", "merge_histograms",
    "parse_histogram", "save_histogram",
    "MODES", "REPORT_TAG", "REPORT_VERSION", "StartupReport", "expand_counts",
    "find_report_lines", "format_report_line", "parse_report_line", "report_for_rowmap",
    "summarize_counts",
    "ROWMAP_VERSION", "RowMap", "format_rowmap", "load_rowmap", "parse_rowmap", "save_rowmap",
    "verify_content_hash",
]
