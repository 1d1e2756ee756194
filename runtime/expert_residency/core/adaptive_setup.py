"""How a serving container would configure the adaptive policy: one environment variable for the
parameters, one for the class profiles used as priors.

``EXPERT_RESIDENCY_ADAPTIVE``: unset, empty or ``off`` = adaptive residency off (the default);
``on`` = every parameter at its default; otherwise comma-separated ``name=value`` pairs over
``AdaptiveConfig``'s fields, e.g. ``interval=16,swaps_per_layer=4,decay=0.9``. The renderer (a
later change) would write it from the recipe's ``offload.adaptive``; ``format_adaptive_spec`` is
the inverse, so the two round-trip.

``EXPERT_RESIDENCY_ADAPTIVE_PRIORS``: comma-separated histogram files (the lane's class
histograms, mounted like the row map). Each becomes one prior named by the histogram's
``meta.class`` (else the file's stem), restricted to the MoE layers this worker holds.

Parsing errors raise ``ValueError`` naming the variable and the field; nothing here touches a device.
The spec's parsing is standard library only (numpy is imported by the priors' reader), so the
plugin's settings check ``EXPERT_RESIDENCY_ADAPTIVE`` in vLLM's API server, before any engine
process starts, with this same parser the worker uses.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..contract.env import ADAPTIVE as ENV_ADAPTIVE
from ..contract.env import ADAPTIVE_PRIORS as ENV_PRIORS
from .adaptive_config import AdaptiveConfig

if TYPE_CHECKING:
    import numpy as np

_OFF = ("", "off", "0", "false", "no")
_ON = ("on", "1", "true", "yes")


def parse_adaptive_spec(text: str, *, source: str = ENV_ADAPTIVE) -> AdaptiveConfig | None:
    """``None`` when off, else the ``AdaptiveConfig`` the spec describes (see the module docstring)."""
    raw = text.strip()
    if raw.lower() in _OFF:
        return None
    if raw.lower() in _ON:
        return AdaptiveConfig()
    fields = {f.name: f.type for f in dataclasses.fields(AdaptiveConfig)}
    values: dict[str, object] = {}
    for item in raw.split(","):
        name, sep, value = item.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"{source}={text!r}: {item.strip()!r} is not name=value")
        if name not in fields:
            raise ValueError(f"{source}: unknown field {name!r} (fields: {', '.join(fields)})")
        if name in values:
            raise ValueError(f"{source}: field {name!r} given twice")
        kind = {int: int, "int": int, str: str, "str": str}.get(fields[name], float)
        try:
            values[name] = kind(value)
        except ValueError:
            want = "an integer" if kind is int else "a number"  # str never fails here
            raise ValueError(f"{source}: field {name!r} = {value!r} is not {want}") from None
    try:
        return AdaptiveConfig(**values)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def format_adaptive_spec(config: AdaptiveConfig | None) -> str:
    """The spec text for ``config`` (``off`` for None); ``parse_adaptive_spec`` reads it back."""
    if config is None:
        return "off"
    def text(value: object) -> str:
        return value if isinstance(value, str) else repr(value)

    return ",".join(f"{f.name}={text(getattr(config, f.name))}" for f in dataclasses.fields(AdaptiveConfig))


def adaptive_from_env(env: Mapping[str, str] | None = None) -> AdaptiveConfig | None:
    """``parse_adaptive_spec`` of ``$EXPERT_RESIDENCY_ADAPTIVE`` (None when off or unset)."""
    env = os.environ if env is None else env
    return parse_adaptive_spec(env.get(ENV_ADAPTIVE, ""))


def priors_from_histograms(paths: Sequence[str | os.PathLike[str]],
                           moe_layer_indices: Sequence[int], num_experts: int) -> dict[str, np.ndarray]:
    """Per-class per-pick probabilities ``float64 [len(moe_layer_indices), num_experts]`` from
    histogram files, rows in ``moe_layer_indices`` order (a pipeline stage passes its own layers).

    A layer with no counts gets a uniform row (nothing known is not "never picked").
    """
    import numpy as np

    from ..formats.histogram import load_histogram

    priors: dict[str, np.ndarray] = {}
    for path in paths:
        hist = load_histogram(path)
        if hist.num_experts != num_experts:
            raise ValueError(f"{ENV_PRIORS}: {path}: {hist.num_experts} experts, the model has {num_experts}")
        missing = [i for i in moe_layer_indices if i not in hist.moe_layer_indices]
        if missing:
            raise ValueError(f"{ENV_PRIORS}: {path}: no counts for MoE layer(s) {missing[:5]}")
        rows = hist.counts[[hist.layer_row(i) for i in moe_layer_indices]].astype(np.float64)
        totals = rows.sum(axis=1, keepdims=True)
        probs = np.where(totals > 0, rows / np.where(totals > 0, totals, 1.0), 1.0 / num_experts)
        name = str(hist.meta.get("class") or Path(path).stem)
        if name in priors:
            raise ValueError(f"{ENV_PRIORS}: two histograms for class {name!r} ({path})")
        priors[name] = probs
    return priors


def priors_from_env(moe_layer_indices: Sequence[int], num_experts: int,
                    env: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """``priors_from_histograms`` of the files in ``$EXPERT_RESIDENCY_ADAPTIVE_PRIORS`` ({} when unset)."""
    env = os.environ if env is None else env
    paths = [p.strip() for p in env.get(ENV_PRIORS, "").split(",") if p.strip()]
    return priors_from_histograms(paths, moe_layer_indices, num_experts)
