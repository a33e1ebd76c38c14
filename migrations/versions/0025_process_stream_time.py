"""A process manager's stream time (issue 74): ``reaction_positions.stepped_through``, the
recorded time before which every event of the partition has been stepped (as the runner saw
it: the last stepped event's time, or the time its saved position was found at the
partition's end). A due timer fires only once every partition its process reads is past its
due time, so a timer never overtakes the events recorded before it.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE reaction_positions ADD COLUMN stepped_through TIMESTAMPTZ")


def downgrade() -> None:
    op.execute("ALTER TABLE reaction_positions DROP COLUMN stepped_through")
