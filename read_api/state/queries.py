"""Interactive queries over an app's KTables across the read API instances, as Kafka Streams'
``ReadOnlyKeyValueStore`` answers them over a whole table: ``get`` a key, a ``range`` of keys
(a page), ``export`` every entry in a range, ``count`` the keys. Each is answered from this
instance's stores where it holds the partitions restored, else forwarded to (a get) or
gathered from (the rest) the instances that do, and merged in key order (``merge``).

Answers are JSON-ready dicts; a get that another instance answered is handed on as that
instance's body. What cannot be answered now raises ``Unavailable`` (a 503 with
Retry-After); a table this app does not have, ``UnknownTable``.

Between instances, a forwarded request is the same route with ``local=true`` (answer from
your own store, do not forward), ``version`` (the projection version the sender serves: the
two may be on either side of a replay's switch) and, for ranges and counts,
``partitions``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote

import orjson

from eventfold.read_api.state.entry import KTableEntry
from eventfold.read_api.state.membership import TopicReport
from eventfold.read_api.state.merge import merge_pages, merge_sorted
from eventfold.read_api.state.routing import Replica, ReplicaUnavailable, Router
from eventfold.read_api.state.stores import NotHeld
from eventfold.read_api.state.view import KTableView

GATHER_PAGE = 1000
"""Entries an export asks each instance for at a time."""
_BY_KEY = itemgetter("key")


class Unavailable(Exception):
    """Nothing can answer now (restoring, or partitions moving between instances)."""


class UnknownTable(LookupError):
    """No KTable of that name."""


class Caller(NamedTuple):
    """What a request says that its answer depends on, and that a request forwarded for it
    carries on (a tuple: one is made for every get)."""

    authorization: str | None = None
    local: bool = False
    """A forwarded request: answer from this instance's store, never forward again."""
    version: int | None = None
    """A forwarded request: the projection version its sender serves."""
    partitions: tuple[int, ...] = ()
    """A forwarded range or count: the partitions asked for."""
    partition: int | None = None
    """A forwarded get: the partition to look in."""
    min_version: int | None = None
    wait_ms: int | None = None
    """With ``min_version``: how long to wait for it (the default applied)."""


@dataclass(frozen=True)
class Forwarded:
    """Another instance's answer to a get, handed on as it came."""

    status: int
    body: bytes


class ServedTable(Protocol):
    """A KTable as an instance serves it (``read_api.ktables.KTableHost``): the view of its
    active version, and during a replay's switch the next version's."""

    @property
    def view(self) -> KTableView: ...

    @property
    def version(self) -> int: ...

    def view_at(self, version: int | None) -> KTableView: ...

    def version_of(self, view: KTableView) -> int: ...

    def superseded_by(self, view: KTableView) -> int | None: ...


Wait = Callable[[Callable[[], Awaitable[int | None]]], Awaitable[None]]
"""Waits until a probe of the version applied reaches the caller's ``min_version``."""


def entry_json(key: str, entry: KTableEntry) -> dict[str, Any]:
    return {"key": key, "value": entry.value, "version": entry.version}


class KTableQueries:
    def __init__(self, hosts: Mapping[str, ServedTable], routing: Router, instance_id: str,
                 names: Sequence[str]) -> None:
        self.hosts = hosts
        self.routing = routing
        self.instance_id = instance_id
        self.names = sorted(names)
        self.me = routing.membership.url or None

    # -- which table, which view --------------------------------------------------------------
    def host(self, name: str) -> ServedTable:
        host = self.hosts.get(name)
        if host is None:
            raise UnknownTable(f"unknown KTable {name!r}; known: {self.names}")
        return host

    def _view(self, name: str, caller: Caller) -> tuple[ServedTable, KTableView]:
        """The view a request reads: a forwarded one names the version its sender serves."""
        host = self.host(name)
        return host, (host.view_at(caller.version) if caller.local else host.view)

    def unavailable(self, name: str, view: KTableView, partition: int | None) -> Unavailable:
        if partition is None or self.routing.membership.alone:
            progress = view.progress
            return Unavailable(f"KTable {name} is restoring ({progress.records} of "
                               f"{progress.total} records); retry shortly")
        return Unavailable(f"no instance serves partition {partition} of KTable {name} yet "
                           "(restoring, or moving after an instance joined or left); retry "
                           "shortly")

    # -- freshness ----------------------------------------------------------------------------
    def freshness(self, host: ServedTable, view: KTableView, partition: int | None = None
                  ) -> dict[str, Any]:
        """How current an answer from ``view`` is: its measured lag, and whether it is stale
        (served by a standby, lagging past the acceptable lag, or of a version a replay has
        replaced: ``superseded_by``)."""
        superseded_by = host.superseded_by(view)
        lag = view.lag if partition is None else view.partition_lag(partition) or 0
        found: dict[str, Any] = {
            "topic": view.topic, "projection_version": host.version_of(view),
            "restored": view.restored, "lag_records": lag,
            "lag_measured_at": view.lag_measured_at,
            "instance": self.instance_id, "served_by": self.me}
        stale = superseded_by is not None or lag > self.routing.acceptable_lag
        if partition is not None:
            found["partition"] = partition
            stale = stale or not self.routing.is_active(view, partition)
        if partition is not None or superseded_by is not None:
            found["stale"] = stale
        if superseded_by is not None:
            found["superseded_by"] = superseded_by
        return found

    def _gathered_freshness(self, host: ServedTable, view: KTableView,
                            replicas: Sequence[Replica]) -> dict[str, Any]:
        found = self.freshness(host, view)
        return {**found, "lag_records": sum(r.lag for r in replicas),
                "served_by": sorted({r.url or "" for r in replicas}) if self.me else self.me,
                "stale": found.get("stale", False) or not all(r.active for r in replicas)
                or any(r.lag > self.routing.acceptable_lag for r in replicas)}

    # -- get ------------------------------------------------------------------------------------
    async def get(self, name: str, key: str, caller: Caller, wait: Wait | None = None
                  ) -> tuple[int, dict[str, Any]] | Forwarded:
        """The key's entry (200) or its absence (404), from this instance or the one that
        holds the key's partition; ``wait`` (with ``caller.min_version``) waits for a
        version where the key is answered. A key not in its partition is looked for where
        the topic's older partition counts put it (partitions added since it was written)."""
        host, view = self._view(name, caller)
        if caller.local:
            # The partition the sender chose, unless this instance has switched versions
            # past the sender's (a replay): then the key is where this version put it.
            partition = (caller.partition if caller.partition is not None
                         and host.version_of(view) == caller.version
                         else self.routing.partition_of(view, key))
            if not (view.restored if partition is None else partition in view.ready_partitions):
                raise self.unavailable(name, view, partition)
            return await self._local_get(host, view, name, key, partition, wait)
        candidates = self.routing.partitions_of(view, key)
        if not candidates:  # no topic yet: nothing in it
            if not view.restored:
                raise self.unavailable(name, view, None)
            return await self._local_get(host, view, name, key, None, wait)
        first: tuple[int, dict[str, Any]] | Forwarded | None = None
        unavailable: Unavailable | None = None
        for n, partition in enumerate(candidates):
            try:
                answer = await self._get_in(host, view, name, key, partition, caller,
                                            wait if n == 0 else None)
            except Unavailable as exc:  # the key may be there: answered only if found else
                unavailable = unavailable or exc
                continue
            if (answer.status if isinstance(answer, Forwarded) else answer[0]) != 404:
                return answer
            first = first or answer
        if unavailable is not None or first is None:
            raise unavailable or self.unavailable(name, view, candidates[0])
        return first

    async def _get_in(self, host: ServedTable, view: KTableView, name: str, key: str,
                      partition: int, caller: Caller, wait: Wait | None
                      ) -> tuple[int, dict[str, Any]] | Forwarded:
        """The key's entry in ``partition``, from this instance or the replica that holds
        it (told which partition: while partitions are being added, the two instances may
        count them differently)."""
        for replica in self.routing.replicas(view, partition):
            if replica.local:
                return await self._local_get(host, view, name, key, partition, wait)
            params = {**self._forwarded_params(host, caller), "partition": str(partition)}
            with contextlib.suppress(ReplicaUnavailable):
                answer = await self.routing.forward(
                    replica, f"/ktables/{quote(name, safe='')}/entries/{quote(key, safe='')}",
                    params, self._headers(caller),
                    (caller.wait_ms or 0) / 1000 if caller.min_version is not None else 0.0)
                return Forwarded(answer.status, answer.body)
        raise self.unavailable(name, view, partition)

    async def _local_get(self, host: ServedTable, view: KTableView, name: str, key: str,
                         partition: int | None, wait: Wait | None
                         ) -> tuple[int, dict[str, Any]]:
        if wait is not None:
            async def applied() -> int | None:
                entry = self._entry(name, view, key, partition)
                return entry.version if entry else None

            await wait(applied)
        entry = self._entry(name, view, key, partition)
        if entry is None:
            if partition is not None and (to := view.store.moved_to(key, partition)) is not None:
                raise Unavailable(f"key {key!r} of KTable {name} is moving from partition "
                                  f"{partition} to {to} (partitions were added); retry "
                                  "shortly")
            return 404, {"detail": f"no value for key {key!r} in KTable {name}",
                         "freshness": self.freshness(host, view, partition)}
        return 200, {**entry_json(key, entry),
                     "freshness": self.freshness(host, view, partition)}

    def _entry(self, name: str, view: KTableView, key: str, partition: int | None
               ) -> KTableEntry | None:
        try:
            return view.get(key, partition)
        except NotHeld:  # let go of since the request was routed here
            raise self.unavailable(name, view, partition) from None

    # -- range ----------------------------------------------------------------------------------
    async def range(self, name: str, caller: Caller, start: str | None, end: str | None,
                    after: str | None, limit: int) -> dict[str, Any]:
        """A page of entries in key order: ``start <= key <= end``, ``key > after``."""
        host, view = self._view(name, caller)
        if caller.local:  # one instance's part of a gathered range
            return {"entries": self._local_range(name, view, caller.partitions, start, end,
                                                 after, limit)}
        if not view.restored and view.partition_count is None:
            raise self.unavailable(name, view, None)
        bounds = _bounds(start, end, after)
        answers, replicas = await self._gathered(
            name, host, view, caller, f"/ktables/{quote(name, safe='')}/entries",
            lambda partitions: self._local_range(name, view, partitions, start, end, after,
                                                 limit + 1),
            {**bounds, "limit": str(limit + 1), "format": "json"})
        pages = [a if isinstance(a, list) else a["entries"] for a in answers]
        found = merge_sorted([iter(page) for page in pages], _BY_KEY, limit + 1)
        page = found[:limit]
        return {"entries": page, "next_after": page[-1]["key"] if len(found) > limit else None,
                "freshness": self._gathered_freshness(host, view, replicas)}

    def _local_range(self, name: str, view: KTableView, partitions: Sequence[int],
                     start: str | None, end: str | None, after: str | None, limit: int
                     ) -> list[dict[str, Any]]:
        self._held(name, view, partitions)
        every = len(partitions) == view.partition_count
        return [entry_json(k, e) for k, e in view.store.range(
            start, end, after, limit, None if every else partitions)]

    def _held(self, name: str, view: KTableView, partitions: Sequence[int]) -> None:
        missing = [p for p in partitions if p not in view.ready_partitions]
        if missing:
            raise self.unavailable(name, view, missing[0])

    # -- export ---------------------------------------------------------------------------------
    def export(self, name: str, caller: Caller, start: str | None, end: str | None
               ) -> AsyncIterator[list[dict[str, Any]]]:
        """Every entry in range, a chunk at a time: each replica's partitions read a page at a
        time after their own last key, merged in key order. Raises ``Unavailable`` now,
        rather than ending the stream short, if some partition has no replica."""
        host, view = self._view(name, caller)
        if not view.restored and view.partition_count is None:
            raise self.unavailable(name, view, None)
        plan, missing = self.routing.plan(view)
        if missing:
            raise self.unavailable(name, view, missing[0])
        parts = [self._pages(name, host, view, caller, replica, partitions, start, end)
                 for replica, partitions in plan.items()]
        return merge_pages(parts, _BY_KEY, GATHER_PAGE)

    async def _pages(self, name: str, host: ServedTable, view: KTableView, caller: Caller,
                     replica: Replica | None, partitions: list[int], start: str | None,
                     end: str | None, after: str | None = None,
                     avoid: frozenset[str] = frozenset()
                     ) -> AsyncIterator[list[dict[str, Any]]]:
        """Some partitions' entries in range after ``after``, a page at a time, from
        ``replica`` (None: the first replica of the one partition not in ``avoid``). If the
        replica fails, each partition goes on from another one, after the last key read."""
        if replica is None:
            [partition] = partitions
            replica = next((r for r in self.routing.replicas(view, partition)
                            if r.url not in avoid), None)
            if replica is None:
                raise self.unavailable(name, view, partition)
        while True:
            try:
                page = await self._page(name, host, view, caller, replica, partitions, start,
                                        end, after)
            except ReplicaUnavailable:
                avoid |= {replica.url}
                async for chunk in merge_pages([
                        self._pages(name, host, view, caller, None, [p], start, end, after,
                                    avoid) for p in partitions], _BY_KEY, GATHER_PAGE):
                    yield chunk
                return
            if page:
                yield page
            if len(page) < GATHER_PAGE:
                return
            after = page[-1]["key"]

    async def _page(self, name: str, host: ServedTable, view: KTableView, caller: Caller,
                    replica: Replica, partitions: list[int], start: str | None,
                    end: str | None, after: str | None) -> list[dict[str, Any]]:
        if replica.local:
            return self._local_range(name, view, partitions, start, end, after, GATHER_PAGE)
        answer = await self._part_of(host, caller, replica,
                                     f"/ktables/{quote(name, safe='')}/entries", partitions,
                                     {**_bounds(start, end, after), "limit": str(GATHER_PAGE)})
        entries: list[dict[str, Any]] = answer["entries"]
        return entries

    # -- count ----------------------------------------------------------------------------------
    async def count(self, name: str, caller: Caller) -> dict[str, Any]:
        """The keys of every partition, as each instance serving it holds them now."""
        host, view = self._view(name, caller)
        if caller.local:
            return {"counts": self._local_counts(name, view, caller.partitions)}
        if view.partition_count is None:
            if not view.restored:
                raise self.unavailable(name, view, None)
            return {"count": 0, "approximate": True, "freshness": self.freshness(host, view)}
        answers, replicas = await self._gathered(
            name, host, view, caller, f"/ktables/{quote(name, safe='')}/count",
            lambda partitions: {"counts": self._local_counts(name, view, partitions)}, {})
        total = sum(n for answer in answers for n in answer["counts"].values())
        return {"count": total, "approximate": True,
                "freshness": self._gathered_freshness(host, view, replicas)}

    def _local_counts(self, name: str, view: KTableView, partitions: Sequence[int]
                      ) -> dict[str, int]:
        self._held(name, view, partitions)
        counts = view.store.counts()
        return {str(p): counts.get(p, 0) for p in partitions}

    # -- fan-out --------------------------------------------------------------------------------
    async def _gathered(self, name: str, host: ServedTable, view: KTableView, caller: Caller,
                        path: str, local: Callable[[list[int]], Any],
                        remote_params: dict[str, str]) -> tuple[list[Any], list[Replica]]:
        """Ask one replica of every partition (this instance from its store by ``local``,
        the others at ``path`` with ``remote_params``); an instance that fails is avoided in
        a next round. The answers, and the replicas that gave them."""
        avoid: set[str] = set()
        for _ in range(3):
            plan, missing = self.routing.plan(view, avoid)
            if missing:
                raise self.unavailable(name, view, missing[0])
            replicas = list(plan)

            async def ask(replica: Replica, partitions: list[int]) -> Any:
                if replica.local:
                    return local(partitions)
                return await self._part_of(host, caller, replica, path, partitions,
                                           remote_params)

            answers = await asyncio.gather(*(ask(r, plan[r]) for r in replicas),
                                           return_exceptions=True)
            failed = {r.url for r, a in zip(replicas, answers, strict=True)
                      if isinstance(a, ReplicaUnavailable)}
            for answer in answers:
                if isinstance(answer, BaseException) and not isinstance(answer,
                                                                        ReplicaUnavailable):
                    raise answer
            if not failed:
                return answers, replicas
            avoid |= failed
        raise self.unavailable(name, view, None)

    async def _part_of(self, host: ServedTable, caller: Caller, replica: Replica, path: str,
                       partitions: list[int], params: Mapping[str, str]) -> Any:
        """Another instance's answer at ``path`` for some of the partitions it holds, as
        JSON; ``ReplicaUnavailable`` if it does not answer 200."""
        answer = await self.routing.forward(
            replica, path, {**self._forwarded_params(host, caller), **params,
                            "partitions": ",".join(map(str, partitions))},
            self._headers(caller))
        if answer.status != 200:
            raise ReplicaUnavailable(f"{replica.url}: {answer.status} {answer.body[:200]!r}")
        return orjson.loads(answer.body)

    @staticmethod
    def _forwarded_params(host: ServedTable, caller: Caller) -> dict[str, str]:
        found = {"version": str(host.version)}
        if caller.min_version is not None:
            found["min_version"] = str(caller.min_version)
        if caller.wait_ms is not None:
            found["wait_ms"] = str(caller.wait_ms)
        return found

    @staticmethod
    def _headers(caller: Caller) -> dict[str, str]:
        return {"authorization": caller.authorization} if caller.authorization else {}

    # -- metadata -------------------------------------------------------------------------------
    def tables(self) -> dict[str, Any]:
        return {"instance": self.instance_id, "url": self.me, "ktables": [
            {"name": name, "keys": len(host.view), "restore": host.view.progress.as_json(),
             "partitions": sorted(host.view.ready_partitions),
             **self.freshness(host, host.view)}
            for name, host in self.hosts.items()]}

    def metadata(self, name: str) -> dict[str, Any]:
        """Which instance holds which partitions, as active and standby."""
        view = self.host(name).view
        membership = self.routing.membership
        # What the members last reported, this instance too: what the assignment is made of.
        members = {m.url: m for m in membership.members()}
        instances = []
        for url, hosting in self.routing.hosting(view).items():
            ready = (members[url].tables.get(view.topic, TopicReport()).restored
                     if url in members and not membership.alone else view.partition_lags())
            instances.append({"url": url or None, "self": url == membership.url,
                              "active": sorted(hosting.active),
                              "standby": sorted(hosting.standby),
                              "restored": {str(p): lag for p, lag in sorted(ready.items())}})
        return {"name": name, "topic": view.topic, "partitions": view.partition_count,
                "standby_replicas": self.routing.standby_replicas,
                "acceptable_lag": self.routing.acceptable_lag, "instances": instances}

    def key_metadata(self, name: str, key: str) -> dict[str, Any]:
        """Which instance holds a key (as Kafka Streams' ``queryMetadataForKey``)."""
        view = self.host(name).view
        partition = self.routing.partition_of(view, key)
        if partition is None:
            return {"key": key, "partition": None, "active": None, "standbys": [],
                    "serving": []}
        owners = self.routing.owners(view, partition)
        return {"key": key, "partition": partition, "active": owners[0] or None,
                "standbys": [u or None for u in owners[1:]],
                "serving": [{"url": r.url or None, "active": r.active, "lag_records": r.lag}
                            for r in self.routing.replicas(view, partition)]}


def _bounds(start: str | None, end: str | None, after: str | None) -> dict[str, str]:
    return {k: v for k, v in (("from", start), ("to", end), ("after", after)) if v is not None}
