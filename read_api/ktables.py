"""The KTable a read API instance serves for each projection: its active version's topic,
restored into a state store (``read_api.state``) and kept live. When a replay switches
versions, the next version's topic is restored beside the old one and swapped in when it is
ready; the old store is then deleted.

Every read API instance assigns itself all partitions (no consumer group), so several
instances each hold the full table; the HTTP workers of one instance share its RocksDB stores.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from eventfold.outbox.connection import KafkaConnection
from eventfold.read_api.state import KTableView, StoreConfig

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
                 store: StoreConfig | None = None) -> None:
        self.kafka = kafka
        self.projection = projection
        self.topic_for = topic_for
        self.presence = presence
        self.store_config = store or StoreConfig()
        while (moved_to := self._register(version)) is not None:
            version = moved_to  # a switch came between reading the registry and registering
        self.version = version
        self.view = KTableView(kafka, topic_for(version), self.store_config)
        self._next: tuple[int, KTableView] | None = None
        self._retiring: list[tuple[threading.Timer, KTableView]] = []
        self._lock = threading.Lock()

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
                self._next = (version, KTableView(self.kafka, topic, self.store_config).start())
            next_version, next_view = self._next
            if not next_view.restored:
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

    def _register(self, version: int) -> int | None:
        """Register ``version``'s topic before a consumer assigns it; None if registered (or
        nothing registers), else the version active instead."""
        if self.presence is None:
            return None
        return self.presence.opening(self.projection, version, self.topic_for(version))

    def _close(self, view: KTableView, retired: bool = False) -> None:
        """Stop following ``view``'s topic (``retired``: and delete its store, the version
        is no longer served)."""
        if (view.retire() if retired else view.stop()) and self.presence is not None:
            self.presence.closed(view.topic)
