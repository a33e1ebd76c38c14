"""A reaction's source topic deleted and made again while its runner runs (a wrong tool, a
restore): the runner notices before it saves the batch that read the new topic, moves its
positions to the new topic's beginning, and acts on every event of it, once; started again,
it acts on nothing again."""

from __future__ import annotations

import threading
import uuid

import psycopg

from eventfold import Event, Eventfold, reaction
from eventfold.contract import libpq_url
from tests.pipeline_helpers import wait_for
from tests.support.campaign import app as campaign
from tests.support.events import made_again, publish


def _stamps(settings, card_prefix: str) -> dict[str, int]:
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        return {str(rung): int(n) for rung, n in conn.execute(
            "SELECT data->>'rung', count(*) FROM events WHERE stream_type = 'Card' AND "
            "stream_id LIKE %s GROUP BY 1", (f"{card_prefix}%",))}


def test_a_source_topic_made_again_under_a_running_reaction_loses_and_repeats_nothing(
        inventory_app, stack_settings) -> None:
    unique = uuid.uuid4().hex[:8]
    aggregate = f"Counted{unique}"
    app = Eventfold(f"sources_{unique}")
    app.commands.add(campaign.Card)
    card = f"card-{unique}"

    @reaction(f"stamp_{unique}", sources=[aggregate], start="earliest")
    def stamp_every(event: Event) -> campaign.Stamp:
        return campaign.Stamp(card=f"{card}-{event.stream_id}", rung=event.event_id)

    app.reactions.add(stamp_every)
    app.runtime(stack_settings).setup()
    publish(stack_settings, aggregate, [(f"s{n}", "Counted", {"note": "old"}) for n in range(5)])

    def run(stopping: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=app.runtime(stack_settings).run_reactions,
                                  args=([f"stamp_{unique}"], stopping), daemon=True)
        thread.start()
        return thread

    stopping = threading.Event()
    running = run(stopping)
    try:
        wait_for(lambda: len(_stamps(stack_settings, card)) == 5, "the old events acted on")
        made_again(stack_settings, aggregate, "new", 8)
        wait_for(lambda: len(_stamps(stack_settings, card)) == 13,
                 "every event of the new topic acted on", timeout_s=60)
    finally:
        stopping.set()
        running.join(60)
    stopping = threading.Event()
    running = run(stopping)
    try:
        publish(stack_settings, aggregate, [("s0", "Counted", {"note": "after"})])
        wait_for(lambda: len(_stamps(stack_settings, card)) == 14, "the next event acted on")
    finally:
        stopping.set()
        running.join(60)
    assert set(_stamps(stack_settings, card).values()) == {1}
