"""The ids of the source topics a reader's saved offsets count, in Postgres
(``source_topic_ids``), for every reader of event topics: a projection version's checkpoint
and a reaction's positions.

A topic deleted and made again has another id and begins again at offset 0, so offsets saved
for the one that is gone would skip as many events of the new one. Its end offsets alone
show that only while the new topic is shorter: one written past the saved offsets while no
reader ran looks like the old one. The id tells them apart, so a reader records the ids it
starts on and compares them at each start after.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import psycopg

from eventfold.outbox.topics import TopicAdmin

TABLE = "source_topic_ids"


def projection_reader(name: str, version: int) -> str:
    return f"projection {name} v{version}"


def reaction_reader(name: str) -> str:
    return f"reaction {name}"


def current_ids(admin: TopicAdmin, topics: Iterable[str]) -> dict[str, str]:
    """The id of each of ``topics`` that exists now."""
    return {topic: shape.topic_id for topic, shape in admin.describe_all(topics).items()
            if shape is not None}


def recorded_ids(conn: psycopg.Connection, reader: str) -> dict[str, str]:
    rows = conn.execute(f"SELECT topic, topic_id FROM {TABLE} WHERE reader = %s",
                        (reader,)).fetchall()
    return {str(topic): str(topic_id) for topic, topic_id in rows}


def record_ids(conn: psycopg.Connection, reader: str, ids: Mapping[str, str]) -> None:
    """``reader``'s saved offsets count the topics with ``ids`` from now on (in the caller's
    transaction, where it saves offsets of the topics as they are now)."""
    if not ids:
        return
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {TABLE} (reader, topic, topic_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (reader, topic) DO UPDATE SET topic_id = EXCLUDED.topic_id, "
            "recorded_at = now() WHERE "
            f"{TABLE}.topic_id IS DISTINCT FROM EXCLUDED.topic_id",
            [(reader, topic, topic_id) for topic, topic_id in sorted(ids.items())])


def forget_ids(conn: psycopg.Connection, reader: str) -> None:
    conn.execute(f"DELETE FROM {TABLE} WHERE reader = %s", (reader,))


def made_again(recorded: Mapping[str, str], current: Mapping[str, str]
               ) -> dict[str, tuple[str, str]]:
    """The topics that have another id now than the one recorded: (recorded, now)."""
    return {topic: (recorded[topic], topic_id) for topic, topic_id in current.items()
            if recorded.get(topic, topic_id) != topic_id}
