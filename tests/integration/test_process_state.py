"""A process's state as its events show it (``process_view``), saved in the real Postgres the
way the reaction runner saves it: a timer that fires and schedules again is shown with the
new timer pending, never with the one that just fired; a key of any characters is kept as
given. A batch saves only from the positions it read from. A due timer waits for its
process's stream time."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from eventfold.contract import libpq_url
from eventfold.projections import Event
from eventfold.reactions import Process, ProcessContext
from eventfold.reactions.positions import (
    PositionsMoved,
    Refusal,
    load_positions,
    refusal_count,
    save_at_end,
    save_batch,
    save_stepped_through,
)
from eventfold.reactions.process import (
    database_now,
    load_states,
    save_fired,
    save_states,
    take_due_timers,
    timer_event,
)
from eventfold.reactions.process_view import stream_id_of


def _nudge_hourly(context: ProcessContext, event: Event) -> None:
    """Started: a nudge due at once; each nudge counted, and the next one an hour on."""
    if event.type == "nudge":
        context.state["nudges"] = context.state.get("nudges", 0) + 1
        context.schedule("nudge", after=timedelta(hours=1))
    else:
        context.state["nudges"] = 0
        context.schedule("nudge", after=timedelta(seconds=-1))


def _latest_change(conn: psycopg.Connection, process: str, key: str) -> dict:
    row = conn.execute("SELECT data FROM events WHERE stream_id = %s ORDER BY stream_version "
                       "DESC LIMIT 1", (stream_id_of(process, key),)).fetchone()
    assert row is not None
    return dict(row[0])


def test_a_timer_that_schedules_again_shows_only_its_new_timer(
        inventory_app, stack_settings, unique) -> None:
    reminder = Process(f"remind_{unique}", ("Customer",), _nudge_hourly)
    key = f"{unique} 50%/ünïcode 'key'"  # spaces, %, a slash, quotes: kept as given
    with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
        with conn.transaction():
            states = load_states(conn, reminder.name, [key])
            reminder.step(states.context(key, database_now(conn)),
                          Event("CustomerJoined", {}, key, 1, f"{unique}-e1", 1))
            save_states(conn, reminder.name, states)
        assert [t["name"] for t in _latest_change(conn, reminder.name, key)["timers"]] == [
            "nudge"]

        source = ("eventfold.events.Customer", 0)
        save_batch(conn, reminder.name, {source: 1}, [], read_from={})
        save_stepped_through(conn, reminder.name, {source: database_now(conn)})
        with conn.transaction():  # as the runner fires due timers
            due = take_due_timers(conn, reminder.name, 10, [source[0]], 0.0)
            assert [(t.key, t.name) for t in due] == [(key, "nudge")]
            states = load_states(conn, reminder.name, [key])
            now = database_now(conn)
            for timer in due:
                reminder.step(states.context(timer.key, now),
                              timer_event(timer.key, timer.name, timer.at))
            save_fired(conn, reminder.name, states, due)

        pending = conn.execute("SELECT name, fire_at FROM process_timers WHERE process = %s "
                               "AND key = %s", (reminder.name, key)).fetchall()
        assert len(pending) == 1 and pending[0][1] > now + timedelta(minutes=59)
        change = _latest_change(conn, reminder.name, key)
        assert change["state"] == {"nudges": 1}
        assert change["timers"] == [{"name": "nudge", "at": pending[0][1].isoformat()}]


def test_a_batch_read_from_positions_another_runner_moved_saves_nothing(
        inventory_app, stack_settings, unique) -> None:
    """Two runners' batches read from the same positions, a partition without one among
    them: the first to save moves them; the second saves nothing, refusals included, and is
    told where each partition is."""
    reaction = f"pair_{unique}"
    known, new = ("eventfold.events.Customer", 0), ("eventfold.events.Customer", 1)
    refusal = Refusal(f"{unique}-e1", 0, "refused", "CustomerJoined", "c1", "no")
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        save_batch(conn, reaction, {known: 5}, [], read_from={})  # first run: from 0
        save_batch(conn, reaction, {known: 9, new: 3}, [], read_from={known: 5})
        with pytest.raises(PositionsMoved) as moved:
            save_batch(conn, reaction, {known: 8, new: 2}, [refusal], read_from={known: 5})
        assert str(moved.value) == (
            "another runner saved positions since this batch read from them "
            "(eventfold.events.Customer[0] is at offset 9, not 5; "
            "eventfold.events.Customer[1] is at offset 3, not 0)")
        assert load_positions(conn, reaction) == {known: 9, new: 3}
        assert refusal_count(conn, reaction) == 0


def test_a_due_timer_waits_until_every_partition_is_stepped_past_it(
        inventory_app, stack_settings, unique) -> None:
    """A timer due a minute ago, its process reading two partitions: while one partition has
    been stepped only to events recorded before the due time, it waits (the clock alone
    does not fire it); a partition found at its end is stepped through the time it was
    looked at, unless its saved position is short of that end; with both past the due time
    and the grace, it fires."""
    process = f"stream_time_{unique}"
    topic = f"eventfold.events.StreamTime{unique}"
    first, second = (topic, 0), (topic, 1)
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        now = database_now(conn)
        conn.execute("INSERT INTO process_timers (process, key, name, fire_at) VALUES "
                     "(%s, 'k', 'due', %s)", (process, now - timedelta(minutes=1)))
        save_batch(conn, process, {first: 4, second: 7}, [], read_from={})

        def due() -> list[str]:
            with conn.transaction():
                return [t.name for t in take_due_timers(conn, process, 10, [topic], 2.0)]

        assert due() == [], "no partition stepped yet"
        save_stepped_through(conn, process, {first: now, second: now - timedelta(minutes=2)})
        assert due() == [], "the second partition is behind the due time"
        save_at_end(conn, process, {second: 8}, now)
        assert due() == [], "its saved position is short of its end"
        save_stepped_through(conn, process, {second: now - timedelta(minutes=1)})
        assert due() == [], "stepped to the due time, not the grace past it"
        save_at_end(conn, process, {second: 7}, now)
        assert due() == ["due"]
        save_stepped_through(conn, process, {second: now - timedelta(hours=1)})
        assert conn.execute("SELECT stepped_through FROM reaction_positions WHERE reaction = "
                            "%s AND partition = 1", (process,)).fetchone() == (now,), (
            "stream time never moves back")
