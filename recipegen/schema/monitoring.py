"""`monitoring`: the lanes' Prometheus metrics and the `monitoring` compose profile (docs/metrics.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from recipegen.schema.base import StrictModel
from recipegen.schema.patterns import (
    IPV4,
    MAX_SCRAPE_INTERVAL_S,
    MINUTES,
    PROMETHEUS_LOOKBACK_S,
    RETENTION,
    SECONDS,
)


class Monitoring(StrictModel):
    """Residency metrics and a monitoring stack. Present (`monitoring: {}` takes every default):
    every lane that runs the residency runtime exports the `expert_residency_*` series on its own
    `/metrics` beside vLLM's (a background thread reads the usage counter every `scrape_interval`),
    and the rendering gains two services behind the compose profile `monitoring` — Prometheus
    scraping each lane, with the cold-share drift alert and an alert for series that stopped
    updating, and Grafana with the expert-residency
    dashboard — started only when asked (`docker compose --profile monitoring up -d`). Absent: no
    metrics thread, no monitoring services (the default)."""

    scrape_interval: str = Field(default="15s", pattern=SECONDS.regex)
    """How often Prometheus scrapes each lane and the runtime reads its counter, in seconds with
    the unit (`15s`), at most `300s`: Prometheus forgets an instant series 5 minutes after its last
    sample (its default query lookback), so between scrapes further apart the lane's `up` and
    cold-share series vanish and the alerts would fire or not depending on when the scrape
    happened."""
    window: str = Field(default="5m", pattern=MINUTES.regex)
    """The window of the runtime's window gauges (cold share, hot-hit ratio per layer) and of the
    drift alert's rates, in minutes with the unit (`5m`); at least two scrapes long."""
    drift_for: str = Field(default="15m", pattern=MINUTES.regex)
    """How long the live cold share must exceed the ledger's prediction by more than 2 percentage points
    before the `ExpertResidencyColdShareDrift` alert fires, in minutes with the unit. Through a
    pause in traffic no longer than this the alert keeps the lane's last share with traffic, so a
    lane that idles between bursts still alerts."""
    retention: str = Field(default="15d", pattern=RETENTION.regex)
    """How long Prometheus keeps samples (`--storage.tsdb.retention.time`), with its unit
    (`h`, `d` or `w`)."""
    bind_address: str = Field(default="127.0.0.1", pattern=IPV4.regex)
    """The host address Prometheus' and Grafana's ports are published on (IPv4). The default
    keeps them on the machine itself (reach them over SSH); `0.0.0.0` publishes them to every
    network the machine is on (Grafana lets anonymous visitors view the dashboard)."""
    prometheus_port: int = Field(default=9090, ge=1, le=65535)
    """Host port of Prometheus' web interface and API."""
    grafana_port: int = Field(default=3000, ge=1, le=65535)
    """Host port of Grafana."""

    @field_validator("scrape_interval")
    @classmethod
    def _scrapes_within_the_lookback(cls, value: str) -> str:
        if int(value[:-1]) > MAX_SCRAPE_INTERVAL_S:
            raise ValueError(f"{value!r} is above {MAX_SCRAPE_INTERVAL_S}s: Prometheus forgets an instant "
                             f"series {PROMETHEUS_LOOKBACK_S // 60} minutes after its last sample (its "
                             "default query lookback), so with scrapes further apart the lane's `up` "
                             "and cold-share series vanish between samples and the alerts fire or not "
                             f"by chance; scrape at most every {MAX_SCRAPE_INTERVAL_S}s (e.g. 15s)")
        return value

    @property
    def scrape_interval_s(self) -> int:
        return int(self.scrape_interval[:-1])

    @property
    def window_s(self) -> int:
        return 60 * int(self.window[:-1])
