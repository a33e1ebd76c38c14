"""Write model: event schema versions, commit-safe read order, idempotent commands, snapshots,
and the one-round-trip append function.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Replaced by eventfold_append_units in 0006, which recreates this one on downgrade.
APPEND_FUNCTION = """
CREATE FUNCTION eventfold_append(
    p_stream_type TEXT, p_stream_id TEXT, p_expected BIGINT, p_events JSONB,
    p_command_id UUID
) RETURNS JSONB LANGUAGE plpgsql AS $$
DECLARE
    v_current BIGINT;
    v_result JSONB;
    v_ids UUID[];
BEGIN
    SELECT coalesce(max(stream_version), 0) INTO v_current
    FROM events WHERE stream_id = p_stream_id;
    IF v_current <> p_expected THEN
        RAISE EXCEPTION 'stream % is at version %, expected %',
            p_stream_id, v_current, p_expected
            USING ERRCODE = 'EF409', DETAIL = v_current::text;
    END IF;
    WITH new_events AS (
        INSERT INTO events (event_id, stream_id, stream_type, stream_version, event_type,
                            schema_version, data, metadata)
        SELECT e.event_id, p_stream_id, p_stream_type, e.stream_version, e.event_type,
               e.schema_version, e.data, e.metadata
        FROM jsonb_to_recordset(p_events) AS e(
            event_id UUID, stream_version BIGINT, event_type TEXT,
            schema_version INTEGER, data JSONB, metadata JSONB)
        RETURNING event_id, stream_version, event_type, schema_version, data, metadata,
                  global_position, recorded_at
    ), outboxed AS (
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload,
                            stream_version, global_position, recorded_at,
                            schema_version, metadata)
        SELECT event_id, p_stream_type, p_stream_id, event_type, data, stream_version,
               global_position, recorded_at, schema_version, metadata
        FROM new_events
        RETURNING id, stream_version, global_position
    )
    SELECT array_agg(id), jsonb_build_object(
        'stream_id', p_stream_id,
        'version', max(stream_version),
        'event_ids', jsonb_agg(id ORDER BY stream_version),
        'global_positions', jsonb_agg(global_position ORDER BY stream_version))
    INTO v_ids, v_result FROM outboxed;
    DELETE FROM outbox WHERE id = ANY(v_ids);
    IF p_command_id IS NOT NULL THEN
        INSERT INTO command_log (command_id, stream_id, result)
        VALUES (p_command_id, p_stream_id, v_result);
    END IF;
    RETURN v_result;
END $$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE events ADD COLUMN schema_version INTEGER NOT NULL DEFAULT 1")
    # The writing transaction's id: readers of "all events" order by (tx_id, position) and only
    # read transactions older than every one still running, so no page skips a late commit.
    op.execute("ALTER TABLE events ADD COLUMN tx_id xid8 NOT NULL DEFAULT pg_current_xact_id()")
    op.execute("CREATE INDEX events_tx_order ON events (tx_id, global_position)")
    op.execute("ALTER TABLE outbox ADD COLUMN schema_version INTEGER NOT NULL DEFAULT 1")
    op.execute("ALTER TABLE outbox ADD COLUMN metadata JSONB NOT NULL DEFAULT '{}'")
    op.execute("""
        CREATE TABLE command_log (
            command_id  UUID PRIMARY KEY,
            stream_id   TEXT NOT NULL,
            result      JSONB NOT NULL,
            recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("""
        CREATE TABLE snapshots (
            stream_id      TEXT PRIMARY KEY,
            aggregate_type TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            stream_version BIGINT NOT NULL,
            state          JSONB NOT NULL,
            recorded_at    TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    # One call, one round trip, one transaction (the caller runs it in autocommit mode):
    # check the expected version, insert events and their outbox rows, delete the outbox rows
    # (Debezium reads the inserts from the WAL), and record the command's result.
    op.execute(APPEND_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION eventfold_append(TEXT, TEXT, BIGINT, JSONB, UUID)")
    op.execute("DROP TABLE snapshots")
    op.execute("DROP TABLE command_log")
    op.execute("ALTER TABLE outbox DROP COLUMN metadata")
    op.execute("ALTER TABLE outbox DROP COLUMN schema_version")
    op.execute("DROP INDEX events_tx_order")
    op.execute("ALTER TABLE events DROP COLUMN tx_id")
    op.execute("ALTER TABLE events DROP COLUMN schema_version")
