"""A real Prometheus server for the tests: Debian's `prometheus` (2.42, scripts/setup-prometheus.sh),
started on loopback with a generated configuration, queried through its HTTP API, stopped at the end.
"""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def prometheus_available() -> bool:
    return Path(PROMETHEUS).is_file() and Path(PROMTOOL).is_file()


SKIP_REASON = "Debian's prometheus package is absent (install it with scripts/setup-prometheus.sh)"


def promtool_alert_test(folder: Path, rules_file: Path, series: list[dict], checks: list[dict]) -> None:
    """`promtool test rules` on `rules_file` with these input series (one sample a minute) and
    alert checks, written to a file in `folder`; fails the test with promtool's own report."""
    tests = {"rule_files": [str(rules_file)], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}]}
    path = folder / "alert_rule_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@dataclass
class PrometheusServer:
    workdir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, config: dict[str, Any]) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        check = subprocess.run([PROMTOOL, "check", "config", str(config_path)], capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        log = open(self.workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=info"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode}:\n"
                                     + self.log_text()[-3000:])
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError("prometheus not ready after 60 s:\n" + self.log_text()[-3000:])

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{'metric': {...}, 'value': float}]."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": _float(result[1])}]
        return [{"metric": s["metric"], "value": _float(s["value"][1])} for s in result]

    def targets(self) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/targets", timeout=10)
        return list(r.json()["data"]["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/rules", timeout=10)
        return [rule for group in r.json()["data"]["groups"] for rule in group["rules"]]


def _float(text: str) -> float:
    return math.nan if text == "NaN" else float(text)
