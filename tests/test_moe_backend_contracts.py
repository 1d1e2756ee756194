"""recipegen/vllm_flags/moe_backend.py's table against vLLM 0.33.0's unpacked source (read with ``ast``,
never imported): for every row, the `--moe-backend` value maps to the backend the row names, that
backend's experts classes include the row's class, the class is a *modular* experts class (what
the runtime needs: `require_decomposed_backend` excludes monolithic ones), and its device gate
is the one the row encodes. Skips where the 0.33.0 source is absent, like the other contract tests.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from test_vllm033_contracts import _class, _function, _source, _v033_root

from recipegen.vllm_flags.moe_backend import TABLE, BackendRow

FUSED = "model_executor/layers/fused_moe"
ORACLE = {"mxfp4": ("oracle/mxfp4.py", "map_mxfp4_backend", "Mxfp4MoeBackend"),
          "bf16": ("oracle/unquantized.py", "map_unquantized_backend", "UnquantizedMoeBackend"),
          "fp16": ("oracle/unquantized.py", "map_unquantized_backend", "UnquantizedMoeBackend"),
          "fp8-block": ("oracle/fp8.py", "map_fp8_backend", "Fp8MoeBackend"),
          "fp8": ("oracle/fp8.py", "map_fp8_backend", "Fp8MoeBackend")}
EXPERTS_FILE = {"TrtLlmMxfp4ExpertsModular": "experts/trtllm_mxfp4_moe.py",
                "MarlinExperts": "experts/marlin_moe.py",
                "TritonExperts": "experts/triton_moe.py"}
# The device gate each row encodes, as vLLM spells it (read by hand from the classes).
GATE = {((10, 0), 10): "p.is_device_capability_family(100)",
        ((7, 5), None): "p.has_device_capability((7, 5))",
        ((7, 0), None): "current_platform.is_cuda_alike()"}


@pytest.fixture(scope="module")
def root() -> Path:
    found = _v033_root()
    if found is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    return found


def _ids(row: BackendRow) -> str:
    return f"{row.expert_format}-{row.moe_backend}"


def _mapped_members(root: Path, row: BackendRow) -> list[str]:
    """Enum members the oracle's map function gives for the row's `--moe-backend` value."""
    rel, fn, enum = ORACLE[row.expert_format]
    for node in ast.walk(_function(root, f"{FUSED}/{rel}", fn)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == row.moe_backend:
                    return re.findall(rf"{enum}\.(\w+)", ast.unparse(value))
    pytest.fail(f"{fn} has no {row.moe_backend!r}")


def _classes_for(root: Path, row: BackendRow, member: str) -> list[str]:
    """Experts classes ``backend_to_kernel_cls`` returns for one backend member."""
    rel, _, enum = ORACLE[row.expert_format]
    fn = _function(root, f"{FUSED}/{rel}", "backend_to_kernel_cls")
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and re.search(rf"{enum}\.{member}\b", ast.unparse(node.test)):
            returns = [n for n in node.body if isinstance(n, ast.Return)]
            if returns:
                return re.findall(r"\w+", ast.unparse(returns[0].value))
    pytest.fail(f"backend_to_kernel_cls has no branch for {enum}.{member}")


def _bases(root: Path, rel: str, name: str) -> list[str]:
    """The class and its bases defined in the same file, nearest first."""
    out, todo = [], [name]
    while todo:
        current = todo.pop(0)
        out.append(current)
        try:
            node = _class(root, f"{FUSED}/{rel}", current)
        except pytest.fail.Exception:
            continue
        todo += [ast.unparse(b).split(".")[-1] for b in node.bases]
    return out


@pytest.mark.parametrize("row", TABLE, ids=_ids)
def test_row_maps_to_a_modular_class_with_the_rows_device_gate(root: Path, row: BackendRow) -> None:
    members = _mapped_members(root, row)
    assert members, row
    classes = {c for m in members for c in _classes_for(root, row, m)}
    assert row.experts_class in classes, (row, classes)
    rel = EXPERTS_FILE[row.experts_class]
    chain = _bases(root, rel, row.experts_class)
    assert "FusedMoEExpertsModular" in chain, chain  # modular: vLLM hands it the topk_ids
    gates = []
    for name in chain:
        try:
            node = _class(root, f"{FUSED}/{rel}", name)
        except pytest.fail.Exception:
            continue
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "_supports_current_device":
                gates.append(" ".join(ast.unparse(fn).split()))
    assert gates, f"no _supports_current_device along {chain}"
    want = GATE[(row.min_cc if row.expert_format not in ("fp8", "fp8-block")
                 or row.moe_backend != "triton" else (7, 0), row.major_only)]
    assert want in gates[0], (want, gates[0])


@pytest.mark.parametrize("row", [r for r in TABLE if r.expert_format.startswith("fp8")
                                 and r.moe_backend == "triton"], ids=_ids)
def test_fp8_triton_rows_need_the_platforms_fp8_gate(root: Path, row: BackendRow) -> None:
    scheme = " ".join(ast.unparse(_function(root, f"{FUSED}/experts/triton_moe.py",
                                            "_supports_quant_scheme", "TritonExperts")).split())
    assert "if current_platform.supports_fp8(): supported += [(kFp8Static128BlockSym, " \
           "kFp8Dynamic128Sym)" in scheme
    fp8 = ast.unparse(_function(root, "platforms/cuda.py", "supports_fp8", "CudaPlatformBase"))
    assert "return cls.has_device_capability(89)" in fp8
    assert row.min_cc == (8, 9)


def test_decomposed_backend_excludes_monolithic_classes(root: Path) -> None:
    body = " ".join(ast.unparse(_function(root, f"{FUSED}/modular_kernel.py",
                                          "is_supported_config", "FusedMoEExperts")).split())
    assert "elif moe_config.require_decomposed_backend and cls.is_monolithic(): return (False, " \
           "_make_reason('routes adjusted after routing'))" in body


@pytest.mark.parametrize("row", TABLE, ids=_ids)
def test_cited_map_line_names_the_backend(root: Path, row: BackendRow) -> None:
    rel, line = re.search(r"(oracle/\w+\.py):(\d+)", row.source).groups()
    text = _source(root, f"{FUSED}/{rel}").splitlines()[int(line) - 1]
    assert f'"{row.moe_backend}":' in text, (rel, line, text)
