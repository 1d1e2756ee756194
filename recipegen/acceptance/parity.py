"""Greedy token-exact parity between two endpoints, separating placement from serving noise.

Each endpoint answers the fixture `runs` times; A is the candidate, B the control. Per prompt:
  - exact              every run of A and of B produced the same tokens;
  - nondeterministic   every run of A that differs from B is accounted for by nondeterminism:
                       some run of B reproduces it exactly (B's own jitter), or it departs from
                       every run of B only at or after the token where A's own runs already
                       disagree with each other on this prompt (A's own jitter point);
  - diverges           some run of A departs from every run of B *before* A's own runs disagree
                       (or A never disagrees with itself) and no run of B reproduces it: a
                       placement (or model) effect. Any such prompt fails parity.
So self-jitter at token 200 cannot excuse a divergence at token 0. With one run per endpoint
nothing can be attributed to nondeterminism, so every divergence counts. The pairwise exact
counts (A×A, A×B, B×B) are reported as the field report "vLLM: Pin Hot Experts" (2026-09-17)
did ("47/50 within v15, 49/50 v15 vs v14").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations, product
from typing import Literal

from recipegen.acceptance.client import EndpointClient, Generation, Request
from recipegen.acceptance.fixture import Fixture, Prompt

Status = Literal["exact", "nondeterministic", "diverges"]
CONTEXT_CHARS = 24   # common text shown before the divergence, at most
PIECE_CHARS = 12     # how far a diverging piece reaches back and on from the first differing character


@dataclass(frozen=True)
class Output:
    """One run's output for one prompt: tokens when the server gave them, and text."""

    text: str
    token_ids: tuple[int, ...] | None = None

    @classmethod
    def of(cls, generation: Generation) -> Output:
        return cls(text=generation.text, token_ids=generation.token_ids)


@dataclass(frozen=True)
class Divergence:
    """Where two outputs part: token index (or character index when compared on text)."""

    unit: Literal["token", "char"]
    index: int
    common: str      # the text just before the diverging pieces
    left: str        # each side's diverging piece: from the word boundary before the
    right: str       # first differing character to the next one (the diverging token, usually)

    def describe(self) -> str:
        if not self.left and not self.right:
            return f"{self.unit} {self.index}: …{self.common!r} (the same text, other token ids)"
        return f"{self.unit} {self.index}: …{self.common!r} then {self.left!r} vs {self.right!r}"


def _piece_start(a: str, b: str, char: int) -> int:
    """Where the word holding the first differing character `char` starts (its leading space
    included, as tokenizers split ' host'); `char` itself when it starts a word on either side or no
    word boundary is near (text without spaces)."""
    if a[char - 1:char].isspace():
        return char - 1
    if any(char >= len(t) or t[char].isspace() for t in (a, b)):
        return char
    start = char
    while start > 0 and char - start < PIECE_CHARS and not a[start - 1].isspace():
        start -= 1
    if start == 0:
        return 0
    return start - 1 if a[start - 1].isspace() else char


def _piece(text: str, start: int, char: int) -> str:
    """From `start` to the end of the word that `text[char]` belongs to (at most PIECE_CHARS past `char`)."""
    end = min(len(text), char + 1)
    while end < len(text) and end - char < PIECE_CHARS and not text[end].isspace():
        end += 1
    return text[start:end]


def first_divergence(a: Output, b: Output, context: int = CONTEXT_CHARS) -> Divergence | None:
    """None when a and b are identical; else where they first differ, with text context.

    The server gives token ids but not each token's text, so the diverging pieces are cut from the
    text at word boundaries around the first differing character: the diverging word, which for
    most tokenizers is the diverging token (`' host'` vs `' that'`)."""
    if a.token_ids is not None and b.token_ids is not None:
        if a.token_ids == b.token_ids:
            return None
        index = _common_prefix(a.token_ids, b.token_ids)
        unit: Literal["token", "char"] = "token"
    else:
        if a.text == b.text:
            return None
        index = _common_prefix(a.text, b.text)
        unit = "char"
    char = _common_prefix(a.text, b.text)
    if a.text == b.text:   # other token ids for the same text
        return Divergence(unit=unit, index=index, common=a.text[max(0, char - context):], left="", right="")
    start = _piece_start(a.text, b.text, char)
    return Divergence(unit=unit, index=index, common=a.text[max(0, start - context):start],
                      left=_piece(a.text, start, char), right=_piece(b.text, start, char))


def _common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class PromptVerdict:
    prompt_id: str
    category: str
    status: Status
    a_self_exact: bool
    b_self_exact: bool
    ab_exact_pairs: int
    ab_pairs: int
    divergence: Divergence | None     # the deciding A-vs-B divergence (see judge_prompt), if any
    self_divergence: Divergence | None  # first A-vs-A divergence (A's own jitter point), if any
    reason: str = ""                  # why the verdict, in words (printed beside it)


@dataclass
class ParityReport:
    runs_a: int
    runs_b: int
    verdicts: list[PromptVerdict]
    pair_counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # "A1×B2" -> (exact, total)

    @property
    def passed(self) -> bool:
        return not any(v.status == "diverges" for v in self.verdicts)

    def count(self, status: Status) -> int:
        return sum(1 for v in self.verdicts if v.status == status)


def _comparable(outputs: Sequence[Output]) -> list[Output]:
    """Compare every pair of a prompt in one unit: tokens only when every output has them."""
    if all(o.token_ids is not None for o in outputs):
        return list(outputs)
    return [Output(text=o.text) for o in outputs]


def judge_prompt(prompt: Prompt, outputs_a: Sequence[Output], outputs_b: Sequence[Output]) -> PromptVerdict:
    """Attribute each A-vs-B difference on one prompt (module docstring).

    For each run a of A: if some run of B equals it, it is reproduced. Otherwise its departure
    point is the furthest any run of B follows it (max common prefix); it is excused only when
    that point is at or after A's own jitter point (the earliest index where two runs of A
    differ). One unexcused run of A makes the prompt diverge.
    """
    if not outputs_a or not outputs_b:
        raise ValueError("each endpoint needs at least one run")
    both = _comparable([*outputs_a, *outputs_b])
    outputs_a, outputs_b = both[:len(outputs_a)], both[len(outputs_a):]
    self_divs = [d for x, y in combinations(outputs_a, 2) if (d := first_divergence(x, y))]
    b_self = all(first_divergence(x, y) is None for x, y in combinations(outputs_b, 2))
    ab_divs = [first_divergence(x, y) for x, y in product(outputs_a, outputs_b)]
    ab_exact = sum(1 for d in ab_divs if d is None)
    self_first = min(self_divs, key=lambda d: d.index) if self_divs else None
    jitter_point = self_first.index if self_first else None
    unexcused: list[Divergence] = []   # per unexcused run of A: where it leaves every run of B
    excused: list[Divergence] = []
    for a in outputs_a:
        divs = [first_divergence(a, b) for b in outputs_b]
        if any(d is None for d in divs):
            continue                   # reproduced by a run of B
        departure = max((d for d in divs if d is not None), key=lambda d: d.index)
        if jitter_point is not None and departure.index >= jitter_point:
            excused.append(departure)
        else:
            unexcused.append(departure)
    real_divs = [d for d in ab_divs if d is not None]
    unit_name = real_divs[0].unit if real_divs else "token"
    if ab_exact == len(ab_divs):
        status: Status = "exact"
        decisive, reason = None, ""
    elif unexcused:
        status = "diverges"
        decisive = min(unexcused, key=lambda d: d.index)
        reason = (f"A≠B at {decisive.describe()}" + (
            "; A's own runs agree" if jitter_point is None else
            f"; before A's own runs disagree ({unit_name} {jitter_point})"))
    else:
        status = "nondeterministic"
        decisive = min(excused or real_divs, key=lambda d: d.index)
        if self_first is not None and excused:
            reason = (f"A≠A at {self_first.describe()}; A leaves B at {unit_name} {decisive.index}, "
                      "not before")
        else:
            reason = "B≠B: a run of B reproduces each run of A"
    return PromptVerdict(prompt_id=prompt.id, category=prompt.category, status=status,
                         a_self_exact=not self_divs, b_self_exact=b_self, ab_exact_pairs=ab_exact,
                         ab_pairs=len(ab_divs), divergence=decisive, self_divergence=self_first,
                         reason=reason)


def compare(fixture: Fixture, runs_a: Sequence[Sequence[Output]], runs_b: Sequence[Sequence[Output]]
            ) -> ParityReport:
    """Judge every prompt; `runs_x[r][i]` is run r's output for fixture prompt i."""
    for runs in (runs_a, runs_b):
        if not runs or any(len(run) != len(fixture.prompts) for run in runs):
            raise ValueError("every run must answer every fixture prompt")
    verdicts = [judge_prompt(p, [run[i] for run in runs_a], [run[i] for run in runs_b])
                for i, p in enumerate(fixture.prompts)]
    labelled = [(f"A{r + 1}", run) for r, run in enumerate(runs_a)] + \
               [(f"B{r + 1}", run) for r, run in enumerate(runs_b)]
    pair_counts: dict[str, tuple[int, int]] = {}
    for (name_x, run_x), (name_y, run_y) in combinations(labelled, 2):
        exact = sum(1 for x, y in zip(run_x, run_y) if first_divergence(x, y) is None)
        pair_counts[f"{name_x}×{name_y}"] = (exact, len(fixture.prompts))
    return ParityReport(runs_a=len(runs_a), runs_b=len(runs_b), verdicts=verdicts, pair_counts=pair_counts)


def request_for(prompt: Prompt, *, max_tokens: int, seed: int | None) -> Request:
    return Request(prompt=prompt.prompt, messages=prompt.messages, tools=prompt.tools,
                   max_tokens=max_tokens, seed=seed, temperature=0.0)


async def run_fixture(client: EndpointClient, fixture: Fixture, *, max_tokens: int, seed: int | None,
                      concurrency: int = 1, progress: Callable[[int], None] | None = None) -> list[Output]:
    """One greedy pass of the fixture; results in fixture order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(prompt: Prompt) -> Output:
        async with semaphore:
            generation = await client.generate(request_for(prompt, max_tokens=max_tokens, seed=seed))
        if progress:
            progress(1)
        return Output.of(generation)

    return list(await asyncio.gather(*(one(p) for p in fixture.prompts)))


async def collect(client_a: EndpointClient, client_b: EndpointClient, fixture: Fixture, *, runs: int,
                  max_tokens: int, seed: int | None, concurrency: int = 1,
                  progress: Callable[[int], None] | None = None
                  ) -> tuple[list[list[Output]], list[list[Output]]]:
    """`runs` passes per endpoint, alternating A, B, A, B … so both see the same window."""
    runs_a: list[list[Output]] = []
    runs_b: list[list[Output]] = []
    for _ in range(runs):
        runs_a.append(await run_fixture(client_a, fixture, max_tokens=max_tokens, seed=seed,
                                        concurrency=concurrency, progress=progress))
        runs_b.append(await run_fixture(client_b, fixture, max_tokens=max_tokens, seed=seed,
                                        concurrency=concurrency, progress=progress))
    return runs_a, runs_b


# --- recordings: compare across boots that cannot be up at the same time -------------------------
RECORD_FORMAT = "recipegen-parity-record"
RECORD_VERSION = 1


def record_json(fixture: Fixture, runs: Sequence[Sequence[Output]], identity: dict, settings: dict) -> dict:
    return {"format": RECORD_FORMAT, "version": RECORD_VERSION, "fixture": fixture.name,
            "prompt_ids": [p.id for p in fixture.prompts], "settings": settings, "endpoint": identity,
            "runs": [[{"text": o.text, "token_ids": None if o.token_ids is None else list(o.token_ids)}
                      for o in run] for run in runs]}


def read_record(data: object, fixture: Fixture, settings: dict, *, file: str) -> tuple[list[list[Output]], dict]:
    """Runs and endpoint identity from a recording; refuses one made with another fixture or settings."""
    from recipegen.common.errors import InputError

    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        raise InputError(f"not a parity recording (expected \"format\": \"{RECORD_FORMAT}\")", file=file,
                         field="format")
    if data.get("version") != RECORD_VERSION:
        raise InputError(f"recording version {data.get('version')!r}; this recipegen reads {RECORD_VERSION}",
                         file=file, field="version")
    if data.get("prompt_ids") != [p.id for p in fixture.prompts]:
        raise InputError(f"recorded with another fixture ({data.get('fixture')}); use the same --fixture",
                         file=file, field="prompt_ids")
    recorded = data.get("settings") or {}
    for key in ("max_tokens", "seed"):
        if recorded.get(key) != settings.get(key):
            raise InputError(f"recorded with {key}={recorded.get(key)!r}, this run uses {settings.get(key)!r}",
                             file=file, field=f"settings.{key}")
    runs_raw = data.get("runs")
    if not isinstance(runs_raw, list) or not runs_raw:
        raise InputError("the recording holds no runs", file=file, field="runs")
    runs: list[list[Output]] = []
    for r, run in enumerate(runs_raw):
        if not isinstance(run, list) or len(run) != len(fixture.prompts):
            raise InputError(f"run {r} does not answer every prompt", file=file, field=f"runs[{r}]")
        outputs = []
        for item in run:
            ids = item.get("token_ids") if isinstance(item, dict) else None
            outputs.append(Output(text=str(item.get("text", "")) if isinstance(item, dict) else "",
                                  token_ids=tuple(int(t) for t in ids) if isinstance(ids, list) else None))
        runs.append(outputs)
    identity = data.get("endpoint") if isinstance(data.get("endpoint"), dict) else {}
    return runs, dict(identity, recording=file)
