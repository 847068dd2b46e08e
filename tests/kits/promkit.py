"""A real `vox exporter` process and a real Prometheus scraping it, on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.kits.fleetproc import REPO, serving_vox, stop
from vox_mqtt.broker.local import free_port

ALERTS = REPO / "docs" / "vox-alerts.yml"


@dataclass
class Exporter:
    """`vox exporter` as a child process and where it serves."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def text(self) -> str:
        """Scrape /metrics over HTTP."""
        with urllib.request.urlopen(self.url, timeout=10) as response:
            body: bytes = response.read()
        return body.decode()

    def health(self) -> tuple[int, dict[str, Any]]:
        """GET /health: its status code and JSON body."""
        url = self.url.removesuffix("/metrics") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Scrape and return {(sample name, labels): value}."""
        out = {}
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def log(self) -> str:
        """Return what the exporter printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    """Return the one sample with this name whose labels include these, or None."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} samples"
    return found[0] if found else None


@contextlib.contextmanager
def run_exporter(config: Path, log_path: Path) -> Iterator[Exporter]:
    """Start `vox exporter --listen 127.0.0.1:0` and learn its port from its first line."""

    def ready(log: str) -> str | None:
        found = re.search(r"serving (http://\S+/metrics)", log)
        return None if found is None else found.group(1)

    args = ["exporter", "--config", str(config), "--listen", "127.0.0.1:0"]
    with serving_vox(args, log_path, ready, "exporter") as (process, url):
        yield Exporter(process=process, url=url, log_path=log_path)


@dataclass
class Prometheus:
    """A private Prometheus server and its HTTP API."""

    process: subprocess.Popen[bytes]
    base: str
    log_path: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Run an instant query and return its result vector."""
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            data = json.loads(response.read())
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        """Return the single value of a query, or None when it has no result."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def rules_loaded(self) -> list[str]:
        """Return the names of the alerting rules the server loaded."""
        with urllib.request.urlopen(f"{self.base}/api/v1/rules", timeout=10) as response:
            data = json.loads(response.read())
        return [r["name"] for g in data["data"]["groups"] for r in g["rules"]]


def prometheus_binary() -> str:
    """Return the prometheus server binary (Debian's package, installed by `make test`)."""
    found = shutil.which("prometheus")
    assert found, "prometheus missing: `make test` installs Debian's prometheus package"
    return found


@contextlib.contextmanager
def run_prometheus(workdir: Path, target: str, *, interval: str = "1s") -> Iterator[Prometheus]:
    """Start Prometheus on a free loopback port, scraping target (host:port) every interval."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        f"rule_files: [{json.dumps(str(ALERTS))}]\n"
        "scrape_configs:\n"
        "  - job_name: vox\n"
        "    static_configs:\n"
        f"      - targets: [{json.dumps(target)}]\n"
    )
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            # Its own session: never shares the test's signals.
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield Prometheus(process=process, base=base, log_path=log_path)
    finally:
        stop(process, grace=20)


def poll(predicate: Any, timeout: float, what: str, *, every: float = 0.2) -> float:
    """Call predicate() until it is true; return the seconds it took, fail after timeout."""
    started = time.monotonic()
    last_error: Exception | None = None
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except (OSError, AssertionError) as exc:
            last_error = exc
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} ({last_error})")
        time.sleep(every)


__all__ = ["Exporter", "Prometheus", "poll", "run_exporter", "run_prometheus", "sample"]
