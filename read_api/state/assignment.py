"""Which read API instance hosts which partitions of a KTable, as active or standby.

Every instance computes the assignment from the same live members and what each reports it
holds restored (``membership``), so every instance computes the same. Each partition has
``1 + standby_replicas`` holders; each member holds at most its share of the copies. In
order:

1. each partition keeps one member that holds it restored (the first in the order of a hash
   of (member, partition): rendezvous hashing), within its share;
2. a member that has just started takes back the partitions it has stores of on disk (it
   restores only what came after their checkpoints);
3. every member keeps what it holds, restored or still restoring (so an assignment, once
   made, stays);
4. the copies still missing go to the least-loaded members;
5. the active host of each partition is a holder that has it restored within the acceptable
   lag (as Kafka Streams' ``acceptable.recovery.lag``: an instance far behind does not become
   active while one that is caught up can serve), the one with the fewest active partitions
   so far; failing that, a holder that has it restored however far behind.

So a partition stays where it is restored; when a member leaves, its partitions are served
at once by their other holders; a member that joins restores its share while the members
that hold those partitions serve them, and becomes their active host once it has restored
them (as Kafka Streams' warm-up replicas do). With nothing restored anywhere (a first
start), the copies are dealt evenly by hash.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial


@dataclass(frozen=True)
class Hosting:
    """What one member holds of a topic."""

    active: frozenset[int] = field(default_factory=frozenset)
    standby: frozenset[int] = field(default_factory=frozenset)

    @property
    def partitions(self) -> frozenset[int]:
        return self.active | self.standby


def _rank(member: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{partition}|{member}".encode(), digest_size=8).digest()


def assign(members: Sequence[str], partitions: Iterable[int], standby_replicas: int,
           restored: Mapping[str, Mapping[int, int] | Collection[int]] | None = None,
           held: Mapping[str, Collection[int]] | None = None,
           stored: Mapping[str, Collection[int]] | None = None,
           acceptable_lag: int | None = None) -> dict[str, Hosting]:
    """Every member's active and standby partitions (a member with none is still listed).
    What each member reports: ``restored``, the partitions it holds restored now (with each
    one's lag in records, when known); ``held``, those it holds (as last assigned), restored
    or restoring; ``stored``, those it has a store of on disk (restoring one takes only the
    records after its checkpoint)."""
    live, holding, on_disk = restored or {}, held or {}, stored or {}
    dealt = sorted(partitions)
    if not members or not dealt:
        return {m: Hosting() for m in members}
    copies = min(1 + standby_replicas, len(set(members)))
    share = math.ceil(len(dealt) * copies / len(set(members)))
    ranked = {p: sorted(set(members), key=partial(_rank, partition=p), reverse=True)
              for p in dealt}
    holders: dict[int, list[str]] = {p: [] for p in dealt}
    load: dict[str, int] = dict.fromkeys(members, 0)

    def keep(having: Mapping[str, Collection[int]], rounds: int) -> None:
        """Each partition keeps members that have it, one per round, within shares."""
        for _ in range(rounds):
            for partition in dealt:
                if len(holders[partition]) >= copies:
                    continue
                kept = next((m for m in ranked[partition] if m not in holders[partition]
                             and partition in having.get(m, ()) and load[m] < share), None)
                if kept is not None:
                    holders[partition].append(kept)
                    load[kept] += 1

    keep(live, 1)  # first, one holder that serves it now
    # a member that has just started takes back what it has stores of
    keep({m: on_disk.get(m, ()) for m in members if not holding.get(m)}, copies)
    keep(holding, copies)  # then each keeps what it holds (restoring or not)
    keep(live, copies)
    for partition in dealt:
        while len(holders[partition]) < copies:
            least = min((m for m in ranked[partition] if m not in holders[partition]),
                        key=load.__getitem__)  # ties: the first by rank
            holders[partition].append(least)
            load[least] += 1
    actives: dict[str, set[int]] = {m: set() for m in members}
    standbys: dict[str, set[int]] = {m: set() for m in members}
    for partition in dealt:
        def preference(member: str, p: int = partition) -> tuple[bool, bool, int, int]:
            lags = live.get(member, ())
            behind = (acceptable_lag is not None and isinstance(lags, Mapping)
                      and lags.get(p, 0) > acceptable_lag)
            return p not in lags, behind, len(actives[member]), ranked[p].index(member)

        first = min(holders[partition], key=preference)
        actives[first].add(partition)
        for member in holders[partition]:
            if member != first:
                standbys[member].add(partition)
    return {m: Hosting(frozenset(actives[m]), frozenset(standbys[m])) for m in members}


def owners(hosting: Mapping[str, Hosting]) -> dict[int, list[str]]:
    """Per partition, its active host then its standbys."""
    found: dict[int, list[str]] = {}
    for member, hosted in hosting.items():
        for partition in hosted.active:
            found.setdefault(partition, []).insert(0, member)
        for partition in hosted.standby:
            found.setdefault(partition, []).append(member)
    return found
