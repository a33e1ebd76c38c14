"""A replaced KTable topic is deleted once no reader has it open, and at once when none has:
a read API instance that read the registry just before a switch either has its row before the
switch commits (and keeps the old topic), or sees the switch and is told the new version.
On the stack's Postgres, through the catalog's own functions, the reader logged in as read
API instances are (the reader role)."""

from __future__ import annotations

import threading
import uuid

import psycopg

from eventfold.contract import libpq_url
from eventfold.projections.state.catalog import READER_ROLE, ProjectionCatalog
from eventfold.projections.state.readers import READER_TTL_S, forget_reader, note_reader
from eventfold.read_api.freshness import connect_as_reader


def test_a_reader_registering_as_a_switch_retires_its_topic_is_waited_for_or_told(
        inventory_app, stack_settings) -> None:
    name = f"retire_{uuid.uuid4().hex[:8]}"
    old_topic = f"eventfold.ktable.{name}"
    catalog = ProjectionCatalog(stack_settings.database_url)
    catalog.register(name)
    catalog.begin_build(name)
    switched = threading.Event()

    def switch() -> None:
        with catalog.locked(name) as conn:
            catalog.activate(conn, name, 2, {})
            catalog.retire_topic(conn, name, 1, old_topic)
        switched.set()

    deleted: list[str] = []
    with connect_as_reader(stack_settings.database_url, READER_ROLE, read_only=False) as reader:
        try:
            with reader.transaction():  # a registration of v1 under way as the switch comes
                assert note_reader(reader, "instance-a", old_topic, name, 1) is None
                switcher = threading.Thread(target=switch)
                switcher.start()
                assert not switched.wait(1.0), "the switch retired a topic being registered"
            switcher.join(10)
            assert switched.is_set()
            catalog.delete_retired_topics(deleted.extend)
            assert deleted == []  # instance-a's row holds the old topic

            # Another instance that still saw v1 registers nothing and is told v2.
            assert note_reader(reader, "instance-b", old_topic, name, 1) == 2
            assert note_reader(reader, "instance-b", f"{old_topic}.v2", name, 2) is None

            forget_reader(reader, "instance-a", old_topic)  # it moved to v2
            catalog.delete_retired_topics(deleted.extend)
            assert deleted == [old_topic]  # at once: no wait after the switch
        finally:
            forget_reader(reader, "instance-b")
            catalog.close()


def test_rows_of_readers_that_crashed_go_at_the_next_cleanup(inventory_app,
                                                             stack_settings) -> None:
    name = f"gone_{uuid.uuid4().hex[:8]}"
    topic = f"eventfold.ktable.{name}"
    catalog = ProjectionCatalog(stack_settings.database_url)
    catalog.register(name)
    try:
        with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
            for instance in ("crashed", "alive"):
                assert note_reader(conn, f"{name}-{instance}", topic, name, 1) is None
            conn.execute("UPDATE members SET seen_at = now() - make_interval(secs => %s) "
                         "WHERE kind = 'ktable_reader' AND detail ->> 'instance_id' = %s",
                         (READER_TTL_S + 1, f"{name}-crashed"))
            catalog.delete_retired_topics(lambda topics: None)
            left = [row[0] for row in conn.execute(
                "SELECT detail ->> 'instance_id' FROM members WHERE kind = 'ktable_reader' "
                "AND detail ->> 'projection' = %s", (name,))]
            assert left == [f"{name}-alive"]
            forget_reader(conn, f"{name}-alive")
    finally:
        catalog.close()
