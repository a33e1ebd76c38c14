"""Reactions: where each reaction is in each partition of its sources' topics, and what the
domain refused it (``refused``: a command the domain turned down; ``raised``: the
reaction's function raised on the event, ``command_index`` -1; ``undecodable``: no event
could be read from the message, ``event_id`` its topic, partition and offset; ``failed``: a
side effect given up after its attempts). A reaction saves its positions only after every
command of a batch was answered, in the transaction that records the batch's refusals.
Process managers (reactions with state) keep each key's
state, with a version that every change checks, and the timers they asked for.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE reaction_positions (
            reaction    TEXT NOT NULL,
            topic       TEXT NOT NULL,
            partition   INTEGER NOT NULL,
            next_offset BIGINT NOT NULL,
            saved_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (reaction, topic, partition)
        )
    """)
    op.execute("""
        CREATE TABLE reaction_refusals (
            reaction      TEXT NOT NULL,
            event_id      TEXT NOT NULL,
            command_index INTEGER NOT NULL,
            kind          TEXT NOT NULL
                          CHECK (kind IN ('refused', 'raised', 'undecodable', 'failed')),
            command       TEXT,
            command_id    UUID,
            event_type    TEXT NOT NULL,
            stream_id     TEXT NOT NULL,
            reason        TEXT NOT NULL,
            recorded_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (reaction, event_id, command_index)
        )
    """)
    op.execute("CREATE INDEX reaction_refusals_by_time ON reaction_refusals "
               "(reaction, recorded_at)")
    op.execute("""
        CREATE TABLE process_states (
            process    TEXT NOT NULL,
            key        TEXT NOT NULL,
            state      JSONB NOT NULL,
            version    BIGINT NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (process, key)
        )
    """)
    op.execute("""
        CREATE TABLE process_timers (
            id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            process TEXT NOT NULL,
            key     TEXT NOT NULL,
            name    TEXT NOT NULL,
            fire_at TIMESTAMPTZ NOT NULL
        )
    """)
    op.execute("CREATE INDEX process_timers_due ON process_timers (process, fire_at)")
    op.execute("CREATE INDEX process_timers_by_key ON process_timers (process, key)")


def downgrade() -> None:
    op.execute("DROP TABLE process_timers")
    op.execute("DROP TABLE process_states")
    op.execute("DROP TABLE reaction_refusals")
    op.execute("DROP TABLE reaction_positions")
