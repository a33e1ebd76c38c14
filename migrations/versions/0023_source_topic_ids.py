"""The ids of the source topics each reader's saved offsets count (a projection version's
checkpoint, a reaction's positions): a topic deleted and made again while no reader ran is
told from the one it replaced by its id, whatever its offsets.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE source_topic_ids (
            reader      TEXT NOT NULL,
            topic       TEXT NOT NULL,
            topic_id    TEXT NOT NULL,
            recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (reader, topic)
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE source_topic_ids")
