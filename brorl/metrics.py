"""Prometheus metrics of one brorl process, served as text on ``http://<metrics_bind>/metrics``.

The only module that imports ``prometheus_client`` (tests/unit/test_dependency_rules.py): a
client that imports brorl.rpc or brorl.client never loads it. Every series is named ``brorl_*``
(docs/observability.md lists them), beside the standard ``process_*`` ones. Each process builds
one ``Metrics`` in its composition root and hands it to what records into it; the series live
in its own registry, not in prometheus_client's global default one.

Two ways a value gets in: objects made with ``counter`` / ``gauge`` / ``histogram`` /
``summary``, updated where the event happens (an RPC answered, a batch scored), and
``read_at_scrape`` callbacks, asked at every scrape for values another object already keeps (a
worker's counters, a stream's length)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import Summary, generate_latest
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

PREFIX = "brorl_"
# Seconds: a health check (~1 ms) up to a fanned-out generate of 1024 long paths (minutes).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip


@dataclass
class Sample:
    """One value read at scrape time; ``name`` without the ``brorl_`` prefix."""

    name: str
    doc: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "gauge"  # or "counter" (then ``name`` ends in _total)


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` → (host, port); IPv6 hosts in brackets. ValueError names a bad one."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"metrics_bind {bind!r}: use host:port (port 0 picks a free one)")
    return host.strip("[]"), int(port)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)  # the standard process_* series (CPU, memory)
        self._made: dict[str, object] = {}
        self._lock = threading.Lock()
        self._http = None
        self.port = 0  # the bound port once ``serve`` ran

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return self._make(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return self._make(Gauge, name, doc, labels)

    def histogram(
        self, name: str, doc: str, labels: Iterable[str] = (), buckets=LATENCY_BUCKETS
    ) -> Histogram:
        return self._make(Histogram, name, doc, labels, buckets=buckets)

    def summary(self, name: str, doc: str, labels: Iterable[str] = ()) -> Summary:
        """Count and sum only (no quantiles): a mean that may be negative, which a histogram
        with negative buckets does not give (it leaves out its _sum)."""
        return self._make(Summary, name, doc, labels)

    def _make(self, cls, name: str, doc: str, labels: Iterable[str], **kwargs):
        """The series ``brorl_<name>``, made on first use and the same object afterwards."""
        with self._lock:
            if name not in self._made:
                self._made[name] = cls(
                    PREFIX + name, doc, list(labels), registry=self.registry, **kwargs
                )
            made = self._made[name]
        if not isinstance(made, cls):
            raise TypeError(f"{PREFIX}{name} is a {type(made).__name__}, not a {cls.__name__}")
        return made

    def read_at_scrape(self, read: Callable[[], Iterable[Sample]]) -> None:
        """Call ``read`` at every scrape; a failing read is logged and leaves its series out."""
        self.registry.register(_ScrapeTime(read))

    def serve(self, bind: str) -> int:
        """Serve ``/metrics`` on ``bind`` (host:port, port 0: a free one) from a daemon thread;
        returns the bound port."""
        host, port = parse_bind(bind)
        self._http, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = int(self._http.server_address[1])
        return self.port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def exposition(self) -> str:
        """What ``/metrics`` answers now (the text format)."""
        return generate_latest(self.registry).decode()


class _ScrapeTime:
    """A prometheus_client collector over a ``read`` callback."""

    def __init__(self, read: Callable[[], Iterable[Sample]]):
        self.read = read

    def describe(self):
        return []  # not asked at registration: the values may not exist yet

    def collect(self):
        try:
            samples = list(self.read())
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one source
            log.warning("metrics: %s failed: %s: %s", self.read, type(exc).__name__, exc)
            return
        families: dict[str, object] = {}
        for s in samples:
            if s.name not in families:
                kind = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                families[s.name] = kind(PREFIX + s.name, s.doc, labels=sorted(s.labels))
            families[s.name].add_metric([s.labels[k] for k in sorted(s.labels)], float(s.value))
        yield from families.values()
