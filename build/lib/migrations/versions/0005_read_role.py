"""The read-only role the read API queries as.

``eventfold_reader`` (NOLOGIN) may read the projection registry and checkpoints (for
freshness) and, granted by each projection as it publishes them, the read model views and
their source watermarks. It can read no event, outbox row or write-side table. Production
grants it to a login role (``GRANT eventfold_reader TO app_reader``) and points
``EVENTFOLD_READ_DATABASE_URL`` there; locally the read API switches to it with SET ROLE.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Roles are cluster-wide: another database's migration may create it at the same moment.
    op.execute("""
        DO $$ BEGIN
            CREATE ROLE eventfold_reader NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END $$
    """)
    op.execute("""
        DO $$ BEGIN
            EXECUTE format('GRANT eventfold_reader TO %I', current_user);
        EXCEPTION WHEN OTHERS THEN
            RAISE NOTICE 'could not grant eventfold_reader to %: %', current_user, SQLERRM;
        END $$
    """)
    op.execute("GRANT USAGE ON SCHEMA public TO eventfold_reader")
    op.execute("GRANT SELECT ON projection_checkpoints, projection_versions TO eventfold_reader")


def downgrade() -> None:
    op.execute("REVOKE SELECT ON projection_checkpoints, projection_versions "
               "FROM eventfold_reader")
    op.execute("REVOKE USAGE ON SCHEMA public FROM eventfold_reader")
