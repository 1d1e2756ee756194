"""The metrics settings from the environment (standard library only): parsed once in every process
by the plugin's settings, so a bad value refuses the boot in the API server, naming the variable."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..contract import env
from ..contract.metrics import DEFAULT_INTERVAL_S, DEFAULT_WINDOW_S, MULTIPROC_DIR_ENV

_ON = {"on", "1", "true", "yes"}
_OFF = {"", "off", "0", "false", "no"}


@dataclass(frozen=True)
class MetricsConfig:
    interval_s: float = DEFAULT_INTERVAL_S
    window_s: float = DEFAULT_WINDOW_S
    predicted_cold_share: float | None = None
    multiproc_dir: str = ""


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={raw!r}: must be a positive number of seconds")
    return value


def metrics_from_env(environ: Mapping[str, str] | None = None) -> MetricsConfig | None:
    """The metrics configuration, or None when ``EXPERT_RESIDENCY_METRICS`` is unset or ``off``.

    Raises ValueError naming the variable on a bad value, and when metrics are on without a
    ``PROMETHEUS_MULTIPROC_DIR`` folder (the worker's series would reach no ``/metrics``)."""
    environ = os.environ if environ is None else environ
    switch = environ.get(env.METRICS, "").strip().lower()
    if switch in _OFF:
        return None
    if switch not in _ON:
        raise ValueError(f"{env.METRICS}={environ.get(env.METRICS)!r}: expected on or off")
    interval = _seconds(environ, env.METRICS_INTERVAL_S, DEFAULT_INTERVAL_S)
    window = _seconds(environ, env.METRICS_WINDOW_S, DEFAULT_WINDOW_S)
    if window < interval:
        raise ValueError(f"{env.METRICS_WINDOW_S}={window:g} is shorter than "
                         f"{env.METRICS_INTERVAL_S}={interval:g}: a window holds at least one read")
    raw = environ.get(env.PREDICTED_COLD_SHARE, "").strip()
    predicted = None
    if raw:
        try:
            predicted = float(raw)
        except ValueError:
            raise ValueError(f"{env.PREDICTED_COLD_SHARE}={raw!r}: not a number") from None
        if not 0.0 <= predicted <= 1.0:  # also refuses NaN
            raise ValueError(f"{env.PREDICTED_COLD_SHARE}={raw!r}: a share in [0, 1]")
    folder = environ.get(MULTIPROC_DIR_ENV, "").strip()
    if not folder:
        raise ValueError(f"{env.METRICS}=on needs {MULTIPROC_DIR_ENV} (an empty folder, a tmpfs in "
                         "the rendered service): the worker's series reach the lane's /metrics "
                         "through it")
    if not os.path.isdir(folder):
        raise ValueError(f"{MULTIPROC_DIR_ENV}={folder!r} is not a folder")
    return MetricsConfig(interval, window, predicted, folder)
