"""What operators see of a process manager: every change of a key's process is an event of a
stream of its own, appended in the transaction that saves the state, so the outbox carries it
like any domain event and an ordinary projection (``<process>_processes``) folds it into a
read model and a KTable, served by the read API as every projection is.

The events: ``ProcessStateChanged`` (the key's state and its pending timers, after the
change) and ``ProcessEnded`` (the key's process is over: its row and KTable entry go). Their
stream, ``<process>/<key>``, keeps its versions across a key's successive processes, so the
projection's per-key version guard holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg
from sqlalchemy import JSON, String

from eventfold.projections.definition.projection import Event, FoldProjection, projection
from eventfold.write_model import (
    ConcurrencyError,
    NewEvent,
    StreamAppend,
    append_in_transaction,
    stream_versions,
)

PROCESS_STATE_CHANGED = "ProcessStateChanged"
PROCESS_ENDED = "ProcessEnded"


class StreamMoved(RuntimeError):
    """A key's stream moved since the batch read its version: another runner of the process
    appended to it meanwhile."""


def stream_type_of(process: str) -> str:
    """The aggregate type of a process's state events (its event topic's suffix)."""
    return f"process.{process}"


def stream_id_of(process: str, key: str) -> str:
    return f"{process}/{key}"


def read_model_name(process: str) -> str:
    return f"{process}_processes"


def record_changes(conn: psycopg.Connection, process: str,
                   changes: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Append each changed key's event (its state, or None for an ended process) inside the
    caller's transaction, with the key's pending timers as they stand now."""
    if not changes:
        return
    running = [key for key, state in changes.items() if state is not None]
    timers = _pending_timers(conn, process, running)
    streams = {key: stream_id_of(process, key) for key in changes}
    versions = stream_versions(conn, list(streams.values()))
    appends = [StreamAppend(stream_type_of(process), streams[key], versions[streams[key]],
                            [_change_event(key, state, timers.get(key, []))])
               for key, state in changes.items()]
    try:
        append_in_transaction(conn, appends)
    except ConcurrencyError as exc:
        raise StreamMoved(str(exc)) from exc


def _change_event(key: str, state: Mapping[str, Any] | None,
                  timers: Sequence[Mapping[str, str]]) -> NewEvent:
    if state is None:
        return NewEvent(PROCESS_ENDED, {"key": key})
    return NewEvent(PROCESS_STATE_CHANGED, {"key": key, "state": dict(state),
                                            "timers": list(timers)})


def _pending_timers(conn: psycopg.Connection, process: str,
                    keys: Sequence[str]) -> dict[str, list[dict[str, str]]]:
    rows = conn.execute(
        "SELECT key, name, fire_at FROM process_timers WHERE process = %s AND key = ANY(%s) "
        "ORDER BY key, fire_at, id", (process, list(keys))).fetchall()
    pending: dict[str, list[dict[str, str]]] = {}
    for key, name, fire_at in rows:
        pending.setdefault(str(key), []).append({"name": str(name),
                                                 "at": fire_at.isoformat()})
    return pending


def fold_process(state: dict[str, Any] | None, event: Event) -> dict[str, Any] | None:
    """A key's row: its process's state and pending timers, or gone once it ended."""
    if event.type == PROCESS_ENDED:
        return None
    return {"state": event.data["state"], "timers": event.data["timers"],
            "updated_at": event.recorded_at}


def state_projection(process: str) -> FoldProjection:
    """The projection of a process's running keys: one row (and KTable entry) per key."""
    folded = projection(
        read_model_name(process), sources=[stream_type_of(process)], key_by="key",
        event_types=[PROCESS_STATE_CHANGED, PROCESS_ENDED],
        columns={"state": JSON(), "timers": JSON(), "updated_at": String()},
    )(fold_process)
    return replace(folded, description=f"The running processes of {process}: each key's "
                                       "state and pending timers.")
