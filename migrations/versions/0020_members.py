"""One table for every process that must say it is alive: ``members`` (``contract.members``).

Three tables kept a heartbeat each, with their own renewal and expiry: ``projection_hosts``
(the streaming hosts), ``ktable_readers`` (which read API instance has which KTable topic
open) and ``ktable_members`` (the read API instances dividing KTable partitions). They are
rows of one table now, told apart by ``kind``; each member says how long it lives unrenewed
(``ttl_s``) as it joins, and the view ``live_members`` is the one expiry rule. The reader
role writes only its own kinds (row-level security); the rows are heartbeats, so none are
carried over: every live process writes its row again within a second or three.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

READER_KINDS = "('ktable_reader', 'ktable_member')"


def upgrade() -> None:
    op.execute("""
        CREATE TABLE members (
            kind       TEXT NOT NULL,
            member_id  TEXT NOT NULL,
            detail     JSONB NOT NULL DEFAULT '{}',
            ttl_s      DOUBLE PRECISION NOT NULL CHECK (ttl_s > 0),
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            seen_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (kind, member_id)
        )
    """)
    op.execute("""
        CREATE VIEW live_members AS
            SELECT kind, member_id, detail, ttl_s, started_at, seen_at FROM members
            WHERE seen_at > now() - make_interval(secs => ttl_s)
    """)
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON members TO eventfold_reader")
    op.execute("GRANT SELECT ON live_members TO eventfold_reader")
    op.execute("ALTER TABLE members ENABLE ROW LEVEL SECURITY")
    op.execute("CREATE POLICY reader_sees ON members FOR SELECT TO eventfold_reader "
               "USING (true)")
    op.execute(f"CREATE POLICY reader_writes ON members FOR ALL TO eventfold_reader "
               f"USING (kind IN {READER_KINDS}) WITH CHECK (kind IN {READER_KINDS})")
    for table in ("projection_hosts", "ktable_readers", "ktable_members"):
        op.execute(f"DROP TABLE {table}")


def downgrade() -> None:
    op.execute("""
        CREATE TABLE projection_hosts (
            host_id      TEXT PRIMARY KEY,
            projections  TEXT[] NOT NULL,
            started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
    """)
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
        CREATE TABLE ktable_members (
            url        TEXT PRIMARY KEY,
            seen_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            tables     JSONB NOT NULL DEFAULT '{}'
        )
    """)
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ktable_readers TO eventfold_reader")
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ktable_members TO eventfold_reader")
    op.execute("DROP VIEW live_members")
    op.execute("DROP TABLE members")
