"""Each projection version's count of live rows, kept by the batches that write them: a
batch adds what it inserted and revived and takes away what it deleted, in the transaction
that commits its rows and its checkpoint, so that an unfiltered count of a read model is
exact and costs one row's read (``projections.state.store``). Versions from before it are
counted once, by their runner's next start (until then: NULL, and the read API estimates).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE projection_checkpoints ADD COLUMN live_rows BIGINT")


def downgrade() -> None:
    op.execute("ALTER TABLE projection_checkpoints DROP COLUMN live_rows")
