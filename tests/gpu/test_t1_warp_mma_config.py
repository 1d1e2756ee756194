"""The T = 1 warp-MMA kernels' schedule choice and their PTX, on any machine (no GPU: the kernels
themselves run in ``test_t1_warp_mma.py`` on a CUDA GPU; inline PTX does not run under Triton's
interpreter).

Claims and how each can fail:
* ``t1_warpgroups``: the warpgroups per program are the largest power of two up to the config's
  that divides the reduction's 64-value half-steps (DeepSeek-V4.1's 5,120 / 2,304 = 80 / 36
  half-steps, gpt-oss's 2,880 = 45), 0 where the config says tl.dot; None for the schedules these
  kernels do not implement (split-K, stream-K, other tile shapes, the grouped T = 1 path);
* ``runs_warp_mma`` is False on the CPU and under ``TRITON_INTERPRET=1`` (so the launch logic
  takes tl.dot there);
* the generated PTX has, per 32-bit word, the layout's decode (``kernels.word_decode_ptx``, the
  same text the tl.dot path uses) and one ``mma.sync.m16n8k16`` accumulating into chain ``word %
  chains``; its operand numbers match the constraint string (PTX: A 4, B 2, C/D 4 registers);
* the loop trip length (``t1_unroll*``) and the launches' register cap (``t1_max_registers``) are
  checked by name and shown by ``describe``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the kernels are Triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))

from expert_residency.gpu import kernels, kernels_t1  # noqa: E402
from expert_residency.gpu.experts import ExpertShape, KernelConfig, config_for_shape, runs_warp_mma, t1_warpgroups  # noqa: E402

DSV41 = ExpertShape(5120, 2304)
GPTOSS = ExpertShape(2880, 2880)


def test_warpgroups_divide_the_half_steps() -> None:
    assert t1_warpgroups(DSV41, KernelConfig()) == (2, 2)
    assert t1_warpgroups(DSV41, KernelConfig(t1_warpgroups1=4, t1_warpgroups2=8)) == (4, 4)   # 36 = 4 x 9
    assert t1_warpgroups(DSV41, KernelConfig(t1_warpgroups1=8, t1_warpgroups2=3)) == (8, 2)   # powers of two
    assert t1_warpgroups(GPTOSS, config_for_shape(GPTOSS)) == (1, 1)                        # 45 is odd
    assert t1_warpgroups(DSV41, KernelConfig(t1_warpgroups2=0)) == (2, 0)                   # w2 via tl.dot


@pytest.mark.parametrize("fields", [dict(t1_warp_mma=False), dict(split_k1=2), dict(split_k2=2),
                                    dict(stream_k1=264), dict(one_token=False), dict(block_n1=256),
                                    dict(block_n2=256), dict(dequant=0, block_n1=32)],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_other_schedules_keep_tl_dot(fields: dict) -> None:
    assert t1_warpgroups(DSV41, KernelConfig(**fields)) is None


def test_chains_are_checked() -> None:
    with pytest.raises(ValueError, match="t1_chains2 3"):
        t1_warpgroups(DSV41, KernelConfig(t1_chains2=3))


@pytest.mark.parametrize("name, value", [("t1_unroll1", 6), ("t1_unroll2", 0), ("t1_unroll1", 24)])
def test_loop_trip_length_is_checked(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{name} {value} is not 4, 8, 12, 16 or 20"):
        t1_warpgroups(DSV41, KernelConfig(**{name: value}))


def test_loop_trip_length_is_described() -> None:
    assert "unroll8/8" in KernelConfig().describe()
    assert "unroll4/12" in KernelConfig(t1_unroll1=4, t1_unroll2=12).describe()


@pytest.mark.parametrize("value", [16, 256, -8])
def test_register_cap_is_checked(value: int) -> None:
    with pytest.raises(ValueError, match=f"t1_max_registers {value} is not 0 .* or 32..255"):
        KernelConfig(t1_max_registers=value)


def test_register_cap_is_described() -> None:
    assert "regs<=128" in KernelConfig().describe()
    assert "unroll8/8 regs<=96" in KernelConfig(t1_max_registers=96).describe()
    assert "unroll8/8 warp" in KernelConfig(t1_max_registers=0).describe()


def test_not_on_cpu_or_under_the_interpreter(monkeypatch) -> None:
    assert not runs_warp_mma(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not runs_warp_mma(torch.device("cuda"))


@pytest.mark.parametrize("sm90", [True, False])
@pytest.mark.parametrize("chains", [1, 2, 4])
def test_ptx_decodes_each_word_and_chains_its_mma(chains: int, sm90: bool) -> None:
    asm = kernels_t1._row_mma_asm(sm90, chains)
    constraints = kernels_t1._constraints(chains)
    n_out, n_in = 4 * chains, 4 * (5 + chains)             # chains' C/D; words, 2 multipliers, b0, b1, C
    assert constraints == ",".join(["=r"] * n_out + ["r"] * n_in)
    used = {int(n) for n in re.findall(r"\$(\d+)", asm)}
    assert used == set(range(n_out + n_in))                # every operand used, none beyond
    mmas = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32 \{([^}]*)\}, "
                      r"\{a0, a1, a2, a3\}, \{\$(\d+), \$(\d+)\}, \{([^}]*)\};", asm)
    assert len(mmas) == 4
    words, b0, b1 = n_out, n_out + 12, n_out + 16
    for i, (d, rb0, rb1, c) in enumerate(mmas):
        chain = ", ".join(f"c{4 * (i % chains) + e}" for e in range(4))
        assert d == c == chain
        assert (int(rb0), int(rb1)) == (b0 + i, b1 + i)
        decode = kernels.word_decode_ptx(f"${words + i}", f"${words + 4 + i}", f"${words + 8 + i}",
                                         ("a0", "a1", "a2", "a3"), sm90)
        assert decode in asm
    assert ("mul.rn.bf16x2" in asm) == sm90 and ("nz" in asm) != sm90
    # the tl.dot path's decode is the same text with its own operands
    assert kernels.word_decode_ptx("$4", "$5", "$7", ("$0", "$1", "$2", "$3"), sm90) in (
        kernels._MMA_WORD_TO_BF16_PTX.value if sm90 else kernels._MMA_WORD_TO_BF16_PTX_SM80.value)
