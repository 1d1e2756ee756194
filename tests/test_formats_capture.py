"""Capture readers: vLLM routed_experts (base64 .npy) and raw [tokens, layers, top_k] .npy."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import FormatError, HistogramAccumulator, decode_routed_experts, histogram_from_captures


def _b64(array: np.ndarray) -> str:
    # exactly vLLM's vllm/utils/serial_utils.py::numpy2base64
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(buf.getbuffer()).decode("ascii")


# 3 tokens, 2 layers, top-2, 4 experts; hand counts below
IDS = np.array([[[0, 1], [2, 3]],
                [[0, 2], [2, 1]],
                [[3, 0], [2, 0]]], dtype=np.uint8)
HAND = [[3, 1, 1, 1],   # layer 0: 0 x3, 1, 2, 3
        [1, 1, 3, 1]]   # layer 1: 2 x3, 3, 1, 0


def test_decode_routed_experts() -> None:
    out = decode_routed_experts(_b64(IDS))
    assert out.dtype == np.uint8 and out.tolist() == IDS.tolist()
    with pytest.raises(FormatError, match="not valid base64"):
        decode_routed_experts("@@@")
    with pytest.raises(FormatError, match="not a .npy"):
        decode_routed_experts(base64.b64encode(b"hello").decode())
    with pytest.raises(FormatError, match="expected \\(tokens, layers, top_k\\)"):
        decode_routed_experts(_b64(np.zeros((2, 3), dtype=np.uint8)))


def test_accumulator_hand_counts() -> None:
    acc = HistogramAccumulator((0, 1), 4)
    acc.add(IDS)
    h = acc.histogram(source="t")
    assert h.counts.tolist() == HAND and h.tokens == 3 and h.top_k == 2


def test_accumulator_selects_moe_columns_of_all_layers() -> None:
    # a model whose decoder layer 0 is dense: capture has 3 layer columns, MoE layers are 1, 2
    ids = np.concatenate([np.zeros((3, 1, 2), dtype=np.uint8), IDS], axis=1)
    acc = HistogramAccumulator((1, 2), 4)
    acc.add(ids)
    assert acc.counts.tolist() == HAND
    with pytest.raises(FormatError, match="capture has 2 layers"):
        HistogramAccumulator((1, 5, 6), 4).add(IDS)


def test_accumulator_refuses_bad_ids() -> None:
    with pytest.raises(FormatError, match="expert id 4 out of range"):
        HistogramAccumulator((0, 1), 4).add(IDS + 1)
    acc = HistogramAccumulator((0, 1), 4)
    acc.add(IDS)
    with pytest.raises(FormatError, match="top_k 1 differs"):
        acc.add(IDS[:, :, :1])


def test_raw_npy_streamed_in_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 384, size=(1000, 40, 6), dtype=np.uint16)
    np.save(tmp_path / "cap.npy", ids)
    calls: list[tuple[int, int]] = []
    h = histogram_from_captures([tmp_path / "cap.npy"], moe_layer_indices=range(40),
                                num_experts=384, chunk_tokens=128,
                                progress=lambda d, t: calls.append((d, t)))
    expected = np.zeros((40, 384), dtype=np.int64)
    for layer in range(40):
        expected[layer] = np.bincount(ids[:, layer, :].ravel(), minlength=384)
    assert (h.counts == expected).all() and h.tokens == 1000 and h.selections == 240_000
    assert len(calls) >= 8 and calls[-1][0] == calls[-1][1]


def test_vllm_response_files(tmp_path: Path) -> None:
    half_a, half_b = IDS[:2], IDS[2:]
    completion = {"object": "text_completion",
                  "choices": [{"index": 0, "text": "x", "routed_experts": _b64(half_a)}]}
    chat = {"object": "chat.completion",
            "choices": [{"index": 0, "message": {}, "routed_experts": _b64(half_b)}]}
    aborted = {"object": "chat.completion", "choices": [{"index": 0, "routed_experts": None}]}
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(d) for d in
                                                (completion, chat, aborted)) + "\n")
    (tmp_path / "r.json").write_text(json.dumps([completion, chat]))
    (tmp_path / "r.b64").write_text(_b64(half_a) + "\n" + _b64(half_b) + "\n")
    for name in ("r.jsonl", "r.json", "r.b64"):
        h = histogram_from_captures([tmp_path / name], moe_layer_indices=(0, 1), num_experts=4)
        assert h.counts.tolist() == HAND, name
        assert h.tokens == 3


def test_mixed_sources_add_up(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", IDS)
    (tmp_path / "b.b64").write_text(_b64(IDS) + "\n")
    h = histogram_from_captures([tmp_path / "a.npy", tmp_path / "b.b64"],
                                moe_layer_indices=(0, 1), num_experts=4)
    assert h.counts.tolist() == (2 * np.array(HAND)).tolist() and h.tokens == 6


def test_bad_capture_files(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"choices": [{"text": "no capture"}]}\n')
    with pytest.raises(FormatError, match="enable-return-routed-experts") as info:
        histogram_from_captures([tmp_path / "x.jsonl"], moe_layer_indices=(0, 1), num_experts=4)
    assert info.value.line == 1
    (tmp_path / "y.jsonl").write_text('{"choices": [\n')
    with pytest.raises(FormatError, match="not valid JSON"):
        histogram_from_captures([tmp_path / "y.jsonl"], moe_layer_indices=(0, 1), num_experts=4)
    np.save(tmp_path / "z.npy", np.zeros((4, 2), dtype=np.uint8))
    with pytest.raises(FormatError, match="expected \\(tokens, layers, top_k\\)"):
        histogram_from_captures([tmp_path / "z.npy"], moe_layer_indices=(0, 1), num_experts=4)
    with pytest.raises(FormatError, match="no such file"):
        histogram_from_captures([tmp_path / "none.npy"], moe_layer_indices=(0,), num_experts=4)
    (tmp_path / "t.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(FormatError, match="not a readable .npy"):
        histogram_from_captures([tmp_path / "t.npy"], moe_layer_indices=(0,), num_experts=4)


def test_formats_module_is_dependency_free() -> None:
    """The serving container has no recipegen, click, pydantic (and formats needs no torch)."""
    import subprocess
    import sys
    code = ("import sys, expert_residency.formats as f; "
            "bad = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'recipegen', 'click', 'pydantic', 'torch', 'rich', 'yaml', 'ruamel'}); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _resp(ids: np.ndarray, **usage: int) -> dict:
    return {"object": "chat.completion", "usage": dict(usage),
            "choices": [{"index": 0, "routed_experts": _b64(ids)}]}


def test_prefill_decode_split_from_usage(tmp_path: Path) -> None:
    # prompt 3 tokens, 2 output tokens: rows = 3 + 2 - 1 = 4 -> 3 prefill rows, 1 decode row
    ids = np.concatenate([IDS, IDS[:1]])  # 4 rows; the decode row is IDS[0]
    (tmp_path / "r.jsonl").write_text(json.dumps(_resp(ids, prompt_tokens=3,
                                                       completion_tokens=2)) + "\n")
    h = histogram_from_captures([tmp_path / "r.jsonl"], moe_layer_indices=(0, 1), num_experts=4)
    assert (h.tokens, h.prefill_tokens, h.decode_tokens) == (4, 3, 1)
    d = histogram_from_captures([tmp_path / "r.jsonl"], moe_layer_indices=(0, 1), num_experts=4,
                                decode_only=True)
    # only row IDS[0] = [[0, 1], [2, 3]]
    assert d.counts.tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]
    assert (d.tokens, d.decode_tokens, d.prefill_tokens) == (1, 1, 0)
    assert d.meta["decode_only"] is True


def test_prompt_start_and_per_choice_token_ids(tmp_path: Path) -> None:
    # routed_experts_prompt_start skipped 2 of 3 prompt rows: 1 prompt row + (3 - 1) decode rows
    a = {"usage": {"prompt_tokens": 3, "completion_tokens": 3},
         "choices": [{"routed_experts": _b64(IDS)}]}
    # two choices: per-choice token_ids tell each one's output length
    b = {"usage": {"prompt_tokens": 1, "completion_tokens": 5},
         "choices": [{"routed_experts": _b64(IDS[:2]), "token_ids": [5, 6]},
                     {"routed_experts": _b64(IDS), "token_ids": [7, 8, 9]}]}
    (tmp_path / "r.json").write_text(json.dumps([a, b]))
    h = histogram_from_captures([tmp_path / "r.json"], moe_layer_indices=(0, 1), num_experts=4)
    # a: 3 rows = 1 prefill + 2 decode; b0: 2 rows = 1 + 1; b1: 3 rows = 1 + 2
    assert (h.prefill_tokens, h.decode_tokens, h.tokens) == (3, 5, 8)


def test_unknown_split_stays_unknown_and_decode_only_refuses(tmp_path: Path) -> None:
    (tmp_path / "r.b64").write_text(_b64(IDS) + "\n")
    h = histogram_from_captures([tmp_path / "r.b64"], moe_layer_indices=(0, 1), num_experts=4)
    assert h.decode_tokens is None and h.prefill_tokens is None
    with pytest.raises(FormatError, match="cannot tell prompt rows from decode rows") as info:
        histogram_from_captures([tmp_path / "r.b64"], moe_layer_indices=(0, 1), num_experts=4,
                                decode_only=True)
    assert info.value.line == 1
    # counts that do not fit (more rows than prompt + output - 1) are not guessed at
    (tmp_path / "bad.jsonl").write_text(json.dumps(_resp(IDS, prompt_tokens=1,
                                                         completion_tokens=1)) + "\n")
    h = histogram_from_captures([tmp_path / "bad.jsonl"], moe_layer_indices=(0, 1),
                                num_experts=4)
    assert h.decode_tokens is None
    np.save(tmp_path / "raw.npy", IDS)
    with pytest.raises(FormatError, match="raw .npy capture carries no prompt/decode split"):
        histogram_from_captures([tmp_path / "raw.npy"], moe_layer_indices=(0, 1), num_experts=4,
                                decode_only=True)
