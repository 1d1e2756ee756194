"""Reading vLLM flags out of a lane's `extra_args` (the ledger's one reader of them).

Every question the ledger asks of `extra_args` goes through vLLM 0.33's own reading of a command
line (`recipegen.vllm_flags.args.parse_args`): `--kv_cache_dtype=fp8`, `--kv-cache-dtype fp8` and
a later repeat all answer as vLLM would boot, `-dp 2` is `--data-parallel-size 2`, and
`--no-enable-expert-parallel` is off. A recipe whose `extra_args` vLLM would read differently from
this is refused when it is loaded (`recipegen.load.checks.extra_args_problems`).
"""

from __future__ import annotations

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
}
# Values of `--dtype` that keep the checkpoint's bytes (16-bit weights stay 16-bit).
SAME_BYTES_DTYPES = {"auto", "half", "float16", "bfloat16"}
