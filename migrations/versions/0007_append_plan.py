"""Group commit at a steady cost per call, however long the command log grows.

0006's function joined the batch's units to ``command_log``. The planner guesses 100 rows for
any ``jsonb_array_elements``, so while the log held up to some 20,000 commands it hashed the
whole log on every call, a cost that grows with every command until the plan flips; planning
both statements afresh on every call cost about as much again (docs/benchmarks.md, "Group
commit's generic plan"). The function now looks each command id up
by the log's key (``= ANY``) and keeps one generic plan per connection; the planner cannot see
into the JSON, so a fresh plan per call bought nothing. Behaviour is unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from alembic import op

from eventfold.migrations import revision_module

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

APPEND_UNITS = """
CREATE OR REPLACE FUNCTION eventfold_append_units(p_units JSONB) RETURNS JSONB
LANGUAGE plpgsql
-- The planner guesses 100 rows per jsonb_array_elements, so its nested guesses run to
-- billions and JIT compilation (about a second here) would start on every call.
SET jit = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_commands UUID[];  -- unit n's command id (or null) at n + 1
    v_rejected JSONB;
    v_rejected_units INT[];
    v_positions JSONB;
    v_ids UUID[];
BEGIN
    SELECT array_agg((u.value->>'c')::uuid ORDER BY u.i) INTO v_commands
    FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i);

    WITH part AS (
        SELECT (u.i - 1)::int AS n, p.j AS part_no, p.value->>'s' AS stream_id,
               (p.value->>'e')::bigint AS expected,
               (SELECT coalesce(max(e.stream_version), 0) FROM events e
                WHERE e.stream_id = p.value->>'s') AS current
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
        CROSS JOIN LATERAL jsonb_array_elements(u.value->'p') WITH ORDINALITY AS p(value, j)
    ), refusal AS (
        -- Command ids are unique within a call, so array_position finds the one unit.
        SELECT array_position(v_commands, log.command_id) - 1 AS n, 0 AS priority,
               jsonb_build_object('duplicate', log.result) AS outcome
        FROM command_log log WHERE log.command_id = ANY(v_commands)
        UNION ALL
        SELECT part.n, part.part_no, jsonb_build_object('conflict', jsonb_build_object(
            'stream_id', part.stream_id, 'current', part.current))
        FROM part WHERE part.current <> part.expected
    ), first_refusal AS (
        SELECT DISTINCT ON (n) n, outcome FROM refusal ORDER BY n, priority
    )
    SELECT jsonb_object_agg(n, outcome), array_agg(n) INTO v_rejected, v_rejected_units
    FROM first_refusal;

    WITH part AS (
        SELECT (u.i - 1)::int AS n, v_commands[u.i] AS command_id, p.j AS part_no,
               p.value->>'s' AS stream_id, p.value->>'t' AS stream_type,
               (p.value->>'e')::bigint AS expected, p.value->'v' AS events
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
        CROSS JOIN LATERAL jsonb_array_elements(u.value->'p') WITH ORDINALITY AS p(value, j)
        WHERE (u.i - 1)::int <> ALL(coalesce(v_rejected_units, '{}'))
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


def downgrade() -> None:
    previous = revision_module("0006_group_commit.py").APPEND_UNITS
    op.execute(previous.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
