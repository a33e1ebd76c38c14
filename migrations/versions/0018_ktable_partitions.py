"""Every partition count each KTable topic has had (by its id: a topic deleted and made
again starts anew): a key written before partitions were added stays in the partition the
old count gave it until it is written again. A projection
writing a key under a new count deletes it (a tombstone) from where an old count put it, and
the read API looks a key up under the old counts when its partition under the new one does
not have it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE ktable_partitions (
            topic       TEXT NOT NULL,
            topic_id    TEXT NOT NULL,
            partitions  INTEGER NOT NULL,
            seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (topic, topic_id, partitions)
        )
    """)
    op.execute("GRANT SELECT ON ktable_partitions TO eventfold_reader")


def downgrade() -> None:
    op.execute("DROP TABLE ktable_partitions")
