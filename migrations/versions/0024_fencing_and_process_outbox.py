"""What the guarantees rest on when a process freezes or dies at any step (issue 72).

- ``projection_versions.writer_lease_s``: how long the holder's lease lasts unrenewed, as
  the holder stated it: a standby configured with a shorter lease no longer takes over from
  a live writer. ``writer_slots``: the most transactional-id slots any holder's tasks may
  write from, so that a new holder fences every one of them.
- ``batches_in_flight.run_id``: which run recorded the batch under way, so that a run given
  up as stalled cannot end the next run's record.
- ``parked_events.letter_pending``: the dead letter of an event held behind a key parked
  before its batch, decided in the batch's commit and produced after it (no network work
  inside a commit transaction); gone once produced.
- ``process_timers``: one timer per process, key and name (a second ``schedule`` of a name
  moves it); duplicates left by earlier versions keep their earliest.
- ``process_commands``: the commands a process manager's step decided, saved with its
  state in one transaction and sent after it commits (an outbox): a step whose state
  conflicts sends nothing, and a crash after the commit sends them at the next batch.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE projection_versions
            ADD COLUMN writer_lease_s DOUBLE PRECISION,
            ADD COLUMN writer_slots INTEGER NOT NULL DEFAULT 0
    """)
    op.execute("ALTER TABLE batches_in_flight ADD COLUMN run_id TEXT")
    op.execute("ALTER TABLE parked_events ADD COLUMN letter_pending JSONB")
    op.execute("""
        CREATE INDEX parked_events_pending ON parked_events (projection, version)
        WHERE letter_pending IS NOT NULL
    """)
    op.execute("""
        DELETE FROM process_timers t USING process_timers kept
        WHERE t.process = kept.process AND t.key = kept.key AND t.name = kept.name
          AND (kept.fire_at, kept.id) < (t.fire_at, t.id)
    """)
    op.execute("DROP INDEX process_timers_by_key")
    op.execute("CREATE UNIQUE INDEX process_timers_by_name ON process_timers "
               "(process, key, name)")
    op.execute("""
        CREATE TABLE process_commands (
            process        TEXT NOT NULL,
            key            TEXT NOT NULL,
            seq            BIGINT GENERATED ALWAYS AS IDENTITY,
            command_id     UUID NOT NULL,
            command        TEXT NOT NULL,
            payload        JSONB NOT NULL,
            event_id       TEXT NOT NULL,
            command_index  INTEGER NOT NULL,
            event_type     TEXT NOT NULL,
            stream_id      TEXT NOT NULL,
            correlation_id TEXT,
            created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (process, key, seq)
        )
    """)
    op.execute("CREATE INDEX process_commands_by_age ON process_commands (process, created_at)")


def downgrade() -> None:
    op.execute("DROP TABLE process_commands")
    op.execute("DROP INDEX process_timers_by_name")
    op.execute("CREATE INDEX process_timers_by_key ON process_timers (process, key)")
    op.execute("DROP INDEX parked_events_pending")
    op.execute("ALTER TABLE parked_events DROP COLUMN letter_pending")
    op.execute("ALTER TABLE batches_in_flight DROP COLUMN run_id")
    op.execute("ALTER TABLE projection_versions DROP COLUMN writer_lease_s, "
               "DROP COLUMN writer_slots")
