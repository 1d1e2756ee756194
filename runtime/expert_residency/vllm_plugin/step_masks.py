"""Which rows of a step are real tokens, and which are decode tokens: device buffers, graph-safe.

vLLM replays CUDA graphs of padded batches: a captured MoE forward runs its Python once, at
capture, so a mask built in Python inside the forward would be a captured constant. The counter
therefore reads two **persistent device buffers** owned by this object, whose contents change
every step and whose addresses never do:

* ``valid [max_tokens] bool`` — True for the step's real tokens (not padding);
* ``decode_count [1] int64`` — the step's decode tokens: requests scheduled with exactly one new
  token on a real row (a verify window of speculative decoding has several, a prefill chunk
  many, a padded request none; capture dummies' one-token requests sit on padded rows), each
  contributing one token. The first counted MoE layer adds it to the counter
  inside the captured region (a drafter's forward context overwrites it, but no target layer
  runs in that forward);
* with ``enable_decode_rows()`` (adaptive residency's decode-only ranking; absent otherwise, so a
  lane without it allocates and refreshes exactly what it did before):
  ``decode_rows [max_tokens] bool`` — which rows those decode tokens are (the row of each
  one-token request), and ``decode_step [1] int64`` — 1 when the step has real rows and every one
  is a decode row (0 for a step with any prefill row, and without ``query_start_loc``).

They are filled by ``update_from_context`` when vLLM creates the step's forward context
(``forward_hook``: eager, before the model runs or a graph replays, on the step's stream), from
what vLLM 0.32/0.33 keep on the device for the step:

* ``ForwardContext.is_padding`` — a slice of the model runner's persistent ``is_padding`` buffer
  (V1 ``gpu_model_runner.py`` ``_prepare_padding_mask``, V2 ``input_batch.py``/``model_runner.py``)
  that vLLM's own DeepGEMM mega-MoE reads inside its captured MoE forward to skip padded rows
  (``fused_moe/deep_gemm_mega_moe.py``); tests/test_vllm_plugin_graphsafe_contracts.py pins it;
* the attention metadata's ``query_start_loc`` (device ``int32 [requests + 1]``, cumulative):
  a request's new tokens are one step of it.

A forward context without attention metadata (vLLM's memory-profiling run, warm-ups and capture
dummies) marks every row invalid: nothing is counted. All updates are device ops with fixed
output shapes: no host synchronisation, no host-to-device copy of step data.

On CUDA both buffers are refreshed by one Triton launch (``step_masks_kernel``) instead of the
torch path's small ops, whose host launch time was the refresh's whole cost; without a GPU
(or Triton, or with inputs the kernel does not take: not 1-D contiguous, another device) the
torch path runs. Both give the same buffers bit for bit (tests/test_step_masks_kernel.py).
"""

from __future__ import annotations

from typing import Any

import torch

from ..contract import sizing


class StepMasks:
    """The step's token mask and decode count (see the module docstring) for up to
    ``max_tokens`` rows."""

    def __init__(self, max_tokens: int, device: torch.device | str, *, kernel: bool | None = None) -> None:
        """``kernel``: refresh with the one-launch Triton kernel (None: on CUDA when Triton imports;
        True also runs it on CPU tensors under ``TRITON_INTERPRET=1``, for tests)."""
        self.max_tokens = int(max_tokens)
        self.device = torch.device(device)
        self._refresh = _kernel_refresh(self.device, kernel)
        # One slot past the last row, always False: a trailing zero-length (padded) request
        # starts there when the step is full.
        self._valid = torch.zeros(self.max_tokens + 1, dtype=torch.bool, device=self.device)
        self.valid = self._valid[:self.max_tokens]
        self.device = self._valid.device  # "cuda" -> "cuda:0": the kernel's inputs must compare equal
        self.decode_count = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._decode_rows: torch.Tensor | None = None
        self.decode_rows: torch.Tensor | None = None
        self.decode_step: torch.Tensor | None = None
        self._rows = torch.arange(self.max_tokens, dtype=torch.int32, device=self.device)
        # False once a step's metadata had no query_start_loc: decode tokens are then unknown.
        self.decode_known = True

    @staticmethod
    def bytes_for(max_tokens: int) -> int:
        """Device bytes of the buffers (``contract.sizing.step_mask_bytes``): a bool row of
        ``max_tokens + 1``, an int32 row of ``max_tokens``, one int64 (and with the decode rows
        ``sizing.decode_mask_bytes`` more)."""
        return sizing.step_mask_bytes(max_tokens)

    def enable_decode_rows(self) -> None:
        """Allocate (once) the per-row decode mask and the decode-only-step flag; call before any
        CUDA graph reading them is captured. Refreshed with the other buffers from then on."""
        if self._decode_rows is None:
            # one slot past the last row as for ``valid``: non-decode requests write there (discarded)
            self._decode_rows = torch.zeros(self.max_tokens + 1, dtype=torch.bool, device=self.device)
            self.decode_rows = self._decode_rows[:self.max_tokens]
            self.decode_step = torch.zeros(1, dtype=torch.int64, device=self.device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._valid, self.decode_count, self._rows,
                                                          self._decode_rows, self.decode_step)
                   if t is not None)

    def decode_rows_for(self, num_tokens: int) -> torch.Tensor:
        """``decode_rows[:T]`` for a forward of ``T`` rows (a fixed address; ``enable_decode_rows`` first)."""
        self.for_tokens(num_tokens)
        if self.decode_rows is None:
            raise RuntimeError("the step masks keep no decode rows (enable_decode_rows was not called)")
        return self.decode_rows[:num_tokens]

    def for_tokens(self, num_tokens: int) -> torch.Tensor:
        """``valid[:T]`` for a forward of ``T`` rows (a fixed address)."""
        if num_tokens > self.max_tokens:
            raise ValueError(f"a step of {num_tokens} tokens exceeds the masks' "
                             f"{self.max_tokens} (max_num_batched_tokens)")
        return self.valid[:num_tokens]

    def clear(self) -> None:
        """No real token in this step (profiling run, warm-up, capture dummy)."""
        if self._refresh is not None:
            self._refresh(self._valid, self.decode_count, 0, is_padding=None, num_actual_tokens=None,
                          query_start_loc=None, decode_rows=self._decode_rows, decode_step=self.decode_step)
            return
        self.valid.zero_()
        self.decode_count.zero_()
        if self._decode_rows is not None:
            self._decode_rows.zero_()
            self.decode_step.zero_()

    def update(self, num_rows: int, *, is_padding: torch.Tensor | None = None,
               num_actual_tokens: int | None = None,
               query_start_loc: torch.Tensor | None = None) -> None:
        """Masks for a step of ``num_rows`` rows (padded). Real rows: ``~is_padding`` when given,
        else the first ``num_actual_tokens``, else all ``num_rows``. Decode tokens: the requests
        of ``query_start_loc`` with exactly one new token (padded requests have none); unknown
        without it. One Triton launch on CUDA (else a handful of torch ops), none reading back to
        the host."""
        n = min(int(num_rows), self.max_tokens)
        if query_start_loc is None:
            self.decode_known = False
        if self._refresh is not None and _kernel_takes(self.device, is_padding, query_start_loc):
            self._refresh(self._valid, self.decode_count, n, is_padding=is_padding,
                          num_actual_tokens=None if num_actual_tokens is None else int(num_actual_tokens),
                          query_start_loc=query_start_loc, decode_rows=self._decode_rows,
                          decode_step=self.decode_step)
            return
        self._update_torch(n, is_padding, num_actual_tokens, query_start_loc)

    def _update_torch(self, n: int, is_padding: torch.Tensor | None, num_actual_tokens: int | None,
                      query_start_loc: torch.Tensor | None) -> None:
        """The torch path (CPU, and the kernel's reference): a dozen small device ops."""
        valid = self.valid[:n]
        if is_padding is not None:
            torch.logical_not(is_padding[:n], out=valid)
        elif num_actual_tokens is not None:
            torch.lt(self._rows[:n], int(num_actual_tokens), out=valid)
        else:
            valid.fill_(True)
        if n < self.max_tokens:
            self.valid[n:].zero_()
        rows = self._decode_rows is not None
        if rows:
            self._decode_rows.zero_()
        if query_start_loc is None:
            self.decode_count.zero_()
            if rows:
                self.decode_step.zero_()
            return
        starts = query_start_loc
        # A decode request: one new token, on a real row. Capture and warm-up dummies carry
        # metadata of one-token requests on rows marked padding; they count nothing. (Rows past
        # the step are False: the tail was zeroed above.)
        first_row = self._valid[starts[:-1]]
        one = ((starts[1:] - starts[:-1]) == 1) & first_row
        torch.sum(one, dim=0, keepdim=True, out=self.decode_count)
        if not rows:
            return
        # each decode request marks its row; every other request writes False into the spare slot
        # past the last row (one row never holds two one-token requests: no conflicting writes)
        trash = torch.full_like(starts[:-1], self.max_tokens)
        self._decode_rows.index_put_((torch.where(one, starts[:-1], trash).long(),), one)
        self._decode_rows[self.max_tokens:].zero_()
        real = valid.sum(dim=0, keepdim=True)
        torch.logical_and(self.decode_count == real, real > 0, out=self.decode_step)

    def update_from_context(self, context: Any) -> None:
        """Fill the masks from a vLLM ``ForwardContext`` (called as it is created)."""
        metadata = getattr(context, "attn_metadata", None)
        if isinstance(metadata, list):  # micro-batched steps: one dict per micro-batch
            metadata = metadata[0] if metadata else None
        if not metadata:
            self.clear()
            return
        meta = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
        is_padding = getattr(context, "is_padding", None)
        if not isinstance(is_padding, torch.Tensor):
            is_padding = None
        descriptor = getattr(context, "batch_descriptor", None)
        if is_padding is not None:
            rows = is_padding.numel()
        elif descriptor is not None and getattr(descriptor, "num_tokens", None):
            rows = int(descriptor.num_tokens)
        else:
            rows = self.max_tokens
        actual = getattr(meta, "num_actual_tokens", None)
        self.update(rows, is_padding=is_padding,
                    num_actual_tokens=actual if isinstance(actual, int) else None,
                    query_start_loc=_first_tensor(metadata, "query_start_loc"))


def _kernel_refresh(device: torch.device, kernel: bool | None) -> Any | None:
    """``step_masks_kernel.refresh`` where it is to run, else None (the torch path)."""
    if kernel is False or (kernel is None and device.type != "cuda"):
        return None
    try:
        from .step_masks_kernel import refresh
    except ImportError:
        if kernel:
            raise
        return None
    return refresh


def _kernel_takes(device: torch.device, *tensors: torch.Tensor | None) -> bool:
    """The kernel reads flat buffers on the masks' device; anything else takes the torch path."""
    return all(t is None or (t.device == device and t.dim() == 1 and t.is_contiguous()) for t in tensors)


def _first_tensor(metadata: Any, name: str) -> torch.Tensor | None:
    values = metadata.values() if isinstance(metadata, dict) else [metadata]
    for meta in values:
        value = getattr(meta, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return None
