"""The write side's Prometheus metrics (requests by command and status are the HTTP layer's:
``eventfold.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

GROUP_COMMIT_APPENDS = Histogram(
    "eventfold_group_commit_appends", "Appends committed together in one transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
CONFLICTS = Counter(
    "eventfold_command_conflicts", "Commands that met a concurrent write to their stream: "
    "retried (decided again on the stored aggregate) or rejected (409)",
    ["command", "outcome"])
