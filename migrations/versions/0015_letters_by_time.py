"""Dead letters found by time, not by scan: ``parked_events.letters_after`` holds a time no
later than the one its letter was written (the clock of the task that staged it), so that a
retry reads the dead-letter topic from there, by the broker's time index, up to when the
event was parked, instead of reading the topic from its start. Rows parked before this
revision have none, and are found by reading the topic whole as before.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE parked_events ADD COLUMN letters_after TIMESTAMPTZ")


def downgrade() -> None:
    op.execute("ALTER TABLE parked_events DROP COLUMN letters_after")
