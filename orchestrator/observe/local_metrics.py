"""A local run's metrics (driver/local.py): the same series and labels as on Ray, on a Prometheus
endpoint of the command's own, since no Ray node exports them.

Ray names a metric `ray_<name>` and adds `_total` to a counter's; prometheus_client adds the
`_total` itself. The endpoint listens on loopback, on a free port, for the run's length.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge

RAY_PREFIX = "ray_"


class Endpoint:
    """One run's registry and its HTTP endpoint."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge:
        return Gauge(_Gauge(RAY_PREFIX + name, description, list(tag_keys), registry=self.registry))

    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Counter:
        return Counter(_Counter(RAY_PREFIX + name, description, list(tag_keys), registry=self.registry))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Gauge:
    """ray.util.metrics.Gauge's calls, on prometheus_client."""

    def __init__(self, metric: _Gauge):
        self._metric = metric

    def set(self, value: float, tags: dict[str, str]) -> None:
        self._metric.labels(**tags).set(value)


class Counter:
    """ray.util.metrics.Counter's calls, on prometheus_client."""

    def __init__(self, metric: _Counter):
        self._metric = metric

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._metric.labels(**(tags or {})).inc(value)
