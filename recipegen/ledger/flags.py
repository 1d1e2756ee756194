"""Reading vLLM flags out of a lane's `extra_args` (the ledger's one reader of them).

Every question the ledger asks of `extra_args` goes through vLLM 0.33's own reading of a command
line (`recipegen.vllm_flags.args.parse_args`): `--kv_cache_dtype=fp8`, `--kv-cache-dtype fp8` and
a later repeat all answer as vLLM would boot, `-dp 2` is `--data-parallel-size 2`, and
`--no-enable-expert-parallel` is off. A recipe whose `extra_args` vLLM would read differently from
this is refused when it is loaded (`recipegen.load.checks.extra_args_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from recipegen.vllm_flags import load_flag_table
from recipegen.vllm_flags.args import ParsedArgs, parse_args


@lru_cache(maxsize=256)
def _parsed(args: tuple[str, ...]) -> ParsedArgs:
    return parse_args(list(args), load_flag_table())


def parsed_args(args: list[str] | tuple[str, ...]) -> ParsedArgs:
    """`args` as vLLM 0.33 reads them (cached: the ledger asks many questions of one lane)."""
    return _parsed(tuple(args))


def canonical(flag: str) -> str:
    """The canonical spelling of `flag` (`-dp` → `--data-parallel-size`)."""
    info = load_flag_table().flags.get(flag)
    return str(info.get("canonical") or flag) if info else flag


def flag_value(args: list[str], flag: str) -> str | None:
    """The value vLLM takes for `flag` (any spelling of it) from a lane's extra_args; None when
    absent. A list flag's values come joined by commas."""
    given = parsed_args(args).get(canonical(flag))
    if given is None or not given.values:
        return None
    return ",".join(given.values) if given.kind == "list" else given.values[0]


def max_num_seqs(extra_args: list[str] | tuple[str, ...], concurrency_max: int) -> tuple[int, bool]:
    """The most sequences the rendered lane runs at once, and whether `extra_args` sets it: the render
    passes `concurrency.max` as --max-num-seqs unless `extra_args` gives the flag."""
    given = parsed_args(extra_args).get(canonical("--max-num-seqs"))
    if given is not None and given.values:
        return int(given.values[0]), True
    return concurrency_max, False


def flag_on(args: list[str], flag: str) -> bool:
    """Whether an on/off flag is on (`--x`; `--no-x` is off; absent is off)."""
    return parsed_args(args).on(canonical(flag))


def flag_int(args: list[str], flag: str, default: int = 1) -> int:
    """An integer flag's value; `default` when absent."""
    return parsed_args(args).integer(canonical(flag), default)


def flag_values(args: list[str], flag: str) -> tuple[str, ...]:
    """Every value of a list flag (`--cpu-offload-params experts,w13_weight` → one value)."""
    return parsed_args(args).values(canonical(flag))


# Flags the ledger does not budget, each with the value vLLM 0.33 defaults to (None: refused at
# any value) and why: given in extra_args at another value, the lane would boot a layout the
# ledger never priced, so the recipe is refused naming the flag.
UNBUDGETED: dict[str, tuple[str | None, str]] = {
    "--config": (None, "a YAML file of further flags, which the ledger cannot see: write them in "
                       "extra_args"),
    "--data-parallel-size": ("1", "data parallelism runs one engine per GPU group; the ledger "
                                  "budgets one engine on the lane's GPUs: give each group its own lane"),
    "--data-parallel-size-local": (None, "a data-parallel deployment flag; the ledger budgets one engine "
                                         "per lane"),
    "--pipeline-parallel-size": ("1", "pipeline stages come from the lane's parallel.pipeline, which the "
                                      "ledger budgets stage by stage"),
    "--nnodes": ("1", "nodes come from the lane's parallel.pipeline"),
    "--decode-context-parallel-size": ("1", "splits the KV cache over GPUs in a way the ledger does not "
                                            "model"),
    "--prefill-context-parallel-size": ("1", "splits the KV cache over GPUs in a way the ledger does not "
                                             "model"),
    "--quantization": (None, "the model entry's format decides the weight bytes the ledger counts: "
                             "import the checkpoint you serve"),
    "--dtype": ("auto", "the ledger counts weights in the checkpoint's own dtype"),
    "--engram-config": (None, "it places a model's Engram tables, which the ledger counts in host memory "
                              "(vLLM's default); a pipeline lane puts them in HBM with "
                              "parallel.host_tables_in_hbm, which the ledger budgets"),
}
# Values of `--dtype` that keep the checkpoint's bytes (16-bit weights stay 16-bit).
SAME_BYTES_DTYPES = {"auto", "half", "float16", "bfloat16"}


# Flags the render writes from the recipe's own fields (`recipegen.render.services._service`), each
# with the field it comes from: given again in extra_args, vLLM would keep the later one and boot
# a lane the ledger never priced, so both `check recipe` (`recipegen.load.checks`) and `render`
# refuse it through `rendered_flag_problems`. --max-num-seqs is not here (extra_args may set it; the
# ledger reads it, `max_num_seqs`), nor --moe-backend (the render adds it only when not given).
RENDERED_FROM_FIELDS: dict[str, str] = {
    "--model": "model",
    "--revision": "model.revision",
    "--served-model-name": "model.name",
    "--host": "the service's bind address, 0.0.0.0",
    "--port": "port",
    "--tensor-parallel-size": "gpus",
    "--max-model-len": "max_model_len",
    "--kv-cache-memory-bytes": "the ledger's KV budget",
    "--gpu-memory-utilization": "the ledger's KV budget",
    "--cpu-offload-gb": "offload",
    "--speculative-config": "speculative",
    "--worker-extension-cls": "offload (the runtime's worker extension)",
    "--node-rank": "parallel.pipeline",
    "--master-addr": "parallel.pipeline",
    "--master-port": "parallel.pipeline",
    "--headless": "parallel.pipeline",
}


def rendered_flag_problems(extra_args: list[str] | tuple[str, ...],
                           rendered: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """(item index, message) for each flag of `extra_args` that the render builds itself: those of
    `RENDERED_FROM_FIELDS`, and `rendered` (canonical name → the recipe field it comes from, "" when
    none: a multi-node launch's flags, `recipegen.multinode.launch.launch_flags`, and whatever else a
    render wrote). Every spelling vLLM reads counts (`-tp`, `--port=9`, `--max_model_len`)."""
    also = rendered or {}
    problems: list[tuple[int, str]] = []
    for name, given in parsed_args(extra_args).given.items():
        if name not in RENDERED_FROM_FIELDS and name not in also:
            continue
        flag = given.spelled.partition("=")[0]
        alias = f" (vLLM reads it as {name})" if name != flag else ""
        field = RENDERED_FROM_FIELDS.get(name) or also.get(name)
        source = f" ({field})" if field else ""
        problems.append((given.index, f"{flag} is rendered from the recipe's own fields{source}{alias}; "
                                      "change those instead of repeating it in extra_args"))
    return problems


def max_num_batched_tokens_problem(extra_args: list[str] | tuple[str, ...],
                                   concurrency_max: int) -> tuple[int, str] | None:
    """(item index, message) when extra_args' --max-num-batched-tokens is below the lane's
    --max-num-seqs (`max_num_seqs`): vLLM 0.33 refuses that at boot, whatever chunked prefill is
    (config/scheduler.py:331-336, `SchedulerConfig.verify_max_model_len`)."""
    given = parsed_args(extra_args).get(canonical("--max-num-batched-tokens"))
    if given is None or not given.values or not given.values[0].strip().isdigit():
        return None
    tokens = int(given.values[0])
    seqs, in_extra_args = max_num_seqs(extra_args, concurrency_max)
    if tokens >= seqs:
        return None
    source = "--max-num-seqs in extra_args" if in_extra_args else "concurrency.max"
    return (given.index, f"--max-num-batched-tokens {tokens} is below --max-num-seqs {seqs} ({source}): "
                         "vLLM 0.33 refuses to boot unless max_num_batched_tokens >= max_num_seqs "
                         "(config/scheduler.py:331-336)")
