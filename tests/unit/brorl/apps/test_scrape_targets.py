"""The local cluster's metrics endpoints: URLs from the metrics port files that
serve_until_stopped writes, and the Prometheus file_sd file listing them."""

import json

from brorl.apps.cluster.scrape_targets import metrics_urls, write_file_sd
from brorl.rpc import metrics_port_file


def test_urls_from_the_port_files_and_a_file_sd_file(tmp_path):
    ports = tmp_path / "ports"
    ports.mkdir()
    metrics_port_file(ports / "reward.port").write_text("9452")
    metrics_port_file(ports / "rollout-1.port").write_text("40001")
    (ports / "learner.port").write_text("50053")  # gRPC only: its metrics are off
    urls = metrics_urls("127.0.0.1", ports, ["reward", "rollout-1", "learner"])
    assert urls == {
        "reward": "http://127.0.0.1:9452/metrics",
        "rollout-1": "http://127.0.0.1:40001/metrics",
    }
    path = write_file_sd(tmp_path / "targets.json", urls)
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9452"], "labels": {"service": "reward", "name": "reward"}},
        {"targets": ["127.0.0.1:40001"], "labels": {"service": "rollout", "name": "rollout-1"}},
    ]


def test_metrics_port_file_is_beside_the_port_file(tmp_path):
    assert metrics_port_file(tmp_path / "a.port") == tmp_path / "a.port.metrics"
