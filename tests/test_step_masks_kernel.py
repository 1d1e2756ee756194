"""The step masks' one-launch Triton refresh (vllm_plugin/step_masks_kernel.py) == the torch path,
bit for bit, on CPU under ``TRITON_INTERPRET=1``: the whole ``valid`` and ``decode_rows`` buffers
(trailing slots included), the decode count and the decode-step flag, for real rows from ``is_padding``, from ``num_actual_tokens`` and
all rows; steps shorter than, equal to and longer than the buffers; zero-length and trailing padded
requests; more rows and more requests than one kernel block; no ``query_start_loc``; ``clear``.
Both instances start from the same garbage so every slot the kernel must write is checked.
The GPU runs the compiled kernel against the same reference (tests/gpu/test_step_masks_gpu.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from interpreter_rerun import rerun_interpreted  # noqa: E402

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs Triton for TRITON_INTERPRET=1")]


def _rerun_interpreted(test_id: str) -> bool:
    """This file's test ``test_id`` in a fresh ``TRITON_INTERPRET=1`` process when needed
    (``interpreter_rerun``)."""
    return rerun_interpreted(__file__, test_id)


def _requests(gen: torch.Generator, lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def cases(max_tokens: int, gen: torch.Generator):
    """(num_rows, is_padding, num_actual_tokens, query_start_loc) of a step."""
    for rows in sorted({1, 5, max(max_tokens - 1, 1), max_tokens, max_tokens + 7}):
        real = int(torch.randint(0, rows + 1, (1,), generator=gen))
        pad = torch.ones(rows, dtype=torch.bool)
        pad[:real] = False
        pad[torch.randint(0, rows, (max(rows // 9, 1),), generator=gen)] ^= True  # holes too
        lengths, left = [], min(rows, max_tokens)
        while left > 0:
            n = min(left, int(torch.randint(1, 4, (1,), generator=gen)) if len(lengths) % 3 else 1)
            lengths.append(n)
            left -= n
            if len(lengths) == 4:
                lengths.append(0)  # a zero-length request between real ones
        lengths += [0, 0]  # trailing padded (zero-length) requests start at the last row + 1
        qsl = _requests(gen, lengths)
        yield rows, pad, None, qsl
        yield rows, None, real, qsl
        yield rows, None, None, qsl
        yield rows, pad, None, None
        yield rows, None, real, None


def test_kernel_refresh_equals_the_torch_path() -> None:
    if _rerun_interpreted("test_kernel_refresh_equals_the_torch_path"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    from expert_residency.vllm_plugin.step_masks import StepMasks

    gen = torch.Generator().manual_seed(0)
    checked = 0
    for max_tokens in (1, 16, 2500):  # 2500 rows: three kernel blocks of 1024
        ref = StepMasks(max_tokens, "cpu", kernel=False)
        new = StepMasks(max_tokens, "cpu", kernel=True)
        for m in (ref, new):
            m.enable_decode_rows()
        assert ref._refresh is None and new._refresh is not None
        new._update_torch = None  # calling it would fail: every refresh must take the kernel
        for rows, pad, actual, qsl in cases(max_tokens, gen):
            garbage = torch.rand(max_tokens, generator=gen) < 0.5
            for m in (ref, new):
                m.valid.copy_(garbage)
                m._decode_rows.copy_(torch.cat([garbage, garbage[:1]]))
                m.decode_count.fill_(12345)
                m.decode_step.fill_(7)
                m.update(rows, is_padding=pad, num_actual_tokens=actual, query_start_loc=qsl)
            assert torch.equal(new._valid, ref._valid), (max_tokens, rows, actual)
            assert torch.equal(new.decode_count, ref.decode_count), (max_tokens, rows, actual)
            assert torch.equal(new._decode_rows, ref._decode_rows), (max_tokens, rows, actual)
            assert torch.equal(new.decode_step, ref.decode_step), (max_tokens, rows, actual)
            # the decode rows are the decode count's tokens, on real rows
            assert int(ref.decode_rows.sum()) == int(ref.decode_count)
            assert not (ref.decode_rows & ~ref.valid).any()
            assert new.decode_known == ref.decode_known
            checked += 1
        for m in (ref, new):
            m.valid.fill_(True)
            m.decode_rows.fill_(True)
            m.decode_count.fill_(3)
            m.decode_step.fill_(1)
            m.clear()
        assert not new._valid.any() and int(new.decode_count) == 0 and torch.equal(new._valid, ref._valid)
        assert not new._decode_rows.any() and int(new.decode_step) == 0 and int(ref.decode_step) == 0
    assert checked == 5 * (3 + 5 + 5)  # five input kinds × distinct step sizes per buffer size
    # Decode counting still means something: 1,500 one-token requests on real rows (two blocks of
    # requests), then the same on padded rows.
    m = StepMasks(2500, "cpu", kernel=True)
    m.enable_decode_rows()
    qsl = torch.arange(1501, dtype=torch.int32)
    m.update(1500, is_padding=torch.zeros(1500, dtype=torch.bool), query_start_loc=qsl)
    assert int(m.decode_count) == 1500 and int(m.valid.sum()) == 1500
    assert int(m.decode_rows.sum()) == 1500 and int(m.decode_step) == 1
    m.update(1500, is_padding=torch.ones(1500, dtype=torch.bool), query_start_loc=qsl)
    assert int(m.decode_count) == 0 and not m.valid.any() and not m.decode_rows.any()
    # by hand: a 3-token prefill chunk (rows 0-2), decode rows 3 and 5, a 0-length request, row 4
    # a 1-token request on a padded row, then padding: decode rows {3, 5}, not a decode-only step
    qsl = torch.tensor([0, 3, 4, 4, 5, 6, 6], dtype=torch.int32)
    pad = torch.tensor([False, False, False, False, True, False, True, True])
    for kernel in (True, False):
        m = StepMasks(16, "cpu", kernel=kernel)
        m.enable_decode_rows()
        m.update(8, is_padding=pad, query_start_loc=qsl)
        assert torch.nonzero(m.decode_rows).flatten().tolist() == [3, 5]
        assert int(m.decode_count) == 2 and int(m.decode_step) == 0
        # the same decode requests alone: a decode-only step
        m.update(8, is_padding=torch.tensor([True] * 3 + [False, True, False, True, True]), query_start_loc=qsl)
        assert torch.nonzero(m.decode_rows).flatten().tolist() == [3, 5] and int(m.decode_step) == 1
    # without decode rows (every lane but a decode-ranking adaptive one) the same valid rows and count
    # from the kernel, and nothing else allocated
    plain, rows = StepMasks(16, "cpu", kernel=True), StepMasks(16, "cpu", kernel=True)
    rows.enable_decode_rows()
    for m in (plain, rows):
        m.update(8, is_padding=pad, query_start_loc=qsl)
    assert torch.equal(plain._valid, rows._valid) and torch.equal(plain.decode_count, rows.decode_count)
    assert plain.decode_rows is None and plain.nbytes == StepMasks.bytes_for(16) == rows.nbytes - (16 + 1 + 8)


def test_cpu_masks_default_to_the_torch_path() -> None:
    from expert_residency.vllm_plugin.step_masks import StepMasks

    assert StepMasks(8, "cpu")._refresh is None
