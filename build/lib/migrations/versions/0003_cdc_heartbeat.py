"""A heartbeat table in the outbox publication.

Debezium's heartbeat action query updates it, so that the replication slot's position moves on
even when no events are written and an idle database does not retain WAL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE eventfold_heartbeat (
            id      INTEGER PRIMARY KEY,
            beat_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("INSERT INTO eventfold_heartbeat (id) VALUES (1)")
    op.execute("ALTER PUBLICATION eventfold_outbox ADD TABLE eventfold_heartbeat")


def downgrade() -> None:
    op.execute("ALTER PUBLICATION eventfold_outbox DROP TABLE eventfold_heartbeat")
    op.execute("DROP TABLE eventfold_heartbeat")
