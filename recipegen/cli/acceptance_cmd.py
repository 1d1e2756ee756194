"""`recipegen parity` and `recipegen knee`: acceptance instruments against running endpoints."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from recipegen.errors import InputError


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"cannot read {text!r} as a list of concurrencies (e.g. 1,8,16)",
                         field="--concurrency") from None
    if not values or any(v < 1 for v in values):
        raise InputError("concurrencies must be positive integers (e.g. 1,8,16)", field="--concurrency")
    return values


def _duration(text: str, option: str) -> float:
    raw = text.strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 1e-3), ("s", 1.0), ("m", 60.0)):
        if raw.endswith(suffix):
            raw, scale = raw[: -len(suffix)], factor
            break
    try:
        value = float(raw) * scale
    except ValueError:
        raise InputError(f"cannot read {text!r} as a duration (e.g. 60s, 2m)", field=option) from None
    if value < 0:
        raise InputError("a duration cannot be negative", field=option)
    return value


@click.command()
@click.argument("url_a")
@click.argument("url_b")
@click.option("--fixture", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON Lines fixture (default: the packaged 50-prompt fixture).")
@click.option("--runs", type=click.IntRange(1, 20), default=2, show_default=True,
              help="Passes per endpoint; 2+ separates serving nondeterminism from A≠B.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Requests in flight per endpoint (1 keeps batches identical between runs).")
@click.option("--model", "model_a", default=None, help="Model name on A (default: its first served model).")
@click.option("--model-b", default=None, help="Model name on B (default: its first served model).")
@click.option("--lane-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Log of lane A to read its start-up report from (else found via Docker for local lanes).")
@click.option("--lane-log-b", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the full result as JSON.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds per request.")
def parity(url_a: str, url_b: str, fixture: Path | None, runs: int, max_tokens: int, seed: int,
           concurrency: int, model_a: str | None, model_b: str | None, lane_log: Path | None,
           lane_log_b: Path | None, json_path: Path | None, timeout: float) -> None:
    """Greedy token-exact parity of URL_A (candidate) against URL_B (control).

    Exit status 1 when A differs from B beyond A's own run-to-run nondeterminism.
    """
    from recipegen.acceptance.client import EndpointClient
    from recipegen.acceptance.fixture import load_fixture
    from recipegen.acceptance.identity import describe_endpoint
    from recipegen.acceptance.parity import collect, compare
    from recipegen.acceptance.report import parity_json, parity_text

    loaded = load_fixture(fixture)
    total = 2 * runs * len(loaded.prompts)

    async def main() -> tuple[Any, dict[str, Any]]:
        async with EndpointClient(url_a, model=model_a, timeout_s=timeout) as a, \
                EndpointClient(url_b, model=model_b, timeout_s=timeout) as b:
            identities = {"A": await describe_endpoint(a, lane_log=lane_log),
                          "B": await describe_endpoint(b, lane_log=lane_log_b)}
            with click.progressbar(length=total, label="parity", file=sys.stderr) as bar:
                runs_a, runs_b = await collect(a, b, loaded, runs=runs, max_tokens=max_tokens, seed=seed,
                                               concurrency=concurrency, progress=bar.update)
            return compare(loaded, runs_a, runs_b), identities

    report, identities = asyncio.run(main())
    click.echo(parity_text(report, identities, fixture_name=loaded.name))
    if json_path is not None:
        _write_json(json_path, parity_json(report, identities, {
            "fixture": loaded.name, "runs": runs, "max_tokens": max_tokens, "seed": seed,
            "concurrency": concurrency}))
    if not report.passed:
        raise SystemExit(1)


@click.command()
@click.argument("url")
@click.option("--concurrency", "concurrency_text", default="1,8,16", show_default=True,
              help="Comma-separated concurrency levels.")
@click.option("--duration", default="60s", show_default=True, help="Length of one measurement window.")
@click.option("--warmup", default="15s", show_default=True, help="Excluded warm-up before the windows.")
@click.option("--repetitions", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Measurement windows per level (their spread is reported).")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--compare", "control_url", default=None,
              help="Control endpoint: runs candidate, control, candidate (A B A) per level.")
@click.option("--fixture", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prompts to cycle (default: the packaged parity fixture).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask vLLM for exactly max_tokens per request.")
@click.option("--model", default=None, help="Model name (default: the endpoint's first model).")
@click.option("--lane-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None)
@click.option("--lane-log-b", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full result as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw tok/s and latency per concurrency to a PNG (needs matplotlib).")
def knee(url: str, concurrency_text: str, duration: str, warmup: str, repetitions: int, max_tokens: int,
         control_url: str | None, fixture: Path | None, ignore_eos: bool, model: str | None,
         lane_log: Path | None, lane_log_b: Path | None, json_path: Path | None, plot_path: Path | None) -> None:
    """Steady-state output tok/s and latency of URL at each concurrency."""
    from recipegen.acceptance.client import EndpointClient
    from recipegen.acceptance.fixture import load_fixture
    from recipegen.acceptance.identity import describe_endpoint
    from recipegen.acceptance.knee import run_knee
    from recipegen.acceptance.report import knee_json, knee_text

    levels = _concurrencies(concurrency_text)
    duration_s = _duration(duration, "--duration")
    if duration_s <= 0:
        raise InputError("the measurement window must be longer than zero", field="--duration")
    warmup_s = _duration(warmup, "--warmup")
    prompts = load_fixture(fixture).prompts

    async def main() -> Any:
        async with EndpointClient(url, model=model, max_connections=max(levels) + 4) as candidate:
            control = EndpointClient(control_url, max_connections=max(levels) + 4) if control_url else None
            try:
                endpoints = {"A": await describe_endpoint(candidate, lane_log=lane_log)}
                if control is not None:
                    endpoints["B"] = await describe_endpoint(control, lane_log=lane_log_b)
                result = await run_knee(candidate, prompts, concurrencies=levels, warmup_s=warmup_s,
                                        duration_s=duration_s, repetitions=repetitions, max_tokens=max_tokens,
                                        control=control, ignore_eos=ignore_eos,
                                        progress=lambda text: click.echo(f"… {text}", err=True))
                result.endpoints = endpoints
                return result
            finally:
                if control is not None:
                    await control.aclose()

    result = asyncio.run(main())
    click.echo(knee_text(result))
    if json_path is not None:
        _write_json(json_path, knee_json(result))
    if plot_path is not None:
        from recipegen.acceptance.plot import plot_knee
        plot_knee(result, plot_path)
        click.echo(f"plot written to {plot_path}")
