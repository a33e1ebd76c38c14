"""Outbox designs: the events table captured directly, beside today's outbox table.

Debezium can carry events out of Postgres with no outbox row: its router reads the ``events``
rows themselves (the event store is the outbox; nothing is ever deleted). Each append then
writes one row and its index entries instead of three rows (event, outbox insert, outbox
delete), all in the same transaction as before.

The design is data: ``eventfold_outbox_design`` holds it, recording what every database had
so far (the outbox table), and ``eventfold_append_units`` dispatches to the design's body
(``..._events_table`` or ``..._outbox_table``) under a shared advisory lock, which a switch
(``outbox/design.py``) takes exclusively: no append runs across a switch, and one that waited
for it runs the new design's body.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from alembic import op

from eventfold.migrations import apply_edits, revision_module
from eventfold.write_model.persistence.schema import OUTBOX_DESIGN_LOCK

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

APPEND_UNITS_OUTBOX_TABLE = revision_module("0008_stream_owner_and_ktable_readers.py").APPEND_UNITS

# Each edit of 0008's function, as (old text, new text); checked to apply exactly once.
_EDITS = [
    # No outbox row: the inserted events are the published rows.
    ("""    ), outboxed AS (
        -- Column names follow Debezium's outbox EventRouter; the rows are deleted below,
        -- in the same transaction: Debezium reads the inserts from the WAL.
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, stream_version,
                            global_position, recorded_at, schema_version, metadata)
        SELECT event_id, stream_type, stream_id, event_type, data, stream_version,
               global_position, recorded_at, schema_version, metadata FROM inserted
        RETURNING id, global_position
    ), positioned AS (
        SELECT new_event.*, outboxed.global_position
        FROM new_event JOIN outboxed ON outboxed.id = new_event.event_id""",
     """    ), positioned AS (
        -- Debezium reads these rows from the WAL: the event store is the outbox.
        SELECT new_event.*, inserted.global_position
        FROM new_event JOIN inserted ON inserted.event_id = new_event.event_id"""),
    ("    SELECT jsonb_agg(global_position ORDER BY n, part_no, stream_version), "
     """array_agg(event_id)
    INTO v_positions, v_ids FROM positioned;

    DELETE FROM outbox WHERE id = ANY(v_ids);
""",
     """    SELECT jsonb_agg(global_position ORDER BY n, part_no, stream_version)
    INTO v_positions FROM positioned;
"""),
    ("""    v_positions JSONB;
    v_ids UUID[];
""", """    v_positions JSONB;
"""),
]


def _named(text: str, design: str) -> str:
    return text.replace("FUNCTION eventfold_append_units(",
                        f"FUNCTION eventfold_append_units_{design}(", 1)


APPEND_UNITS_EVENTS_TABLE = _named(apply_edits(APPEND_UNITS_OUTBOX_TABLE, _EDITS, "0010"),
                                   "events_table")
OUTBOX_TABLE_BODY = _named(APPEND_UNITS_OUTBOX_TABLE, "outbox_table")

DISPATCH = f"""
CREATE OR REPLACE FUNCTION eventfold_append_units(p_units JSONB) RETURNS JSONB
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({OUTBOX_DESIGN_LOCK});
    IF (SELECT design FROM eventfold_outbox_design) = 'events_table' THEN
        RETURN eventfold_append_units_events_table(p_units);
    END IF;
    RETURN eventfold_append_units_outbox_table(p_units);
END $$
"""


def upgrade() -> None:
    op.execute("""
        CREATE TABLE eventfold_outbox_design (
            one        BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
            design     TEXT NOT NULL CHECK (design IN ('outbox_table', 'events_table')),
            changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("INSERT INTO eventfold_outbox_design (design) VALUES ('outbox_table')")
    op.execute(APPEND_UNITS_EVENTS_TABLE)
    op.execute(OUTBOX_TABLE_BODY)
    op.execute(DISPATCH)


def downgrade() -> None:
    op.execute(APPEND_UNITS_OUTBOX_TABLE)
    op.execute("DROP FUNCTION eventfold_append_units_events_table(JSONB)")
    op.execute("DROP FUNCTION eventfold_append_units_outbox_table(JSONB)")
    op.execute("DROP TABLE eventfold_outbox_design")
    op.execute("ALTER PUBLICATION eventfold_outbox SET TABLE outbox, eventfold_heartbeat")
    op.execute("ALTER PUBLICATION eventfold_outbox SET TABLE outbox, eventfold_heartbeat")
