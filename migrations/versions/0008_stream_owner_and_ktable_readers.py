"""Streams belong to one aggregate type; command ids remember their payload; KTable readers.

- ``eventfold_append_units`` refuses an append to a stream whose events were written by
  another aggregate type (``owned``): a stream id names one aggregate of one type, so two
  applications (or two aggregate types) on one database never mix their events. Existing
  streams keep what they hold; the type of a stream's newest event is its owner.
- A command's logged result carries the fingerprint of its payload (``f`` in the unit), so a
  command id used again with another payload is told apart from a retry.
- ``ktable_readers``: each read API instance says which KTable topics it has open (a
  heartbeat), so a replay deletes an old version's topic only once no live reader has it
  assigned: a consumer whose assigned topic is deleted crashes its process in librdkafka.
- ``retired_ktable_topics``: topics of replaced versions waiting for their readers to move.
- ``projection_versions.output_topics``: the derived-event topics a projection has written,
  so that operators and the read API can say where its output goes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from alembic import op

from eventfold.migrations import apply_edits, revision_module

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_PREVIOUS = revision_module("0007_append_plan.py").APPEND_UNITS

# Each edit of 0007's function, as (old text, new text); checked to apply exactly once.
_EDITS = [
    # The stream's newest event gives its version and its owner in one index probe.
    ("""               (p.value->>'e')::bigint AS expected,
               (SELECT coalesce(max(e.stream_version), 0) FROM events e
                WHERE e.stream_id = p.value->>'s') AS current
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
        CROSS JOIN LATERAL jsonb_array_elements(u.value->'p') WITH ORDINALITY AS p(value, j)
    ), refusal AS (""",
     """               (p.value->>'e')::bigint AS expected, p.value->>'t' AS stream_type,
               coalesce(newest.stream_version, 0) AS current, newest.stream_type AS owner
        FROM jsonb_array_elements(p_units) WITH ORDINALITY AS u(value, i)
        CROSS JOIN LATERAL jsonb_array_elements(u.value->'p') WITH ORDINALITY AS p(value, j)
        LEFT JOIN LATERAL (
            SELECT e.stream_version, e.stream_type FROM events e
            WHERE e.stream_id = p.value->>'s' ORDER BY e.stream_version DESC LIMIT 1
        ) newest ON true
    ), refusal AS ("""),
    # A duplicate command wins, then a part's foreign owner, then its version conflict.
    ("""        SELECT part.n, part.part_no, jsonb_build_object('conflict', jsonb_build_object(
            'stream_id', part.stream_id, 'current', part.current))
        FROM part WHERE part.current <> part.expected""",
     """        SELECT part.n, 2 * part.part_no - 1, jsonb_build_object('owned', jsonb_build_object(
            'stream_id', part.stream_id, 'owner', part.owner))
        FROM part WHERE part.owner <> part.stream_type
        UNION ALL
        SELECT part.n, 2 * part.part_no, jsonb_build_object('conflict', jsonb_build_object(
            'stream_id', part.stream_id, 'current', part.current))
        FROM part WHERE part.current <> part.expected"""),
    ("""        SELECT (u.i - 1)::int AS n, v_commands[u.i] AS command_id, p.j AS part_no,""",
     """        SELECT (u.i - 1)::int AS n, v_commands[u.i] AS command_id, p.j AS part_no,
               u.value->>'f' AS fingerprint,"""),
    ("""        SELECT part.n, part.command_id, part.part_no, part.stream_id, part.stream_type,""",
     """        SELECT part.n, part.command_id, part.fingerprint, part.part_no, part.stream_id,
               part.stream_type,"""),
    ("""            'global_positions', jsonb_agg(global_position ORDER BY stream_version))
        FROM positioned WHERE part_no = 1 AND command_id IS NOT NULL
        GROUP BY n, command_id, stream_id""",
     """            'global_positions', jsonb_agg(global_position ORDER BY stream_version),
            'fingerprint', fingerprint)
        FROM positioned WHERE part_no = 1 AND command_id IS NOT NULL
        GROUP BY n, command_id, stream_id, fingerprint"""),
]


APPEND_UNITS = apply_edits(_PREVIOUS, _EDITS, "0008")


def upgrade() -> None:
    op.execute(APPEND_UNITS)
    op.execute("""
        CREATE TABLE ktable_readers (
            instance_id TEXT NOT NULL,
            topic       TEXT NOT NULL,
            projection  TEXT NOT NULL,
            version     INTEGER NOT NULL,
            seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (instance_id, topic)
        )
    """)
    op.execute("""
        CREATE TABLE retired_ktable_topics (
            topic      TEXT PRIMARY KEY,
            projection TEXT NOT NULL,
            version    INTEGER NOT NULL,
            retired_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ktable_readers TO eventfold_reader")
    op.execute("ALTER TABLE projection_versions "
               "ADD COLUMN output_topics JSONB NOT NULL DEFAULT '[]'")


def downgrade() -> None:
    op.execute("ALTER TABLE projection_versions DROP COLUMN output_topics")
    op.execute("DROP TABLE retired_ktable_topics")
    op.execute("DROP TABLE ktable_readers")
    op.execute(_PREVIOUS)
