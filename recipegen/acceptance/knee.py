"""Knee runs: steady-state output tok/s and per-request latency at each concurrency.

At concurrency C, C closed-loop workers each stream one request after another (prompts
cycled from the fixture, greedy, fixed `max_tokens`, `ignore_eos` so every request is the
same length). After a warm-up that is excluded, the measurement is cut into `repetitions`
back-to-back windows of `duration` seconds while the load continues: a window's tok/s is
the tokens that *arrived* inside it divided by its length (streamed, so long requests do not
bunch their tokens at completion), and its latencies are those of the requests that started
after the warm-up and finished inside it. The spread across windows is the instrument's own
noise. `--compare` runs candidate, control, candidate (A B A) back to back, as the field reports did.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from recipegen.acceptance.client import EndpointClient, Request, StreamStats
from recipegen.acceptance.fixture import Prompt


@dataclass(frozen=True)
class Window:
    index: int
    start_s: float            # relative to the level's start
    duration_s: float
    tokens: int
    tok_s: float
    requests: int             # requests that started after warm-up and completed inside the window
    latency_mean_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    ttft_p50_s: float | None
    stream_tok_s_mean: float | None  # per-request decode rate: tokens ÷ latency


@dataclass(frozen=True)
class Spread:
    mean: float
    min: float
    max: float
    stdev: float

    @property
    def relative(self) -> float:
        """(max − min) ÷ mean: how far apart the repetitions are."""
        return (self.max - self.min) / self.mean if self.mean else 0.0


@dataclass(frozen=True)
class Level:
    label: str                # "A", "B", "A2" …
    url: str
    concurrency: int
    warmup_s: float
    windows: tuple[Window, ...]
    requests_total: int

    @property
    def tok_s(self) -> Spread:
        return spread([w.tok_s for w in self.windows])

    @property
    def latency_p50(self) -> float | None:
        values = [w.latency_p50_s for w in self.windows if w.latency_p50_s is not None]
        return statistics.median(values) if values else None

    @property
    def decode_rate(self) -> float | None:
        """The per-request decode rate: each request's tokens ÷ its latency, the mean over the
        requests of every window (each window's `stream_tok_s_mean` weighted by its requests)."""
        rated = [(w.stream_tok_s_mean, w.requests) for w in self.windows
                 if w.stream_tok_s_mean is not None and w.requests]
        total = sum(n for _, n in rated)
        return sum(rate * n for rate, n in rated) / total if total else None


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values")
    return Spread(mean=statistics.fmean(values), min=min(values), max=max(values),
                  stdev=statistics.stdev(values) if len(values) > 1 else 0.0)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def window_stats(streams: Sequence[StreamStats], *, index: int, start: float, end: float,
                 measure_start: float, origin: float) -> Window:
    """Statistics of one window [start, end) (monotonic seconds) over every request's arrivals."""
    tokens = sum(n for s in streams for t, n in s.arrivals if start <= t < end)
    done = [s for s in streams if s.end is not None and s.start >= measure_start and start <= s.end < end
            and s.finish_reason is not None]
    latencies = [s.end - s.start for s in done if s.end is not None]
    ttfts = [s.first_token - s.start for s in done if s.first_token is not None]
    rates = [s.tokens / (s.end - s.start) for s in done if s.end is not None and s.end > s.start]
    return Window(index=index, start_s=start - origin, duration_s=end - start, tokens=tokens,
                  tok_s=tokens / (end - start), requests=len(done),
                  latency_mean_s=statistics.fmean(latencies) if latencies else None,
                  latency_p50_s=_quantile(latencies, 0.5), latency_p90_s=_quantile(latencies, 0.9),
                  ttft_p50_s=_quantile(ttfts, 0.5),
                  stream_tok_s_mean=statistics.fmean(rates) if rates else None)


async def run_level(client: EndpointClient, prompts: Sequence[Prompt], *, label: str, concurrency: int,
                    warmup_s: float, duration_s: float, repetitions: int, max_tokens: int,
                    ignore_eos: bool = True, clock: Callable[[], float] = time.monotonic) -> Level:
    """Load the endpoint with `concurrency` closed-loop streams and measure `repetitions` windows."""
    if concurrency < 1 or repetitions < 1 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("concurrency and repetitions must be >= 1, duration > 0, warm-up >= 0")
    if not prompts:
        raise ValueError("no prompts to send")
    streams: list[StreamStats] = []
    origin = clock()
    measure_start = origin + warmup_s
    stop_at = measure_start + duration_s * repetitions

    async def worker(slot: int) -> None:
        i = slot
        while clock() < stop_at:
            prompt = prompts[i % len(prompts)]
            i += concurrency
            request = Request(prompt=prompt.prompt, messages=prompt.messages, tools=prompt.tools,
                              max_tokens=max_tokens, seed=None, temperature=0.0, ignore_eos=ignore_eos)
            stats = StreamStats(start=clock())
            streams.append(stats)
            async for _ in client.stream_events(request, stats):
                pass

    tasks = [asyncio.create_task(worker(slot)) for slot in range(concurrency)]
    try:
        done, _ = await asyncio.wait(tasks, timeout=max(0.0, stop_at - clock()),
                                     return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    windows = tuple(window_stats(streams, index=r, start=measure_start + r * duration_s,
                                 end=measure_start + (r + 1) * duration_s, measure_start=measure_start,
                                 origin=origin) for r in range(repetitions))
    return Level(label=label, url=client.base_url, concurrency=concurrency, warmup_s=warmup_s,
                 windows=windows, requests_total=len(streams))


@dataclass
class KneeResult:
    levels: list[Level] = field(default_factory=list)
    endpoints: dict[str, dict] = field(default_factory=dict)  # label -> lane identity (models, report, hashes)
    settings: dict[str, object] = field(default_factory=dict)

    def by_label(self, label: str) -> list[Level]:
        return [lv for lv in self.levels if lv.label == label]


@dataclass(frozen=True)
class Comparison:
    concurrency: int
    candidate: Spread          # both candidate legs' windows pooled
    control: Spread
    candidate_drift: float     # |A2 − A1| ÷ mean(A): the candidate's own movement across the window

    @property
    def change(self) -> float:
        return self.candidate.mean / self.control.mean - 1.0 if self.control.mean else 0.0


def compare_levels(result: KneeResult) -> list[Comparison]:
    """Candidate (A, A2) against control (B) at each concurrency of an A B A run."""
    out = []
    for level_b in result.by_label("B"):
        legs = [lv for lv in result.levels if lv.label in ("A", "A2") and lv.concurrency == level_b.concurrency]
        if len(legs) != 2:
            continue
        a1, a2 = legs
        pooled = spread([w.tok_s for lv in legs for w in lv.windows])
        drift = abs(a2.tok_s.mean - a1.tok_s.mean) / pooled.mean if pooled.mean else 0.0
        out.append(Comparison(concurrency=level_b.concurrency, candidate=pooled, control=level_b.tok_s,
                              candidate_drift=drift))
    return out


async def run_knee(candidate: EndpointClient, prompts: Sequence[Prompt], *, concurrencies: Sequence[int],
                   warmup_s: float, duration_s: float, repetitions: int, max_tokens: int,
                   control: EndpointClient | None = None, ignore_eos: bool = True,
                   progress: Callable[[str], None] | None = None) -> KneeResult:
    """Every concurrency on the candidate, or A B A per concurrency with a control."""
    result = KneeResult(settings={"concurrency": list(concurrencies), "warmup_s": warmup_s,
                                  "duration_s": duration_s, "repetitions": repetitions,
                                  "max_tokens": max_tokens, "ignore_eos": ignore_eos})
    legs: list[tuple[str, EndpointClient]] = [("A", candidate)]
    if control is not None:
        legs = [("A", candidate), ("B", control), ("A2", candidate)]
    for concurrency in concurrencies:
        for label, client in legs:
            if progress:
                progress(f"{label} {client.base_url} at concurrency {concurrency}")
            result.levels.append(await run_level(client, prompts, label=label, concurrency=concurrency,
                                                 warmup_s=warmup_s, duration_s=duration_s,
                                                 repetitions=repetitions, max_tokens=max_tokens,
                                                 ignore_eos=ignore_eos))
    return result
