"""The shorthand recipegen prints, and what each means in plain words.

One home for these explanations: the commands that print reports for people (`check budgets`,
`plan`, `render --verbose`, `rowmap`, `status`, `drift`, `verify`, `new` / `fit` / `compare`)
end their output with one line for each term below that the output used and did not already
explain in place (`footnotes`). docs/design.md, 'Shorthand in the output', lists the same terms
(tests/test_output_plain.py keeps the two in step).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

HEADING = "shorthand above (docs/design.md, 'Shorthand in the output'):"


@dataclass(frozen=True)
class Term:
    """One piece of shorthand: how it is printed, the pattern that finds it, its meaning."""

    name: str
    pattern: str
    meaning: str
    # Output that matches this already explains the term in place (no footnote then).
    explained_by: str | None = None

    def used_in(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None

    def explained_in(self, text: str) -> bool:
        return self.explained_by is not None and re.search(self.explained_by, text) is not None


# The budget a configuration breaks (recipegen.ledger.verdict's violation kinds; `sequences`:
# recipegen.fit.search), each in words: fit / new / compare and check budgets tag it [kind] (the
# term below explains those), `plan --sweep` marks a row ✗ kind and explains the kinds it printed
# under its table (recipegen.cli.plan_cmd).
BUDGET_KINDS: dict[str, str] = {
    "hbm": "HBM per GPU (reserve + hot experts over the cap)",
    "kv": "the KV pool (less than one max_model_len sequence)",
    "host": "host memory in use",
    "load-hbm": "HBM at the load-time peak",
    "load-host": "host memory at the load-time peak",
    "machine-host": "the machine's lanes together over its host memory",
    "gpu-shared": "a GPU always-on lanes share",
    "reserve": "declared weights larger than the measured HBM reserve they are part of",
    "runtime": "what the expert residency runtime would refuse at boot or at load",
    "attention": "what vLLM's attention setup would refuse at boot",
    "parallel": "what the parallel layout would refuse at boot",
    "sequences": "fewer full-length sequences than --min-sequences asks",
}
_BUDGET_TAG = r"\[(?:" + "|".join(map(re.escape, BUDGET_KINDS)) + r")\]"

# The note the fetch projection prints beside its figures (recipegen.costmodel.lane).
_CK_NOTE = r"C<n> k=<k>: n concurrent streams"

TERMS: tuple[Term, ...] = (
    Term("positional / usage-aware", r"\bpositional\b|\busage-aware\b",
         "experts offloaded by their place in the model (vLLM's --cpu-offload-gb takes whole layers in "
         "load order) / cold experts chosen per layer by a row map from measured routing",
         explained_by=r"positional = the same cold count"),
    Term("load N GiB", r"\(load \d[\d,.]* GiB\)",
         "on a usage-aware lane, vLLM's --cpu-offload-gb while it loads the weights (the recipe's "
         "offload.load_cpu_offload, N GiB per GPU): vLLM first offloads whole layers by their place in the "
         "model, then the residency runtime moves each layer's experts to the row map's hot and cold sets "
         "(docs/ledger.md 'Load time')"),
    Term("hot / cold", r"\bhot\b|\bcold\b",
         "experts kept in GPU memory (HBM) / in pinned host memory, which the GPU reads in place over the "
         "host link"),
    Term("295x40", r"\b\d+x\d+\b", "counts per MoE layer, each value times the layers in a row that have it "
         "(295x40: 295 in each of 40 layers; 295x2,290x1: 295, 295, 290)"),
    Term("C<n>", r"\bC\d{1,4}\b", "n concurrent request streams (C1: one stream)", explained_by=_CK_NOTE),
    Term("k=<n>", r"\bk=\d", "speculative decoding proposes n draft tokens per step (k=0: no speculation)",
         explained_by=_CK_NOTE),
    Term("back-solved", r"back-solved",
         "computed backwards from a measured boot (reserve = HBM cap − hot experts − the KV pool that boot "
         "reported), not derived from the model's geometry", explained_by=r"back-solved from a measured boot"),
    Term("fetch tax", r"fetch tax",
         "time per decode step spent reading cold experts over the host link",
         explained_by=r"fetch tax \(cold expert reads over"),
    Term("v11–v15", r"\bv1[1-5]\b",
         "revisions of the reference GB300 lane that the field reports measured: v11 before 12.7 GiB of "
         "experts moved into HBM, v12 and v14 positional (--cpu-offload-gb 60; v14 with speculative decoding), "
         "v15 the usage-aware 295 hot / 89 cold row map"),
    Term("off60", r"\boff60\b", "positional offload with --cpu-offload-gb 60 (60 GiB of experts in host memory)"),
    # No in-place explanation: "tensor parallel over 8 GPUs" names the layout but not the abbreviation,
    # and "TP 8" is printed beside it.
    Term("TP", r"\bTP\b",
         "tensor parallelism: each of the lane's N GPUs (TP N) holds a 1/N shard of most weights; some, such as "
         "norms and the router, are whole on every GPU instead (vLLM --tensor-parallel-size N)"),
    Term("EP", r"\bEP\b",
         "expert parallel: each GPU holds whole experts, its share of them (vLLM --enable-expert-parallel)"),
    Term("PP", r"\bPP\b",
         "pipeline parallel: each machine of the lane holds a run of the model's layers "
         "(vLLM --pipeline-parallel-size)"),
    Term("DP", r"\bDP\b", "data parallel: copies of the model that serve requests side by side "
         "(vLLM --data-parallel-size)"),
    Term("MLA", r"\bMLA\b",
         "multi-head latent attention (DeepSeek): each layer caches one compressed latent per token instead "
         "of keys and values per head"),
    Term("GDN", r"\bGDN\b",
         "Gated DeltaNet, a linear-attention layer that keeps a fixed-size state per sequence instead of KV "
         "per token"),
    Term("host tables", r"\bhost tables\b",
         "tables a model keeps in pinned host memory for the whole run, declared in its model file "
         "(DeepSeek-V4.1: its two Engram embedding tables; none for most models)"),
    Term("Engram tables", r"\bEngram\b",
         "DeepSeek-V4.1's Engram embedding tables (two of 94.6 GiB), which vLLM keeps in pinned host memory "
         "by default (--engram-config cpu_offload)"),
    Term("UVA", r"\bUVA\b",
         "unified virtual addressing: the GPU reads pinned host memory in place, without copying it first "
         "(how vLLM's --cpu-offload-gb serves offloaded weights)"),
    Term("C2C", r"\bC2C\b",
         "NVLink-C2C, the link between a Grace CPU's memory and its GPU (~340 GB/s measured for pinned "
         "memory on a GB300)"),
    Term("DSpark", r"\bDSpark\b", "the speculative-decoding drafter of the reference lane "
         "(vLLM --speculative-config method dspark)"),
    Term("MTP", r"\bMTP\b",
         "multi-token prediction layers shipped in the checkpoint, which vLLM can use as a drafter"),
    Term("NVML", r"\bNVML\b", "NVIDIA's management library, what nvidia-smi reads GPU memory and "
         "properties through"),
    Term("NCCL", r"\bNCCL\b", "NVIDIA's library for communication between GPUs (its buffers take HBM)"),
    Term("MARLIN", r"\bMARLIN\b|\bMarlin\b", "vLLM's Marlin MoE kernel, which lays quantized experts out "
         "padded"),
    # vLLM spells its MoE backends in capitals (TRITON, MARLIN); Triton is a name, not an acronym.
    Term("TRITON", r"\bTRITON\b|\bTriton\b",
         "kernels written in Triton, OpenAI's language for GPU kernels (a name, not an acronym); TRITON is "
         "vLLM's Triton MoE kernel, which pads quantized experts to its own tile; the runtime's split layers "
         "are Triton kernels too"),
    Term("FlashInfer / TRT-LLM", r"\bFlashInfer\b|FLASHINFER|TRT-?LLM",
         "FlashInfer, a library of attention and MoE GPU kernels vLLM uses; its TRT-LLM MoE kernels (from "
         "NVIDIA's TensorRT-LLM) run routed experts on compute capability 10.x (B200, GB200, GB300) and "
         "allocate their scratch memory inside each call"),
    Term("bank", r"\bbanks?\b",
         "one of the two weight tensors the runtime splits a MoE layer's experts into: the hot bank in HBM and "
         "the cold bank in pinned host memory (one launch per bank: the MoE kernel runs once for each, one "
         "after the other; a prefetch bank: spare expert slots per layer)"),
    Term("split / unsplit", r"\bunsplit\b|\bsplit is not verified\b",
         "a MoE layer run by the runtime as two banks (hot and cold experts) / the same layer run whole, as "
         "plain vLLM runs it; `recipegen parity` checks that the two give the same outputs"),
    Term("split-K tickets", r"\bsplit-K\b",
         "split-K: a matrix-multiply schedule that spreads each dot product over several thread blocks and "
         "then adds up their partial sums; its tickets are int32 counters the runtime allocates at start-up "
         "that hand each tile's final sum to the block that finishes last"),
    Term("fp8-block", r"(?i)\bfp8-block\b",
         "FP8 (E4M3) weights with one scale per 128 × 128 block, the format of DeepSeek-V3's and Qwen3's FP8 "
         "checkpoints"),
    Term("content / shape hash", r"content_hash|shape_hash|\bCONTENT\b|\bSHAPE\b",
         "sha256 of a row map's assignment (which experts are hot) / of its bank shapes only (how many per "
         "layer); a new map with the same shape hash reuses the tuned kernels"),
    Term("config hash", r"\bconfig hash\b",
         "sha256 of a service's rendered configuration, also written into its container's labels: "
         "`recipegen status` calls a running container stale when the two differ"),
    Term("barrier", r"\bbarrier", "on an adaptive lane, the point between two decode steps where the runtime "
         "reads the recent counts and chooses its next swaps"),
    Term("Gini", r"\bGini\b", "how unevenly a layer's picks fall on its experts: 0 when even, near 1 when a "
         "few experts take them all"),
    Term("[kv] / [hbm] / [host] / [load-host]", _BUDGET_TAG,
         "the budget a configuration breaks: " + ", ".join(f"[{kind}] {what}" for kind, what in BUDGET_KINDS.items())),
    Term("validation band", r"validation band|\bband \d",
         "the range of real speeds the decode estimate allows at the draft acceptance it states (traffic whose "
         "drafts are accepted more or less often runs outside it): the estimate times the lowest and highest "
         "measured ÷ estimated tokens/s over the validation runs, printed rounded outward (docs/costmodel.md "
         "'Validation')",
         explained_by=r"band (the|its) validation justifies"),
    Term("synthetic", r"(?i)\bsynthetic\b",
         "an example histogram made by `recipegen rowmap synth` or `new`, not measured traffic "
         "(`recipegen profile` replaces it)"),
)


# What stands in for a user's value in the text the terms are matched in: no term matches it.
_MASK = "\x00"


def mask_user_text(text: str, user_text: Iterable[str] = ()) -> str:
    """`text` with every occurrence of the user's own values (paths, URLs, names they gave,
    what a server or a recording said) masked, so that only recipegen's own words are matched:
    a recording named v14.json is not the reference lane's v14. A value is masked where it stands
    whole (not inside a longer word: a lane named `agent` leaves `agents` alone); longer values first."""
    values = sorted({v for v in user_text if v and v.strip()}, key=len, reverse=True)
    for value in values:
        pattern = (r"(?<!\w)" if re.match(r"\w", value) else "") + re.escape(value) + \
                  (r"(?!\w)" if re.search(r"\w$", value) else "")
        text = re.sub(pattern, _MASK, text)
    return text


def used_terms(text: str, user_text: Iterable[str] = ()) -> list[Term]:
    """The terms `text` uses and does not explain in place, in the table's order; the values in
    `user_text` are not recipegen's words and neither use nor explain a term (`mask_user_text`)."""
    text = mask_user_text(text, user_text)
    return [t for t in TERMS if t.used_in(text) and not t.explained_in(text)]


def footnotes(text: str, user_text: Iterable[str] = ()) -> list[str]:
    """The lines that explain the shorthand of `text` (none when it uses none), the values in
    `user_text` left out of the matching (`used_terms`)."""
    terms = used_terms(text, user_text)
    if not terms:
        return []
    return [HEADING, *(f"  {t.name}: {t.meaning}" for t in terms)]
