"""The step masks' one-launch Triton refresh, compiled, on a CUDA GPU (the H200): == the torch
path bit for bit (whole ``valid`` buffer and decode count) on the CPU test's cases
(tests/test_step_masks_kernel.py), from vLLM-shaped forward contexts too, with
``torch.cuda.set_sync_debug_mode("error")`` around every kernel refresh (no host sync).

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu/test_step_masks_gpu.py -q``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the compiled kernel)", allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))

from expert_residency.vllm_plugin.step_masks import StepMasks  # noqa: E402
from plugin_entry_support import step_context  # noqa: E402
from test_step_masks_kernel import cases  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _both(max_tokens: int):
    ref, new = StepMasks(max_tokens, DEV, kernel=False), StepMasks(max_tokens, DEV)
    assert ref._refresh is None and new._refresh is not None, "CUDA defaults to the kernel"
    new._update_torch = _forbidden  # every refresh below must take the kernel
    return ref, new


def _forbidden(*args, **kwargs):
    raise AssertionError("the torch path ran where the kernel should have")


def test_compiled_refresh_equals_the_torch_path() -> None:
    gen = torch.Generator().manual_seed(1)
    checked = 0
    for max_tokens, with_rows in ((m, w) for m in (1, 16, 2500, 8192) for w in (False, True)):
        ref, new = _both(max_tokens)
        if with_rows:   # adaptive residency's decode-only ranking: the decode rows too
            for m in (ref, new):
                m.enable_decode_rows()
        for rows, pad, actual, qsl in cases(max_tokens, gen):
            pad = pad.to(DEV) if pad is not None else None
            qsl = qsl.to(DEV) if qsl is not None else None
            garbage = (torch.rand(max_tokens, generator=gen) < 0.5).to(DEV)
            ref.valid.copy_(garbage)
            new.valid.copy_(garbage)
            ref.decode_count.fill_(12345)
            new.decode_count.fill_(12345)
            for m in (ref, new):
                if with_rows:
                    m._decode_rows.copy_(torch.cat([garbage, garbage[:1]]))
                    m.decode_step.fill_(7)
            ref.update(rows, is_padding=pad, num_actual_tokens=actual, query_start_loc=qsl)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                new.update(rows, is_padding=pad, num_actual_tokens=actual, query_start_loc=qsl)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert torch.equal(new._valid, ref._valid), (max_tokens, rows, actual)
            assert torch.equal(new.decode_count, ref.decode_count), (max_tokens, rows, actual)
            if with_rows:
                assert torch.equal(new._decode_rows, ref._decode_rows), (max_tokens, rows, actual)
                assert torch.equal(new.decode_step, ref.decode_step), (max_tokens, rows, actual)
            checked += 1
    assert checked == 2 * 5 * (3 + 5 + 5 + 5)


def test_compiled_refresh_from_forward_contexts() -> None:
    ref, new = _both(64)
    for m in (ref, new):
        m.enable_decode_rows()
    for rows, lengths in ((16, [1, 1, 1]), (16, [4, 1, 1, 6]), (16, [1] * 9), (64, [1, 7, 1, 1, 1, 1]),
                          (8, [])):
        ctx = step_context(rows, lengths, DEV)
        ref.update_from_context(ctx)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            new.update_from_context(ctx)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(new._valid, ref._valid)
        assert int(new.decode_count) == int(ref.decode_count) == sum(1 for n in lengths if n == 1)
        assert int(new.valid.sum()) == sum(lengths)
        assert torch.equal(new._decode_rows, ref._decode_rows)
        assert int(new.decode_rows.sum()) == int(new.decode_count)
        assert int(new.decode_step) == int(bool(lengths) and all(n == 1 for n in lengths))
    new.update_from_context(type("Ctx", (), {"attn_metadata": None})())
    assert not new._valid.any() and int(new.decode_count) == 0
