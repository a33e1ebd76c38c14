"""Parked reaction keys: a key whose event a reaction (or process manager) raised on, or
whose side effect was given up on, holds its later events back in ``reaction_held``, in
order, until ``eventfold dlq retry REACTION KEY`` asks the runner to act on them
(``retry_requested``). The runner parks, holds and releases in the transaction that saves
its positions.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE reaction_parked (
            reaction        TEXT NOT NULL,
            key             TEXT NOT NULL,
            event_id        TEXT NOT NULL,
            reason          TEXT NOT NULL,
            parked_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
            retry_requested BOOLEAN NOT NULL DEFAULT false,
            PRIMARY KEY (reaction, key)
        )
    """)
    op.execute("""
        CREATE TABLE reaction_held (
            reaction        TEXT NOT NULL,
            key             TEXT NOT NULL,
            seq             BIGINT GENERATED ALWAYS AS IDENTITY,
            event_type      TEXT NOT NULL,
            data            JSONB NOT NULL,
            stream_id       TEXT NOT NULL,
            stream_version  BIGINT NOT NULL,
            event_id        TEXT NOT NULL,
            global_position BIGINT NOT NULL,
            recorded_at     TEXT NOT NULL,
            correlation_id  TEXT,
            PRIMARY KEY (reaction, key, seq)
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE reaction_held")
    op.execute("DROP TABLE reaction_parked")
