"""The KTable a read API instance serves for each projection: its active version's topic,
restored into a state store (``read_api.state``) and kept live. When a replay switches
versions, the next version's topic is restored beside the old one and swapped in when it is
ready; the old store is then deleted.

Instances that advertise a URL divide each topic's partitions among themselves, as active
and standby hosts (``read_api.state.assignment``), from the members' heartbeats
(``read_api.state.membership``); an instance alone holds every partition. The HTTP workers of
one instance share its RocksDB stores.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from eventfold.outbox.connection import KafkaConnection
from eventfold.read_api.state import KTableView, StoreConfig
from eventfold.read_api.state.membership import Member, Membership
from eventfold.read_api.state.routing import Router
from eventfold.read_api.state.stores import scratch_store_config

if TYPE_CHECKING:
    from eventfold.read_api.presence import ReaderPresence

log = logging.getLogger(__name__)

_RETIRE_AFTER_S = 2.0


class KTableHost:
    """Serves a projection's KTable at its active version, restoring the next version's topic
    in the background when a replay switches and swapping once it is restored.

    With ``presence``, every topic is registered before its consumer assigns it and
    unregistered once that consumer has closed, so that a replay deletes the old topic only
    after this instance has moved off it."""

    def __init__(self, kafka: KafkaConnection, projection: str,
                 topic_for: Callable[[int], str], version: int,
                 presence: ReaderPresence | None = None,
                 store: StoreConfig | None = None, router: Router | None = None,
                 partition_history: Callable[[str, str], tuple[int, ...]] | None = None
                 ) -> None:
        self.kafka = kafka
        self.projection = projection
        self.topic_for = topic_for
        self.presence = presence
        self.store_config = store or scratch_store_config()
        self.router = router or Router(Membership("", dict), standby_replicas=0)
        self.partition_history = partition_history or (lambda _topic, _topic_id: ())
        while (moved_to := self._register(version)) is not None:
            version = moved_to  # a switch came between reading the registry and registering
        self.version = version
        self.view = self._placed(KTableView(kafka, topic_for(version), self.store_config))
        self._next: tuple[int, KTableView] | None = None
        self._retiring: list[tuple[threading.Timer, KTableView]] = []
        self._lock = threading.RLock()  # _close takes it, also within follow's hold
        self._closed: weakref.WeakSet[KTableView] = weakref.WeakSet()

    def start(self) -> KTableHost:
        self.view.start()
        return self

    def stop(self) -> None:
        with self._lock:
            views = [self.view] + ([self._next[1]] if self._next else [])
            retiring, self._retiring = self._retiring, []
        for timer, old in retiring:
            timer.cancel()
            self._close(old, retired=True)
        for view in views:
            self._close(view)

    def follow(self, version: int) -> None:
        """Called when the registry shows ``version`` active; cheap when nothing changed."""
        with self._lock:
            if version == self.version:
                return
            if self._next is None or self._next[0] != version:
                if self._next is not None:
                    self._close(self._next[1])
                    self._next = None
                if self._register(version) is not None:
                    return  # switched again meanwhile: the registry's next answer says to what
                topic = self.topic_for(version)
                log.info("ktable %s: version %d is active, restoring %s", self.view.topic,
                         version, topic)
                self._next = (version, self._placed(
                    KTableView(self.kafka, topic, self.store_config)).start())
            next_version, next_view = self._next
            # Every partition of the new version served somewhere first: else a key whose
            # partition another instance is still restoring would have no answer meanwhile.
            if not next_view.restored or not self.router.all_served(next_view):
                return
            old, self.view, self.version, self._next = self.view, next_view, next_version, None
        # Reads that took the old view just before the swap finish on it first.
        retiring = threading.Timer(_RETIRE_AFTER_S, self._close, (old, True))
        retiring.daemon = True
        with self._lock:
            self._retiring = [(t, v) for t, v in self._retiring if t.is_alive()]
            self._retiring.append((retiring, old))
        retiring.start()
        log.info("ktable now served from %s (version %d)", self.view.topic, self.version)

    def rebalance(self, members: tuple[Member, ...]) -> None:
        """Hold the partitions ``members`` assign this instance, in every version served
        (called after each membership heartbeat)."""
        for view in self.views():
            self._assign(view, members)

    def _assign(self, view: KTableView, members: tuple[Member, ...] | None = None) -> None:
        # Before the first heartbeat this instance knows no other member: wait for it.
        if view.partition_count is not None and (members is not None
                                                 or self.router.membership.wait_first(0)):
            hosting = self.router.hosting(view, members)
            view.assign(hosting[self.router.membership.url].partitions)

    def view_at(self, version: int | None) -> KTableView:
        """The view of ``version`` if this instance serves or restores it, else the one it
        serves (a forwarded read names the version its sender serves; during a replay's
        switch the two instances may be on either side of it)."""
        with self._lock:
            if self._next is not None and self._next[0] == version:
                return self._next[1]
            return self.view

    def version_of(self, view: KTableView) -> int:
        """The projection version ``view`` serves (the next one's while a switch restores)."""
        pending = self._next  # one read: a swap may replace it meanwhile
        return pending[0] if pending is not None and pending[1] is view else self.version

    def superseded_by(self, view: KTableView) -> int | None:
        """The version a replay made active while ``view`` still serves the one before it
        (the next one's topic restoring): it gets no more writes. None otherwise."""
        pending = self._next
        return pending[0] if pending is not None and pending[1] is not view else None

    def views(self) -> list[KTableView]:
        with self._lock:
            return [self.view] + ([self._next[1]] if self._next else [])

    def _placed(self, view: KTableView) -> KTableView:
        view.partition_counts = self.partition_history
        if self.router.membership.alone:
            view.hold_all()
        else:  # placed as soon as it knows its partitions, not at the next heartbeat
            view.on_partitions = self._assign
        return view

    def _register(self, version: int) -> int | None:
        """Register ``version``'s topic before a consumer assigns it; None if registered (or
        nothing registers), else the version active instead."""
        if self.presence is None:
            return None
        return self.presence.opening(self.projection, version, self.topic_for(version))

    def _close(self, view: KTableView, retired: bool = False) -> None:
        """Stop following ``view``'s topic (``retired``: and delete its store, the version
        is no longer served). Once only: a version's retirement timer and ``stop`` may both
        come to it."""
        with self._lock:
            if view in self._closed:
                return
            self._closed.add(view)
        if (view.retire() if retired else view.stop()) and self.presence is not None:
            self.presence.closed(view.topic)
