"""Where the services of a local cluster serve /metrics: their URLs, read from the metrics port
files (brorl.rpc.metrics_port_file), and a Prometheus ``file_sd`` target file listing them
(docs/observability.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from brorl.rpc import metrics_port_file

log = logging.getLogger(__name__)
FILE_SD = "prometheus_targets.json"  # in the cluster's workdir


def empty_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*"):
        stale.unlink()


def metrics_urls(host: str, ports_dir: Path, names: list[str]) -> dict[str, str]:
    """Service name → its /metrics URL, for the services whose metrics port file exists."""
    urls = {}
    for name in names:
        path = metrics_port_file(ports_dir / f"{name}.port")
        if path.exists() and path.read_text().strip():
            urls[name] = f"http://{host}:{path.read_text().strip()}/metrics"
    return urls


def write_file_sd(path: Path, urls: dict[str, str]) -> Path:
    """``urls`` as a Prometheus file_sd file: one target group per service, labelled with its
    kind (``service``: reward, rollout, learner) and its name in the cluster."""
    groups = [
        {"targets": [url.split("/")[2]], "labels": {"service": name.split("-")[0], "name": name}}
        for name, url in urls.items()
    ]
    path.write_text(json.dumps(groups, indent=2) + "\n")
    for name, url in urls.items():
        log.info("%s metrics on %s", name, url)
    return path
