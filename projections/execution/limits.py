"""How many events one batch of a projection reads, by default.

A batch has a fixed cost whatever its size (docs/benchmarks.md): scheduling its tasks, and
loading and committing the states of its keys. So a backlog is read in large batches. A replay
has no reader waiting on it; a streaming batch is only this large while the query catches up,
and otherwise holds what arrived since the last one.
"""

STREAMING_MAX_ROWS = 500_000
DRIVER_BATCH_MAX_ROWS = 1_000
"""A batch of at most this many records, of a pipeline that folds where it reads, is folded on
the driver: a Spark job's fixed price is above that many records' fold (docs/benchmarks.md)."""
REPLAY_MAX_ROWS = 1_000_000
FAIR_BATCH_ROWS = 20_000
"""The most records a batch takes while another live projection of the host has records to
fold (``execution.turns``): a live batch waits for at most one such batch's tasks."""
REPLAY_REST_RATIO = 2.0
"""How long a replay's tasks rest for each second they work while a live projection of the
host follows its topics (``execution.turns``)."""
