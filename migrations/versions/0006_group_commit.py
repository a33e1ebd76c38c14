"""Group commit: one call appends many units of work, each checked on its own.

``eventfold_append_units`` takes a JSON array of units. A unit is one command's append: its
command id (or null) and its parts, one per stream, each with the expected version and the
events. A unit whose command id was executed before is answered with that first result; a
unit whose stream moved on is answered with a conflict and the current version; the others
are appended, with their outbox rows and command log entries, in the caller's one
transaction. So many concurrent commands share one round trip and one WAL flush, and no
unit's rejection touches another. The caller never puts two units on one stream or with one
command id into a call, so the checks are set-based and need no per-unit loop.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from alembic import op

from eventfold.migrations import revision_module

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

APPEND_UNITS = """
CREATE FUNCTION eventfold_append_units(p_units JSONB) RETURNS JSONB LANGUAGE plpgsql
-- The planner guesses 100 rows per jsonb_array_elements, so its nested guesses run to
-- billions and JIT compilation (about a second here) would start on every call.
SET jit = off AS $$
DECLARE
    v_rejected JSONB;
    v_rejected_units INT[];
    v_positions JSONB;
    v_ids UUID[];
BEGIN
    WITH unit AS (
        SELECT (u.i - 1)::int AS n, (u.value->>'c')::uuid AS command_id, u.value->'p' AS parts
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
    ), part AS (
        SELECT unit.n, p.j AS part_no, p.value->>'s' AS stream_id,
               (p.value->>'e')::bigint AS expected,
               (SELECT coalesce(max(e.stream_version), 0) FROM events e
                WHERE e.stream_id = p.value->>'s') AS current
        FROM unit CROSS JOIN LATERAL jsonb_array_elements(unit.parts)
             WITH ORDINALITY AS p(value, j)
    ), refusal AS (
        SELECT unit.n, 0 AS priority, jsonb_build_object('duplicate', log.result) AS outcome
        FROM unit JOIN command_log log ON log.command_id = unit.command_id
        UNION ALL
        SELECT part.n, part.part_no, jsonb_build_object('conflict', jsonb_build_object(
            'stream_id', part.stream_id, 'current', part.current))
        FROM part WHERE part.current <> part.expected
    ), first_refusal AS (
        SELECT DISTINCT ON (n) n, outcome FROM refusal ORDER BY n, priority
    )
    SELECT jsonb_object_agg(n, outcome), array_agg(n) INTO v_rejected, v_rejected_units
    FROM first_refusal;

    WITH unit AS (
        SELECT (u.i - 1)::int AS n, (u.value->>'c')::uuid AS command_id, u.value->'p' AS parts
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
    ), part AS (
        SELECT unit.n, unit.command_id, p.j AS part_no, p.value->>'s' AS stream_id,
               p.value->>'t' AS stream_type, (p.value->>'e')::bigint AS expected,
               p.value->'v' AS events
        FROM unit CROSS JOIN LATERAL jsonb_array_elements(unit.parts)
             WITH ORDINALITY AS p(value, j)
        WHERE unit.n <> ALL(coalesce(v_rejected_units, '{}'))
    ), new_event AS (
        SELECT part.n, part.command_id, part.part_no, part.stream_id, part.stream_type,
               part.expected + e.k AS stream_version, (e.value->>'i')::uuid AS event_id,
               e.value AS event
        FROM part CROSS JOIN LATERAL jsonb_array_elements(part.events)
             WITH ORDINALITY AS e(value, k)
    ), inserted AS (
        INSERT INTO events (event_id, stream_id, stream_type, stream_version, event_type,
                            schema_version, data, metadata)
        SELECT event_id, stream_id, stream_type, stream_version, event->>'y',
               (event->>'sv')::int, event->'d', event->'m'
        FROM new_event ORDER BY n, part_no, stream_version
        RETURNING event_id, stream_id, stream_type, stream_version, event_type,
                  schema_version, data, metadata, global_position, recorded_at
    ), outboxed AS (
        -- Column names follow Debezium's outbox EventRouter; the rows are deleted below,
        -- in the same transaction: Debezium reads the inserts from the WAL.
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, stream_version,
                            global_position, recorded_at, schema_version, metadata)
        SELECT event_id, stream_type, stream_id, event_type, data, stream_version,
               global_position, recorded_at, schema_version, metadata FROM inserted
        RETURNING id, global_position
    ), positioned AS (
        SELECT new_event.*, outboxed.global_position
        FROM new_event JOIN outboxed ON outboxed.id = new_event.event_id
    ), logged AS (
        -- A command's result is its first stream's append, as a retry returns it.
        INSERT INTO command_log (command_id, stream_id, result)
        SELECT command_id, stream_id, jsonb_build_object(
            'stream_id', stream_id, 'version', max(stream_version),
            'event_ids', jsonb_agg(event_id ORDER BY stream_version),
            'global_positions', jsonb_agg(global_position ORDER BY stream_version))
        FROM positioned WHERE part_no = 1 AND command_id IS NOT NULL
        GROUP BY n, command_id, stream_id
    )
    SELECT jsonb_agg(global_position ORDER BY n, part_no, stream_version), array_agg(event_id)
    INTO v_positions, v_ids FROM positioned;

    DELETE FROM outbox WHERE id = ANY(v_ids);
    RETURN jsonb_build_object('rejected', coalesce(v_rejected, '{}'),
                              'positions', coalesce(v_positions, '[]'));
END $$
"""


def upgrade() -> None:
    op.execute(APPEND_UNITS)
    op.execute("DROP FUNCTION eventfold_append(TEXT, TEXT, BIGINT, JSONB, UUID)")


def downgrade() -> None:
    op.execute(revision_module("0002_write_model.py").APPEND_FUNCTION)
    op.execute("DROP FUNCTION eventfold_append_units(JSONB)")

