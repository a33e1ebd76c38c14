"""Idempotency results age out: an index on ``command_log.recorded_at``, by which the command
API deletes, a batch at a time, the results older than ``EVENTFOLD_COMMAND_ID_RETENTION``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX command_log_by_time ON command_log (recorded_at)")


def downgrade() -> None:
    op.execute("DROP INDEX command_log_by_time")
