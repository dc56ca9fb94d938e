"""A Prometheus of its own (Debian's /usr/bin/prometheus) scraping the end-to-end stack.

It writes a prometheus.yml with one static job per service (job = the service name, as
the ServiceMonitor's jobLabel sets it in Kubernetes), keeps its TSDB in a scratch
directory, listens on a free loopback port and answers PromQL through its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from stack import free_port

PROMETHEUS = "/usr/bin/prometheus"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "observability" / "alerts.rules.yml"  # recorded series too
READY_TIMEOUT_S = 30.0


@dataclass
class LocalPrometheus:
    targets: Mapping[str, int]  # job (service) -> its /metrics port on 127.0.0.1
    workdir: Path
    scrape_interval_s: int = 1
    binary: str = PROMETHEUS
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        interval = f"{self.scrape_interval_s}s"
        return {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in sorted(self.targets.items())
            ],
        }

    def start(self) -> None:
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"no {self.binary}: apt-get install prometheus")
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False), encoding="utf-8")
        argv = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self.started_at = time.monotonic()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {READY_TIMEOUT_S}s; see {self.log_path}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns `data`, raises on an error answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as error:  # a bad query answers 400 with the reason in the body
            body = json.load(error)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: a list of {"metric": labels, "value": [time, "text"]} (vectors only)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr}: a {data['resultType']}, not an instant vector")
        return list(data["result"])

    def targets_health(self) -> dict[str, str]:
        """job -> health ("up", "down", "unknown") of the active targets."""
        active = self.api("targets", state="active")["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}

    def seconds_running(self) -> float:
        return time.monotonic() - self.started_at
