"""The event log by stream bucket: an index on a hash of the stream id (64 buckets) and the
global position, so that each task of a replay from the event store reads its own buckets'
events in position order, instead of every task scanning the whole window and keeping its
share (``outbox.history``; ``STREAM_BUCKET`` in the schema module is the same expression).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX events_by_stream_bucket ON events "
               "(((hashtext(stream_id) & 2147483647) % 64), global_position)")


def downgrade() -> None:
    op.execute("DROP INDEX events_by_stream_bucket")
