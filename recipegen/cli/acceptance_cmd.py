"""`recipegen parity` and `recipegen knee`: acceptance instruments against running endpoints."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from expert_residency.formats import atomic_write_text

from recipegen.acceptance.timeouts import IDENTITY_TIMEOUT_S, REQUEST_TIMEOUT_S
from recipegen.cli.types import FiniteFloat
from recipegen.common.errors import InputError
from recipegen.common.units import format_count

if TYPE_CHECKING:
    from recipegen.acceptance.client import EndpointClient


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


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


# One definition for both commands: the same option, help and default on parity and knee.
_timeout_option = click.option(
    "--timeout", type=FiniteFloat(0.0, min_open=True), default=REQUEST_TIMEOUT_S, show_default=True,
    help="Seconds to wait for each request's answer (the first requests, /v1/models and /version, "
         f"wait at most {IDENTITY_TIMEOUT_S:g} s).")


def _say(text: str) -> None:
    """A progress line on stderr, in knee's "… what now" form (stdout keeps the report)."""
    click.echo(f"… {text}", err=True)


async def _identify(client: EndpointClient, *, lane_log: Path | None) -> dict[str, Any]:
    """The endpoint's identity (the run's first requests), announced first: a dead server is
    reported after the short identity timeout, not after --timeout."""
    from recipegen.acceptance.identity import describe_endpoint

    _say(f"asking {client.base_url} what it serves (/v1/models, /version; up to {client.identity_timeout_s:g} s)")
    return await describe_endpoint(client, lane_log=lane_log, strict=True)


@click.command()
@click.argument("url_a")
@click.argument("url_b", required=False)
@click.option("--fixture", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON Lines fixture (default: the packaged 50-prompt fixture).")
@click.option("--runs", type=click.IntRange(1, 20), default=2, show_default=True,
              help="Passes per live endpoint; 2+ separates serving nondeterminism from A≠B.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Greedy tokens generated per prompt (compared token by token).")
@click.option("--seed", type=int, default=42, show_default=True,
              help="Sampling seed sent with every request (greedy decoding does not use it; kept equal on A and B).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Requests in flight per endpoint (1 keeps batches identical between runs).")
@click.option("--record", "record_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Record URL_A's runs to this file (no comparison); compare later by passing the file "
                   "in place of a URL — for boots that cannot be up at the same time.")
@click.option("--model", "model_a", default=None, help="Model name on A (default: its first served model).")
@click.option("--model-b", default=None, help="Model name on B (default: its first served model).")
@click.option("--lane-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Log of lane A to read its start-up report from (else found via Docker for local lanes).")
@click.option("--lane-log-b", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Log of lane B (the control) to read its start-up report from.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the full result as JSON.")
@_timeout_option
def parity(url_a: str, url_b: str | None, fixture: Path | None, runs: int, max_tokens: int, seed: int,
           concurrency: int, record_path: Path | None, model_a: str | None, model_b: str | None,
           lane_log: Path | None, lane_log_b: Path | None, json_path: Path | None, timeout: float) -> None:
    """Greedy token-exact parity of URL_A (candidate) against URL_B (control).

    Either side may be a recording made with --record instead of a live URL. Exit status 1
    when A differs from B beyond A's own run-to-run nondeterminism.
    """
    from recipegen.acceptance.client import EndpointClient
    from recipegen.acceptance.fixture import load_fixture
    from recipegen.acceptance.parity import compare, read_record, record_json, run_fixture
    from recipegen.acceptance.report import parity_json, parity_text, parity_user_text

    loaded = load_fixture(fixture)
    settings = {"fixture": loaded.name, "runs": runs, "max_tokens": max_tokens, "seed": seed,
                "temperature": 0.0, "concurrency": concurrency}
    if record_path is not None and url_b is not None:
        raise InputError("--record takes one endpoint (URL_A); compare the recording later", field="--record")
    if record_path is None and url_b is None:
        raise InputError("give URL_B to compare against, or --record FILE to record URL_A", field="URL_B")

    def recorded(source: str) -> tuple[list, dict] | None:
        path = Path(source)
        if "://" in source or not path.is_file():
            return None
        from expert_residency.formats._io import read_regular_file

        try:
            data = json.loads(read_regular_file(path, limit=1 << 30).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InputError(f"cannot read parity recording: {exc}", file=str(path)) from None
        return read_record(data, loaded, settings, file=str(path))

    sides = {"A": (url_a, model_a, lane_log), "B": (url_b, model_b, lane_log_b)} if url_b else \
        {"A": (url_a, model_a, lane_log)}
    results: dict[str, list] = {}
    identities: dict[str, dict[str, Any]] = {}
    live: dict[str, tuple[str, str | None, Path | None]] = {}
    for label, (source, model, log) in sides.items():
        record = recorded(source)
        if record is None:
            live[label] = (source, model, log)
        else:
            results[label], identities[label] = record

    async def main() -> None:
        clients = {label: EndpointClient(source, model=model, timeout_s=timeout)
                   for label, (source, model, _) in live.items()}
        try:
            for label, client in clients.items():
                identities[label] = await _identify(client, lane_log=live[label][2])
            total = runs * len(loaded.prompts) * len(clients)
            _say(f"{format_count(runs, 'run')} of {format_count(len(loaded.prompts), 'prompt')} on "
                 f"{' and '.join(clients)}; waiting for the first answer from {next(iter(clients.values())).base_url} "
                 f"(up to {timeout:g} s a request, --timeout)")
            with click.progressbar(length=total, label="parity", file=sys.stderr) as bar:
                for _ in range(runs):  # alternate the live endpoints run by run: one window
                    for label, client in clients.items():
                        results.setdefault(label, []).append(await run_fixture(
                            client, loaded, max_tokens=max_tokens, seed=seed, concurrency=concurrency,
                            progress=bar.update))
        finally:
            for client in clients.values():
                await client.aclose()

    if live:
        asyncio.run(main())
    if record_path is not None:
        _write_json(record_path, record_json(loaded, results["A"], identities["A"], settings))
        click.echo(f"recorded {format_count(len(results['A']), 'run')} of {format_count(len(loaded.prompts), 'prompt')} from {url_a} "
                   f"to {record_path}")
        return
    report = compare(loaded, results["A"], results["B"])
    _explained(parity_text(report, identities, fixture_name=loaded.name, settings=settings),
               parity_user_text(report, identities, fixture_name=loaded.name))
    if json_path is not None:
        _write_json(json_path, parity_json(report, identities, settings))
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
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Output tokens per request (with --ignore-eos, exactly this many).")
@click.option("--compare", "control_url", default=None,
              help="Control endpoint: runs candidate, control, candidate (A B A) per level.")
@click.option("--fixture", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prompts to cycle (default: the packaged parity fixture).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask vLLM for exactly max_tokens per request.")
@click.option("--model", default=None, help="Model name (default: the endpoint's first model).")
@click.option("--lane-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Log of the lane to read its start-up report from (else found via Docker for local lanes).")
@click.option("--lane-log-b", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Log of lane B (the control) to read its start-up report from.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full result as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw tok/s and latency per concurrency to a PNG (needs matplotlib: "
                   "pip install 'recipegen[plot]').")
@_timeout_option
def knee(url: str, concurrency_text: str, duration: str, warmup: str, repetitions: int, max_tokens: int,
         control_url: str | None, fixture: Path | None, ignore_eos: bool, model: str | None,
         lane_log: Path | None, lane_log_b: Path | None, json_path: Path | None, plot_path: Path | None,
         timeout: float) -> None:
    """Steady-state output tok/s and latency of URL at each concurrency."""
    from recipegen.acceptance.client import EndpointClient
    from recipegen.acceptance.fixture import load_fixture
    from recipegen.acceptance.knee import run_knee
    from recipegen.acceptance.report import knee_json, knee_text, knee_user_text

    if plot_path is not None:  # before minutes of measuring: a missing matplotlib fails now
        from recipegen.common.plotting import plot_target, pyplot

        plot_target(plot_path)
        pyplot()
    levels = _concurrencies(concurrency_text)
    duration_s = _duration(duration, "--duration")
    if duration_s <= 0:
        raise InputError("the measurement window must be longer than zero", field="--duration")
    warmup_s = _duration(warmup, "--warmup")
    prompts = load_fixture(fixture).prompts

    async def main() -> Any:
        async with EndpointClient(url, model=model, max_connections=max(levels) + 4,
                                  timeout_s=timeout) as candidate:
            control = EndpointClient(control_url, max_connections=max(levels) + 4,
                                     timeout_s=timeout) if control_url else None
            try:
                endpoints = {"A": await _identify(candidate, lane_log=lane_log)}
                if control is not None:
                    endpoints["B"] = await _identify(control, lane_log=lane_log_b)
                result = await run_knee(candidate, prompts, concurrencies=levels, warmup_s=warmup_s,
                                        duration_s=duration_s, repetitions=repetitions, max_tokens=max_tokens,
                                        control=control, ignore_eos=ignore_eos, progress=_say)
                result.endpoints = endpoints
                return result
            finally:
                if control is not None:
                    await control.aclose()

    result = asyncio.run(main())
    _explained(knee_text(result), knee_user_text(result))
    if json_path is not None:
        _write_json(json_path, knee_json(result))
    if plot_path is not None:
        from recipegen.acceptance.plot import plot_knee
        plot_knee(result, plot_path)
        click.echo(f"plot written to {plot_path}")


def _explained(text: str, user_text: list[str]) -> None:
    """A report for people, its shorthand explained after it (in recipegen's words only: the
    endpoints' URLs, what their servers and recordings said and the fixture's own text are left out)."""
    from recipegen.cli.output import explained

    with explained(user_text) as say:
        say(text)
