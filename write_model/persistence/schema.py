"""Table, publication and lock names of the event store and its outbox.

The outbox columns follow what Debezium's outbox EventRouter expects (id, aggregatetype,
aggregateid, type, payload) plus the event's stream version, global position and record time,
which the connector places in the message envelope.
"""

from __future__ import annotations

EVENTS_TABLE = "events"
OUTBOX_TABLE = "outbox"
OUTBOX_PUBLICATION = "eventfold_outbox"
HEARTBEAT_TABLE = "eventfold_heartbeat"
OUTBOX_DESIGN_TABLE = "eventfold_outbox_design"
OUTBOX_DESIGN_LOCK = 7_262_291
"""The advisory lock every append holds shared and an outbox design switch exclusively."""
STREAM_BUCKETS = 64
"""Every event of a stream falls in one of this many buckets of the log (a hash of its id), which
an index of their own (migration 0013: ``STREAM_BUCKET``, then the global position) reads in
position order: a replay from the event store gives its tasks disjoint sets of buckets."""
STREAM_BUCKET = f"((hashtext(stream_id) & 2147483647) % {STREAM_BUCKETS})"
"""A stream's bucket, written exactly as the index is (or the planner does not use it)."""
