"""The read API's Prometheus metrics: each served KTable's restore state and lag (computed
when scraped), and read-your-writes waits. Requests by route and status are counted by the
HTTP layer the composition root adds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from eventfold.read_api.ktables import KTableHost

READ_YOUR_WRITES = Counter(
    "eventfold_read_your_writes_waits", "Reads that asked for a minimum version (min_version), "
    "by what they read and how the wait ended: at once, after waiting, or timed out (504)",
    ["kind", "outcome"])


class KTableMetrics(Collector):
    """Every KTable the read APIs of this process serve: whether its store is restored, the
    records restored so far, its keys and its lag behind the topic."""

    def __init__(self) -> None:
        self._instances: dict[str, Callable[[], Mapping[str, KTableHost]]] = {}
        self._lock = threading.Lock()

    def watch(self, instance_id: str, hosts: Callable[[], Mapping[str, KTableHost]]) -> None:
        with self._lock:
            self._instances[instance_id] = hosts

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self._instances.pop(instance_id, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["instance", "ktable", "version"]
        restored = GaugeMetricFamily("eventfold_ktable_restored",
                                     "1 once the KTable's store is restored, else 0", labels=labels)
        records = GaugeMetricFamily("eventfold_ktable_restore_records",
                                    "Records read by the restore so far, and of how many",
                                    labels=[*labels, "of"])
        keys = GaugeMetricFamily("eventfold_ktable_keys", "Keys in the store", labels=labels)
        lag = GaugeMetricFamily("eventfold_ktable_lag_records",
                                "Records in the topic not applied to the store yet", labels=labels)
        with self._lock:
            instances = list(self._instances.items())
        for instance, hosts in instances:
            for name, host in sorted(hosts().items()):
                view, values = host.view, [instance, name, str(host.version)]
                progress = view.progress
                restored.add_metric(values, 1 if progress.restored else 0)
                records.add_metric([*values, "done"], progress.records)
                records.add_metric([*values, "total"], progress.total)
                keys.add_metric(values, len(view))
                lag.add_metric(values, view.lag)
        yield from (restored, records, keys, lag)


KTABLES = KTableMetrics()
"""One per process (the composition root registers it where ``/metrics`` reads)."""


def register_ktable_metrics(registry: CollectorRegistry) -> None:
    """Add ``KTABLES`` to ``registry`` unless it is there (a process may build its read API
    more than once: tests do)."""
    with suppress(ValueError):  # already registered: its names are taken by itself
        registry.register(KTABLES)
