"""Random event logs and one projection of each kind, for the parity tests: the plain-Python
harness is the reference every other path (Arrow in a task, Spark) must equal.

A log holds what a real topic can: events of several streams in two partitions (a stream in
one), re-sent copies at later offsets, records that are not events, and payloads whose fields
are missing, nested, of another type or not text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from pyspark.sql import Column
from pyspark.sql import functions as F
from sqlalchemy import JSON, BigInteger, Boolean, Float, String

from eventfold.contract import EventEnvelope
from eventfold.projections import (
    Avg,
    Count,
    Derived,
    Event,
    Latest,
    Lookup,
    Max,
    Min,
    Projection,
    State,
    Sum,
    aggregation,
    on_crossing,
    projection,
    stream,
)
from eventfold.projections.definition.aggregates import AggregateFunction
from eventfold.projections.outcome import FoldOutcome, KeyState, SourceRecord

TOPIC = "eventfold.events.Till"
PARTITIONS = 2
STREAMS = ("s1", "s2", "s3", "s4", "s5")
LOOKUP_ROWS: dict[str, State] = {"north": {"region": "N"}, "7": {"region": "seven"},
                                 "true": {"region": "yes"}}

store_values = st.one_of(st.sampled_from(["north", "south", "", "ünï"]),
                         st.integers(-3, 7), st.booleans(), st.none(),
                         st.just({"nested": 1}))
amounts = st.one_of(st.integers(-100, 400), st.integers(-100, 400), st.integers(-100, 400),
                    st.none(), st.just("12"), st.booleans())


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        data["amount"] = draw(amounts)
    if draw(st.booleans()):
        data["price"] = draw(st.one_of(st.integers(-50, 50), st.none(), st.just("x")))
    if draw(st.booleans()):
        data["vip"] = draw(st.one_of(st.booleans(), st.none(), st.just("yes")))
    if draw(st.booleans()):
        data["city"] = draw(st.sampled_from(["north", "7", "nowhere", None]))
    where = draw(st.sampled_from(["nested", "nested", "nested", "flat", "none",
                                  "not an object"]))
    if where == "nested":
        data["where"] = {"store": draw(store_values)}
    elif where == "flat":
        data["where.store"] = draw(store_values)  # a dotted name is not a path
    elif where == "not an object":
        data["where"] = draw(store_values)
    return data


@dataclass(frozen=True)
class Step:
    """One record to append: a new event, a copy of an earlier one, or a broken record."""

    what: str  # event, copy, broken
    stream: str = ""
    event_type: str = ""
    data: Any = None
    copy_of: int = 0
    broken: bytes | str = b""


new_events = st.builds(Step, what=st.just("event"), stream=st.sampled_from(STREAMS),
                       event_type=st.sampled_from(["Sold"] * 6 + ["Closed", "Ignored"]),
                       data=payloads())
steps = st.one_of(
    new_events, new_events, new_events, new_events, new_events,
    st.builds(Step, what=st.just("copy"), copy_of=st.integers(0, 50)),
    st.builds(Step, what=st.just("broken"),
              broken=st.sampled_from([b"{not json", b"\xff\xfe", "null", '{"eventId": 1}'])),
)
logs = st.lists(steps, min_size=1, max_size=40)
long_logs = st.lists(steps, min_size=30, max_size=80)
"""For Spark, where an example costs a few jobs whatever its size: each one long."""


def records_of(plan: list[Step], topic: str = TOPIC) -> list[SourceRecord]:
    """The steps as records of ``topic``, each partition's offsets counting from 0."""
    versions: dict[str, int] = {}
    offsets = [0] * PARTITIONS
    events: list[tuple[str, str]] = []
    records: list[SourceRecord] = []
    for position, step in enumerate(plan, start=1):
        if step.what == "event":
            version = versions[step.stream] = versions.get(step.stream, 0) + 1
            key, value = EventEnvelope(
                event_id=f"{step.stream}-{version}", event_type=step.event_type,
                stream_id=step.stream, stream_version=version, global_position=position,
                recorded_at="2026-11-24T00:00:00Z", data=step.data).encode()
            events.append((key, value))
        elif step.what == "copy" and events:
            key, value = events[step.copy_of % len(events)]
        else:
            # Bytes that are not UTF-8 stay bytes, as a reader hands them over.
            key, value = STREAMS[position % len(STREAMS)], step.broken  # type: ignore[assignment]
        partition = STREAMS.index(key) % PARTITIONS if key in STREAMS else 0
        records.append(SourceRecord(topic, partition, offsets[partition], key, value))
        offsets[partition] += 1
    return sorted(records, key=lambda r: (r.partition, r.offset))


def _amount(event: Event) -> int:
    amount = event.data.get("amount")
    return amount if type(amount) is int else 0


def _till_total(state: State | None, event: Event) -> State | None:
    if event.type == "Closed":
        return None
    current = state or {"total": 0, "sales": 0}
    return {"total": current["total"] + _amount(event), "sales": current["sales"] + 1}


def _region_totals(state: State | None, event: Event) -> State | None:
    if event.type == "Closed":
        return None
    current = state or {"total": 0, "region": None, "joined": []}
    region = event.joined["region"] if event.joined else current["region"]
    return {"total": current["total"] + _amount(event), "region": region,
            "joined": [*current["joined"], event.joined is not None][-3:]}


def big_sales(topic: str) -> Callable[[Event], Iterator[Derived]]:
    """A stream projection's step: every sale over 50 as a ``BigSale`` on ``topic``."""

    def big_sale(event: Event) -> Iterator[Derived]:
        if event.type == "Sold" and _amount(event) > 50:
            yield Derived(topic, event.stream_id, "BigSale",
                          {"amount": _amount(event), "from": event.event_id})

    return big_sale


class AnyTrue(AggregateFunction):
    """A user's own aggregate function: whether any event's field was true (null before any
    boolean)."""

    arrow_partial = "any"
    arrow_merge = "any"

    def step(self, current: Any, value: Any) -> Any:
        if value is None:
            return current
        return value if current is None else current or value

    def spark(self, value: Column, position: Column) -> Column:
        return F.bool_or(value)


def kinds(suffix: str = "", source: str = "Till") -> dict[str, Projection]:
    """One projection of each kind over ``source``'s topic, named (and emitting to topics
    named) with ``suffix`` to be unique."""
    aggregates = {"total": Sum("amount"), "events": Count(), "low": Min("amount"),
                  "high": Max("amount"), "city": Latest("city"),
                  "with_amount": Count("amount"), "mean_price": Avg("price"),
                  "any_vip": AnyTrue("vip")}
    aggregate_columns = {"total": BigInteger(), "events": BigInteger(), "low": BigInteger(),
                         "high": BigInteger(), "city": String(), "with_amount": BigInteger(),
                         "mean_price": Float(), "any_vip": Boolean()}
    return {
        "fold": projection(
            f"till_totals{suffix}", sources=[source], event_types=["Sold", "Closed"],
            columns={"total": BigInteger(), "sales": BigInteger()},
            derive=on_crossing(lambda s: s["total"] >= 100, lambda e, s: Derived(
                f"eventfold.events.TillCrossed{suffix}", e.stream_id, "TillCrossed", dict(s))),
        )(_till_total),
        "rekeyed_fold_with_lookup": projection(
            f"region_totals{suffix}", sources=[source], key_by="where.store",
            lookup=Lookup(f"regions{suffix}", on="city"),
            columns={"total": BigInteger(), "region": String(), "joined": JSON()},
        )(_region_totals),
        "aggregation": aggregation(
            f"till_stats{suffix}", sources=[source], event_types=["Sold"],
            aggregates=aggregates, columns=aggregate_columns),
        "rekeyed_aggregation": aggregation(
            f"store_stats{suffix}", sources=[source], key_by="where.store",
            aggregates=aggregates, columns=aggregate_columns),
        "stream": stream(f"big_sales{suffix}", sources=[source])(
            big_sales(f"eventfold.events.BigSale{suffix}")),
    }


def comparable(outcome: FoldOutcome) -> dict[str, Any]:
    """What must be equal across paths: states, emissions, dead letters and watermarks."""
    return {
        "changed": {key: _state(ks) for key, ks in outcome.changed.items()},
        "emissions": sorted((e.topic, e.key, json.dumps(json.loads(e.value), sort_keys=True))
                            for e in outcome.emissions),
        "dead_letters": sorted((d.record.partition, d.record.offset, d.reason)
                               for d in outcome.dead_letters),
        "watermarks": dict(outcome.watermarks),
        "applied": outcome.applied,
    }


def _state(ks: KeyState) -> tuple[Any, int, int]:
    state = None if ks.state is None else json.loads(json.dumps(ks.state, default=str))
    return state, ks.version, ks.position
