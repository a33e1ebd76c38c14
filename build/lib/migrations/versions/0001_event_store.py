"""Event store, outbox with its publication, projection checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE events (
            global_position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            event_id        UUID NOT NULL UNIQUE,
            stream_id       TEXT NOT NULL,
            stream_type     TEXT NOT NULL,
            stream_version  BIGINT NOT NULL CHECK (stream_version > 0),
            event_type      TEXT NOT NULL,
            data            JSONB NOT NULL,
            metadata        JSONB NOT NULL DEFAULT '{}',
            recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT events_stream_id_stream_version_key UNIQUE (stream_id, stream_version)
        )
    """)
    # Column names follow Debezium's outbox EventRouter defaults; the rest go to the envelope.
    op.execute("""
        CREATE TABLE outbox (
            id              UUID PRIMARY KEY,
            aggregatetype   TEXT NOT NULL,
            aggregateid     TEXT NOT NULL,
            type            TEXT NOT NULL,
            payload         JSONB NOT NULL,
            stream_version  BIGINT NOT NULL,
            global_position BIGINT NOT NULL,
            recorded_at     TIMESTAMPTZ NOT NULL
        )
    """)
    op.execute("CREATE PUBLICATION eventfold_outbox FOR TABLE outbox")
    op.execute("""
        CREATE TABLE projection_checkpoints (
            projection     TEXT PRIMARY KEY,
            batch_id       BIGINT NOT NULL,
            offsets        JSONB NOT NULL,
            events_applied BIGINT NOT NULL DEFAULT 0,
            dead_letters   BIGINT NOT NULL DEFAULT 0,
            updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE projection_checkpoints")
    op.execute("DROP PUBLICATION IF EXISTS eventfold_outbox")
    op.execute("DROP TABLE outbox")
    op.execute("DROP TABLE events")
