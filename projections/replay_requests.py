"""A replay handed to the live host that runs the projection (no second Spark application),
from the requester's side: the request, its progress followed, Ctrl-C cancelling it after its
batch under way. The host's side is ``host``'s."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from eventfold.projections.signals import stop_on_signal

if TYPE_CHECKING:
    from eventfold.projections.replay import ReplayResult

log = logging.getLogger("eventfold")


class ReplayCancelled(RuntimeError):
    """The requester of a replay handed to a host cancelled it (Ctrl-C): it stops after its
    batch under way, and resumes from there when asked again."""


class ReplayFailed(RuntimeError):
    """A replay handed to a host failed there, or the host died under it."""


def replay_on_a_host(database_url: str, name: str, source: str) -> ReplayResult | None:
    """Hand the replay of ``name`` to the live host that runs it and follow it (Ctrl-C or
    SIGTERM cancel it after its batch under way); None when no host runs ``name``."""
    from eventfold.projections.replay import ReplayProgress, ReplayResult
    from eventfold.projections.state.hosts import ENDED, HostDirectory

    directory = HostDirectory(database_url)
    try:
        host_id = directory.host_running(name)
        if host_id is None:
            return None
        request_id = directory.submit(host_id, name, "replay", source)
        log.info("replay of %s handed to the host running it, %s (request %d); Ctrl-C "
                 "cancels it", name, host_id, request_id)
        cancel = threading.Event()
        stop_on_signal(cancel, "cancelling the replay after its batch under way")
        progress: ReplayProgress | None = None
        while True:
            cancel.wait(0.25)  # a Ctrl-C reaches the host at once, not at the next poll
            request = directory.request(request_id)
            if progress is None and request.total:
                progress = ReplayProgress(name, request.total)
            if progress is not None and request.done > progress.done:
                progress.advance_to(request.done)
            if request.state in ENDED:
                break
            if not request.host_alive and request.state == "pending" and (
                    moved := directory.reroute(request_id, name)) is not None:
                log.info("the host %s stopped answering before it started the replay; "
                         "handed to %s", host_id, moved)
                host_id = moved
                continue
            if not request.host_alive:
                raise ReplayFailed(f"the host {host_id} stopped answering during the replay "
                                   f"of {name}; run the replay again: it resumes")
            if cancel.is_set() and not request.cancel:
                directory.cancel(request_id)
        if progress is not None:
            progress.close()
        if cancel.is_set() and request.state == "done":
            log.info("the replay of %s had finished before the host saw the cancel", name)
        if request.state == "cancelled":
            raise ReplayCancelled(request.error or f"replay of {name} cancelled")
        if request.state == "failed" or request.result is None:
            raise ReplayFailed(f"replay of {name} failed on the host {host_id}: "
                               f"{request.error}")
        found = request.result
        return ReplayResult(name, found["old_version"], found["new_version"], found["events"],
                            found["seconds"])
    finally:
        directory.close()
