"""Dead letters you can act on: parked keys and what was done with each letter.

- ``parked_events``: per projection version, the events a fold projection dead-lettered by
  key: the one its fold raised on, and the key's later events, held behind it instead of
  folded onto a state that misses one. A key with rows here is parked; ``eventfold dlq
  retry`` folds its events in order and deletes them. Written in the batch's transaction,
  so it lists exactly the letters of committed batches.
- ``dead_letter_resolutions``: a letter retried or discarded, by whom, when and why (a
  discarded letter is never folded; a retried one is not folded twice).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE parked_events (
            projection       TEXT NOT NULL,
            version          INTEGER NOT NULL,
            key              TEXT NOT NULL,
            source_topic     TEXT NOT NULL,
            source_partition INTEGER NOT NULL,
            source_offset    BIGINT NOT NULL,
            event_id         TEXT NOT NULL,
            global_position  BIGINT NOT NULL,
            reason           TEXT NOT NULL,
            parked_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (projection, version, source_topic, source_partition, source_offset)
        )
    """)
    op.execute("CREATE INDEX parked_events_by_key ON parked_events "
               "(projection, version, key, global_position)")
    op.execute("""
        CREATE TABLE dead_letter_resolutions (
            projection         TEXT NOT NULL,
            dead_letter_offset BIGINT NOT NULL,
            action             TEXT NOT NULL CHECK (action IN ('retried', 'discarded')),
            resolved_by        TEXT NOT NULL,
            reason             TEXT NOT NULL DEFAULT '',
            resolved_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (projection, dead_letter_offset)
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE dead_letter_resolutions")
    op.execute("DROP TABLE parked_events")
