"""Batches whose tasks write what they fold: the parking letters a batch's tasks stage for
its commit, and the offsets the active version's batch in flight reads up to.

- ``staged_letters``: per projection version and batch attempt, the dead letters that park a
  key (held behind a failed event), as the tasks that folded them staged them. The batch's
  commit moves them into ``parked_events`` in its transaction, and produces those of keys that
  were parked before the batch, once it has checked they still are. UNLOGGED: a batch lives
  between its tasks and its commit, and the commit refuses to run after a server restart.

- ``batches_in_flight``: the active version's batch under way, where it ends, and whether its
  tasks are done. Tasks write the KTable before their batch commits, so a replay that switches
  versions while a batch is under way waits for its tasks and folds the new version up to its
  end: no reader of the new KTable topic sees less than the old one held.

The state tables' own stage tables are made per projection version, with its other tables.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE UNLOGGED TABLE staged_letters (
            projection TEXT NOT NULL,
            version    INTEGER NOT NULL,
            attempt    TEXT NOT NULL,
            held       BOOLEAN NOT NULL,
            letter     JSONB NOT NULL
        )
    """)
    op.execute("CREATE INDEX staged_letters_by_attempt ON staged_letters "
               "(projection, version, attempt)")
    op.execute("""
        CREATE TABLE batches_in_flight (
            projection TEXT PRIMARY KEY,
            version    INTEGER NOT NULL,
            ends       JSONB NOT NULL,
            tasks_done BOOLEAN NOT NULL DEFAULT false,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE batches_in_flight")
    op.execute("DROP TABLE staged_letters")
