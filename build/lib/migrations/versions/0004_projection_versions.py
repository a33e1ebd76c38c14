"""Projection versions: a replay builds a new version of a read model beside the live one.

``projection_versions`` says which version of each projection serves reads and how far the
live version has emitted derived events (so a replay never emits them twice). Checkpoints
become per version.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE projection_versions (
            projection       TEXT PRIMARY KEY,
            active_version   INTEGER NOT NULL,
            building_version INTEGER,
            emitted_offsets  JSONB NOT NULL DEFAULT '{}',
            switched_at      TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("ALTER TABLE projection_checkpoints "
               "ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
    op.execute("ALTER TABLE projection_checkpoints DROP CONSTRAINT projection_checkpoints_pkey")
    op.execute("ALTER TABLE projection_checkpoints ADD PRIMARY KEY (projection, version)")


def downgrade() -> None:
    op.execute("DELETE FROM projection_checkpoints WHERE version <> 1")
    op.execute("ALTER TABLE projection_checkpoints DROP CONSTRAINT projection_checkpoints_pkey")
    op.execute("ALTER TABLE projection_checkpoints DROP COLUMN version")
    op.execute("ALTER TABLE projection_checkpoints ADD PRIMARY KEY (projection)")
    op.execute("DROP TABLE projection_versions")
