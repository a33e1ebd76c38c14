"""An effect's batch: each event's side effect called at least once, with the idempotency key
it always has for the event, one stream's events one after the other and streams
concurrently; a call that keeps failing is given up on, recorded and parks its stream."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from eventfold.contract.backoff import doubled
from eventfold.projections.definition.projection import Event
from eventfold.reactions.batch import ReactionBatch, ReactionCounts
from eventfold.reactions.definition import Effect
from eventfold.reactions.positions import Refusal

# The runner's logger: an effect's lines are its runner's, and operators filter on its name.
log = logging.getLogger("eventfold.reactions.runner")

MAX_EFFECT_PAUSE_S = 30.0
"""The longest pause between two calls of an effect for one event."""


async def call_effects(effect: Effect, batch: ReactionBatch, counts: ReactionCounts) -> None:
    """Each event's side effect, at least once: one stream's events one after the other,
    streams concurrently; a call given up on is recorded (``failed``) and parks its
    stream."""
    by_stream: dict[str, list[tuple[Event, str | None]]] = defaultdict(list)
    for event, correlation_id in batch.events:
        by_stream[event.stream_id].append((event, correlation_id))

    async def call_in_order(stream: str, events: list[tuple[Event, str | None]]) -> None:
        for event, correlation_id in events:
            if batch.parking.holds(stream, event, correlation_id):
                continue
            if (error := await _call(effect, event, counts)) is not None:
                reason = (f"{effect.max_attempts} attempts, the last: "
                          f"{type(error).__name__}: {error}")
                batch.refusals.append(Refusal(event.event_id, 0, "failed", event.type,
                                              stream, reason))
                batch.parking.park(stream, event, correlation_id, reason)

    await asyncio.gather(*(call_in_order(stream, events)
                           for stream, events in by_stream.items()))
    batch.called = bool(by_stream)

async def _call(effect: Effect, event: Event, counts: ReactionCounts) -> Exception | None:
    """Call ``effect`` for ``event`` until it returns or has failed ``max_attempts``
    times (the last error then), pausing twice as long after each failure."""
    key = effect.idempotency_key(event)
    for attempt in range(1, effect.max_attempts + 1):
        try:
            await asyncio.to_thread(effect.call, event, key)
            counts.sent += 1
            return None
        except Exception as exc:  # the user's call: tried again, then recorded
            if attempt == effect.max_attempts:
                log.warning("effect %s: event %s given up after %d attempts: %s",
                            effect.name, event.event_id, attempt, exc)
                return exc
            pause = doubled(effect.first_pause_s, attempt, MAX_EFFECT_PAUSE_S)
            log.info("effect %s: event %s, attempt %d failed (%s); again in %.1f s",
                     effect.name, event.event_id, attempt, exc, pause)
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")
