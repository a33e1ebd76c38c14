"""Interactive queries across instances: which instance serves a key's partition, and
requests forwarded to it.

A partition is served by its active host if that holds it restored, else by the first of its
standbys that does (an answer then says it is stale, and by how many records). The active
host is a holder within the acceptable lag where there is one (``assignment``). A request an
instance cannot serve from its own store is forwarded, with ``local=true``, to the instance
that can; if that one does not answer, to the next. Ranges and counts go to one replica of
each partition and are merged here (``Router.plan``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import NamedTuple

from eventfold.contract.partitioner import partition_for
from eventfold.read_api.state.assignment import Hosting, assign, owners
from eventfold.read_api.state.forwarding import READ_TIMEOUT_S, Answer, Forwarder, ForwardFailed
from eventfold.read_api.state.membership import Member, Membership, TopicReport
from eventfold.read_api.state.view import KTableView

log = logging.getLogger(__name__)

DEFAULT_ACCEPTABLE_LAG = 10_000
"""Kafka Streams' ``acceptable.recovery.lag`` default: a partition's active host is one of
its holders that lags by at most this many records, where there is one."""


class Replica(NamedTuple):
    """An instance that holds a partition restored (a tuple: one is made for every replica
    of a key's partition at every get)."""

    url: str
    local: bool
    active: bool
    lag: int


class ReplicaUnavailable(Exception):
    """A replica did not answer a forwarded request (down, or not holding the partition)."""


class Router:
    def __init__(self, membership: Membership, standby_replicas: int,
                 acceptable_lag: int = DEFAULT_ACCEPTABLE_LAG,
                 forward_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.membership = membership
        self.standby_replicas = standby_replicas
        self.acceptable_lag = acceptable_lag
        self._forwarder = Forwarder(forward_timeout_s)
        self._cache: dict[str, tuple[tuple[Member, ...], int | None,
                                     tuple[dict[str, Hosting], dict[int, list[str]]]]] = {}

    @staticmethod
    def partition_of(view: KTableView, key: str) -> int | None:
        """The key's partition (None while the topic does not exist)."""
        count = view.partition_count
        return None if count is None else partition_for(key, count)

    @staticmethod
    def partitions_of(view: KTableView, key: str) -> list[int]:
        """Where the key may be: its partition under the topic's count now, then where each
        older count put it (a key not written since partitions were added), newest first;
        none while the topic does not exist."""
        count = view.partition_count
        if count is None:
            return []
        found = [partition_for(key, count)]
        for older in reversed(view.partition_history()):
            if older != count and (moved := partition_for(key, older)) not in found:
                found.append(moved)
        return found

    def hosting(self, view: KTableView, members: tuple[Member, ...] | None = None
                ) -> dict[str, Hosting]:
        """Every member's active and standby partitions of ``view``'s topic, from the
        members' last heartbeats (the same on every instance)."""
        return self._placement(view, members)[0]

    def owners(self, view: KTableView, partition: int) -> list[str]:
        """The partition's active host, then its standbys."""
        return self._placement(view)[1].get(partition, [])

    def _placement(self, view: KTableView, members: tuple[Member, ...] | None = None
                   ) -> tuple[dict[str, Hosting], dict[int, list[str]]]:
        members = members or self.membership.members()
        cached = self._cache.get(view.topic)
        if (cached is not None and cached[0] is members
                and cached[1] == view.partition_count):
            return cached[2]
        urls = sorted({m.url for m in members} | {self.membership.url})
        reports = {m.url: m.tables.get(view.topic, TopicReport()) for m in members}
        hosting = assign(urls, range(view.partition_count or 0), self.standby_replicas,
                         {url: r.restored for url, r in reports.items()},
                         {url: r.held for url, r in reports.items()},
                         {url: r.stored for url, r in reports.items()}, self.acceptable_lag)
        placement = (hosting, owners(hosting))
        self._cache[view.topic] = (members, view.partition_count, placement)
        return placement

    def replicas(self, view: KTableView, partition: int) -> list[Replica]:
        """Who can serve ``partition`` now, best first: its active host, then its standbys,
        each only if it holds the partition restored (this instance by its view, the others
        by their last heartbeat)."""
        if self.membership.alone:
            lag = view.partition_lag(partition)
            return [] if lag is None else [Replica("", True, True, lag)]
        found = []
        for rank, url in enumerate(self.owners(view, partition)):
            if url == self.membership.url:
                lag = view.partition_lag(partition)
            else:
                member = self.membership.member(url)
                lag = None if member is None else member.lag(view.topic, partition)
            if lag is not None:
                found.append(Replica(url, url == self.membership.url, rank == 0, lag))
        return found

    def all_served(self, view: KTableView) -> bool:
        """Whether some instance holds every partition of ``view``'s topic restored (a topic
        that does not exist yet is empty: nothing to serve)."""
        return all(self.replicas(view, p) for p in range(view.partition_count or 0))

    def is_active(self, view: KTableView, partition: int) -> bool:
        """Whether this instance is the partition's active host."""
        return (self.membership.alone
                or self.owners(view, partition)[:1] == [self.membership.url])

    def plan(self, view: KTableView, avoid: Collection[str] = ()
             ) -> tuple[dict[Replica, list[int]], list[int]]:
        """One replica for each of the topic's partitions, by replica (avoiding the URLs in
        ``avoid``), and the partitions no replica serves."""
        by_replica: dict[Replica, list[int]] = {}
        missing = []
        for partition in range(view.partition_count or 0):
            replica = next((r for r in self.replicas(view, partition) if r.url not in avoid),
                           None)
            if replica is None:
                missing.append(partition)
            else:
                by_replica.setdefault(replica, []).append(partition)
        return by_replica, missing

    async def forward(self, replica: Replica, path: str, params: Mapping[str, str],
                      headers: Mapping[str, str], waits_s: float = 0.0) -> Answer:
        """``GET path`` on ``replica``, to be answered from its own store (``waits_s``: how
        long it may wait for a version asked for); raises ``ReplicaUnavailable`` if it does
        not answer in time, or answers that it cannot (503)."""
        try:
            answer = await self._forwarder.get(replica.url, path, {**params, "local": "true"},
                                               headers, waits_s)
        except ForwardFailed as exc:
            log.info("ktable read forwarded to %s failed: %s", replica.url, exc)
            raise ReplicaUnavailable(str(exc)) from exc
        if answer.status == 503:
            raise ReplicaUnavailable(f"{replica.url}: {answer.body[:200]!r}")
        return answer

    async def close(self) -> None:
        await self._forwarder.close()
