"""The runtime's environment, parsed once per process (standard library only). The variables'
names and meanings are defined in ``contract.env``: ``EXPERT_RESIDENCY_MODE``, ``_ROWMAP``,
``_CONTENT_HASH``, ``_DUMP_DIR``, ``_DUMP_INTERVAL_S``, ``_LANE``, ``_CLASS``, ``_PER_PICK``; the
metrics variables (``metrics.config``) and ``EXPERT_RESIDENCY_ADAPTIVE`` (checked with
``core.adaptive_setup``'s parser; the worker parses it again to build the policy).

Modes:

* ``count``: every routed pick of every MoE layer is counted (the profile boot); vLLM's own
  expert kernel runs unchanged.
* ``residency``: experts re-homed into hot/cold banks per the row map; split invoke + one finalize.
* ``unsplit``: the bit-identity reference — every expert in one bank, same per-pick kernel and
  finalize as ``residency``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from expert_residency.contract.env import CLASS as ENV_CLASS
from expert_residency.contract.env import CONTENT_HASH as ENV_CONTENT_HASH
from expert_residency.contract.env import DUMP_DIR as ENV_DUMP_DIR
from expert_residency.contract.env import LANE as ENV_LANE
from expert_residency.contract.env import MODE as ENV_MODE
from expert_residency.contract.env import PER_PICK as ENV_PER_PICK
from expert_residency.contract.env import ROWMAP as ENV_ROWMAP
from expert_residency.core.adaptive_setup import adaptive_from_env
from expert_residency.core.dump import DEFAULT_INTERVAL_S, ENV_INTERVAL, interval_from_env
from expert_residency.metrics.config import MetricsConfig, metrics_from_env

ENV_DUMP_INTERVAL_S = ENV_INTERVAL
PER_PICK_CHOICES = ("auto", "cpu", "modular")

MODE_OFF = "off"
MODE_COUNT = "count"
MODE_RESIDENCY = "residency"
MODE_UNSPLIT = "unsplit"
MODES = (MODE_OFF, MODE_COUNT, MODE_RESIDENCY, MODE_UNSPLIT)
# Spellings used by other parts of the runtime (dump file names, report lines).
_ALIASES = {"count-only": MODE_COUNT, "": MODE_OFF}

DEFAULT_DUMP_INTERVAL_S = DEFAULT_INTERVAL_S
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class SettingsError(ValueError):
    """A runtime environment variable has a bad value; the message names the variable."""


@dataclass(frozen=True)
class PluginSettings:
    mode: str
    rowmap_path: str | None = None
    content_hash: str | None = None
    dump_dir: str | None = None
    dump_interval_s: float = DEFAULT_DUMP_INTERVAL_S
    lane: str = "lane"
    traffic_class: str = "none"
    per_pick: str = "auto"
    metrics: MetricsConfig | None = None   # EXPERT_RESIDENCY_METRICS (docs/metrics.md)

    @property
    def active(self) -> bool:
        return self.mode != MODE_OFF

    @property
    def splits_experts(self) -> bool:
        """Modes that run the runtime's split invoke + finalize (instead of vLLM's kernel)."""
        return self.mode in (MODE_RESIDENCY, MODE_UNSPLIT)

    @property
    def dump_mode_name(self) -> str:
        """The mode as the dump writer and report line spell it."""
        return "count-only" if self.mode == MODE_COUNT else self.mode


def load_settings(environ: Mapping[str, str] | None = None) -> PluginSettings:
    """Parse the environment; raises SettingsError naming the variable on a bad value."""
    env = os.environ if environ is None else environ
    raw_mode = env.get(ENV_MODE, "").strip().lower()
    mode = _ALIASES.get(raw_mode, raw_mode)
    if mode not in MODES:
        raise SettingsError(f"{ENV_MODE}={env.get(ENV_MODE)!r}: expected one of {', '.join(MODES)}")
    rowmap = env.get(ENV_ROWMAP, "").strip() or None
    content_hash = env.get(ENV_CONTENT_HASH, "").strip().lower() or None
    if content_hash is not None and not _HEX64.match(content_hash):
        raise SettingsError(f"{ENV_CONTENT_HASH}={content_hash!r}: expected 64 hex digits (sha256)")
    try:
        interval = interval_from_env(env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    lane = env.get(ENV_LANE, "").strip() or "lane"
    traffic_class = env.get(ENV_CLASS, "").strip() or "none"
    for variable, value in ((ENV_LANE, lane), (ENV_CLASS, traffic_class)):
        if not _NAME.match(value) or "__" in value:
            raise SettingsError(f"{variable}={value!r}: use letters, digits, '.', '_' or '-' "
                                "(no '__', not starting with a symbol)")
    per_pick = env.get(ENV_PER_PICK, "").strip().lower() or "auto"
    if per_pick not in PER_PICK_CHOICES:
        raise SettingsError(f"{ENV_PER_PICK}={per_pick!r}: expected one of "
                            f"{', '.join(PER_PICK_CHOICES)}")
    try:
        metrics = metrics_from_env(env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    # Checked here so that a bad spec refuses in the API server, before any engine process; the
    # worker parses it again (same parser) where it builds the policy.
    try:
        adaptive_from_env(env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    settings = PluginSettings(mode=mode, rowmap_path=rowmap, content_hash=content_hash, per_pick=per_pick,
                              dump_dir=env.get(ENV_DUMP_DIR, "").strip() or None,
                              dump_interval_s=interval, lane=lane, traffic_class=traffic_class,
                              metrics=metrics)
    if mode == MODE_RESIDENCY:
        if rowmap is None:
            raise SettingsError(f"{ENV_MODE}=residency needs {ENV_ROWMAP} (the row map to pin)")
        if content_hash is None:
            raise SettingsError(f"{ENV_MODE}=residency needs {ENV_CONTENT_HASH} (the content_hash "
                                "the recipe rendered for that row map)")
    return settings
