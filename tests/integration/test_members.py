"""The one membership mechanism on the stack's Postgres: a member is alive while its last
renewal is younger than the time it stated as it joined, a process long dead is cleared by
the next joiner of its kind, and the read API's role writes only the read API's kinds."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from eventfold.contract import libpq_url
from eventfold.contract.members import (
    GONE_AFTER,
    KTABLE_MEMBER,
    PROJECTION_HOST,
    join,
    leave,
    live,
    renew,
)
from eventfold.projections.state.catalog import READER_ROLE
from eventfold.read_api.freshness import connect_as_reader


def _age(conn: psycopg.Connection, kind: str, member_id: str, seconds: float) -> None:
    conn.execute("UPDATE members SET seen_at = now() - make_interval(secs => %s) "
                 "WHERE kind = %s AND member_id = %s", (seconds, kind, member_id))


def _ids(conn: psycopg.Connection, kind: str, prefix: str) -> list[str]:
    return [m.member_id for m in live(conn, kind) if m.member_id.startswith(prefix)]


def test_a_member_lives_for_the_time_it_stated_and_the_long_dead_are_cleared(
        inventory_app, stack_settings) -> None:
    prefix = f"m-{uuid.uuid4().hex[:8]}"
    short, long = f"{prefix}-short", f"{prefix}-long"
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        join(conn, PROJECTION_HOST, short, 2.0, {"projections": ["a"]})
        join(conn, PROJECTION_HOST, long, 30.0, {"projections": ["b"]})
        assert _ids(conn, PROJECTION_HOST, prefix) == [long, short]
        assert [m.detail for m in live(conn, PROJECTION_HOST)
                if m.member_id == short] == [{"projections": ["a"]}]

        for member in (short, long):  # both unrenewed for 3 s: only the 2 s member expired
            _age(conn, PROJECTION_HOST, member, 3.0)
        assert _ids(conn, PROJECTION_HOST, prefix) == [long]

        assert renew(conn, PROJECTION_HOST, short)  # its row is there: it lives again
        assert _ids(conn, PROJECTION_HOST, prefix) == [long, short]

        _age(conn, PROJECTION_HOST, short, 2.0 * GONE_AFTER + 1)
        join(conn, PROJECTION_HOST, f"{prefix}-joiner", 10.0)  # clears the long-dead row
        assert not renew(conn, PROJECTION_HOST, short)
        assert conn.execute("SELECT count(*) FROM members WHERE member_id = %s",
                            (short,)).fetchone() == (0,)

        leave(conn, PROJECTION_HOST, long)
        assert _ids(conn, PROJECTION_HOST, prefix) == [f"{prefix}-joiner"]
        leave(conn, PROJECTION_HOST, f"{prefix}-joiner")


def test_the_read_role_writes_only_the_read_apis_kinds(inventory_app, stack_settings) -> None:
    prefix = f"r-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as owner:
        join(owner, PROJECTION_HOST, f"{prefix}-host", 10.0, {"projections": ["x"]})
    with connect_as_reader(stack_settings.database_url, READER_ROLE, read_only=False) as reader:
        join(reader, KTABLE_MEMBER, f"{prefix}-instance", 5.0, {"t": {}})
        assert _ids(reader, KTABLE_MEMBER, prefix) == [f"{prefix}-instance"]
        assert _ids(reader, PROJECTION_HOST, prefix) == [f"{prefix}-host"]  # it may see hosts
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            join(reader, PROJECTION_HOST, f"{prefix}-posing", 10.0)
        leave(reader, PROJECTION_HOST, f"{prefix}-host")  # matches no row it may delete
        leave(reader, KTABLE_MEMBER, f"{prefix}-instance")
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as owner:
        assert _ids(owner, PROJECTION_HOST, prefix) == [f"{prefix}-host"]
        leave(owner, PROJECTION_HOST, f"{prefix}-host")
