"""Read API instances that divide KTable partitions among themselves: each renews its row
every second with its advertised URL and, per KTable topic, the partitions it holds restored
and their lag; every instance computes the same assignment from the live rows, and routes a
key's request to the instance that holds it (``read_api.state.membership``).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE ktable_members (
            url        TEXT PRIMARY KEY,
            seen_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            tables     JSONB NOT NULL DEFAULT '{}'
        )
    """)
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ktable_members TO eventfold_reader")


def downgrade() -> None:
    op.execute("DROP TABLE ktable_members")
