"""Projection hosts and the work handed to them.

- ``projection_hosts``: each streaming host (``eventfold projection run``), the projections it
  runs and its heartbeat. A row whose heartbeat is older than a few seconds is a host that
  died; the next host to start deletes it.
- ``projection_requests``: a replay handed to the host that runs the projection, as a row the
  host polls (the channel needs nothing but the database both sides have): its state, its
  progress, a cancel flag the requester sets, and the result or the error.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE projection_hosts (
            host_id      TEXT PRIMARY KEY,
            projections  TEXT[] NOT NULL,
            started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("""
        CREATE TABLE projection_requests (
            id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            host_id      TEXT NOT NULL,
            projection   TEXT NOT NULL,
            action       TEXT NOT NULL,
            source       TEXT NOT NULL,
            state        TEXT NOT NULL DEFAULT 'pending',
            cancel       BOOLEAN NOT NULL DEFAULT false,
            done         BIGINT NOT NULL DEFAULT 0,
            total        BIGINT NOT NULL DEFAULT 0,
            result       JSONB,
            error        TEXT,
            requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("CREATE INDEX projection_requests_pending ON projection_requests (host_id) "
               "WHERE state = 'pending'")


def downgrade() -> None:
    op.execute("DROP TABLE projection_requests")
    op.execute("DROP TABLE projection_hosts")
