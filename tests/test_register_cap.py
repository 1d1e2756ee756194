"""The register cap of the tl.dot expert launches (``KernelConfig.max_registers`` at small steps,
``max_registers_large`` above them): a value outside ptxas' range is refused naming the field and
the value; the launch options carry Triton's ``maxnreg`` only where a cap is set, beside the
pipeline depth of that step size; ``describe`` names it. Whether a cap changes any bits is the GPU
test ``tests/gpu/test_gpu_residency.py::test_register_cap_gives_the_same_bits``."""

from __future__ import annotations

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts


@pytest.mark.parametrize("field", ["max_registers", "max_registers_large"])
@pytest.mark.parametrize("value", [16, 31, 256, -8])
def test_cap_outside_ptxas_range_is_refused(field: str, value: int) -> None:
    from expert_residency.gpu.experts import KernelConfig

    with pytest.raises(ValueError) as err:
        KernelConfig(**{field: value})
    assert f"{field} {value}" in str(err.value) and "32..255" in str(err.value)


def test_launch_options_by_step_size() -> None:
    from expert_residency.gpu.experts import KernelConfig

    default = KernelConfig()
    assert (default.max_registers, default.max_registers_large) == (168, 128)
    assert default.tl_dot_launch(True) == {"num_warps": 4, "num_stages": default.num_stages, "maxnreg": 168}
    assert default.tl_dot_launch(False) == {"num_warps": 4, "num_stages": default.num_stages_large,
                                            "maxnreg": 128}
    assert "maxregs168/128" in default.describe()
    uncapped = KernelConfig(max_registers=0, max_registers_large=0, num_stages=4, num_stages_large=3)
    assert uncapped.tl_dot_launch(True) == {"num_warps": 4, "num_stages": 4}
    assert uncapped.tl_dot_launch(False) == {"num_warps": 4, "num_stages": 3}
    assert "maxregs" not in uncapped.describe()
    large_only = KernelConfig(max_registers=0, max_registers_large=96, num_stages_large=None, num_stages=4)
    assert large_only.tl_dot_launch(True) == {"num_warps": 4, "num_stages": 4}
    assert large_only.tl_dot_launch(False) == {"num_warps": 4, "num_stages": 4, "maxnreg": 96}
    assert "maxregs-/96" in large_only.describe()
