"""One writer per projection: the runner that holds a projection's lease (its process, the
epoch it took the lease at, when it last renewed it). Every commit of the active version
checks the epoch under the registry row it already locks, so a runner that lost the lease
(paused past it, or a second one started beside it) commits nothing more.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE projection_versions
            ADD COLUMN writer TEXT,
            ADD COLUMN writer_epoch BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN writer_renewed_at TIMESTAMPTZ
    """)


def downgrade() -> None:
    op.execute("ALTER TABLE projection_versions DROP COLUMN writer, DROP COLUMN writer_epoch, "
               "DROP COLUMN writer_renewed_at")
