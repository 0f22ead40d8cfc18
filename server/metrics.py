"""The coordinator's Prometheus metrics (`--metrics-listen`): what an operator graphs and alerts on.

    xclp_runs{state}                      runs in the state store by state (queued ... interrupted)
    xclp_step_seconds{job_type,step}      histogram of step durations
    xclp_bytes_moved_total{job_type,direction}  payload bytes received, relayed and sent
    xclp_connected_parties                Pull streams open now
    xclp_refused_joins_total{reason}      Join calls refused, by error class

Labels carry job types, step names and error classes only: never party data, keys or job ids'
contents beyond what the operator configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from xclp.errors import ConfigError
from xclp.server.store import STATES, StateStore

STEP_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


class _Runs(Collector):
    def __init__(self, store: StateStore) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("xclp_runs", "Runs in the coordinator's state store, by state", labels=["state"])
        counts = self.store.count_by_state()
        for state in STATES:
            family.add_metric([state], counts.get(state, 0))
        yield family


class Metrics:
    def __init__(self, store: StateStore) -> None:
        self.registry = CollectorRegistry()
        self.step_seconds = Histogram("xclp_step_seconds", "Seconds a step round took, from start to its last "
                                      "contribution", ["job_type", "step"], buckets=STEP_BUCKETS,
                                      registry=self.registry)
        self.bytes_moved = Counter("xclp_bytes_moved", "Payload bytes the coordinator received (in), relayed "
                                   "between parties (relayed) and sent (out)", ["job_type", "direction"],
                                   registry=self.registry)
        self.connected = Gauge("xclp_connected_parties", "Parties with a Pull stream open", registry=self.registry)
        self.refused_joins = Counter("xclp_refused_joins", "Join calls refused, by error class", ["reason"],
                                     registry=self.registry)
        self.registry.register(_Runs(store))

    def step(self, job_type: str, step: str, seconds: float, bytes_in: int, bytes_relayed: int) -> None:
        self.step_seconds.labels(job_type, step).observe(seconds)
        self.bytes_moved.labels(job_type, "in").inc(bytes_in)
        self.bytes_moved.labels(job_type, "relayed").inc(bytes_relayed)

    def sent(self, job_type: str, size: int) -> None:
        self.bytes_moved.labels(job_type, "out").inc(size)

    def serve(self, address: str) -> tuple[WSGIServer, int]:
        """Serve /metrics on `address` (host:port; port 0 = any free port); returns the server and port."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--metrics-listen {address!r} must be host:port")
        try:
            server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address}: {exc.strerror}") from None
        return server, server.server_port
