"""The sales example's two projections (a fold with a KTable and notifications, and an
aggregation) beside a poison projection whose fold always raises and that parks nothing, all
under names ending in ``EVENTFOLD_TEST_PROJECTION`` (tests share the stack): for the test of a
projection host running an app's projections in one Spark application. With
``EVENTFOLD_TEST_COUNTED`` (an aggregate type of the test's own), a fourth counts its events per
stream, over a topic the test may delete under the host."""

from __future__ import annotations

import dataclasses
import os

from sqlalchemy import BigInteger, Text

from eventfold import Eventfold
from eventfold.projections import Event, State, projection
from examples import sales

SUFFIX = os.environ["EVENTFOLD_TEST_PROJECTION"]
COUNTED = os.environ.get("EVENTFOLD_TEST_COUNTED")


@projection(f"poison_{SUFFIX}", sources=["ProductSales"], columns={"total": BigInteger()},
            park_on_failure=False)
def poison(state: State | None, event: Event) -> State | None:
    raise ValueError("this fold always fails")


app = Eventfold("host")
app.commands = sales.app.commands
for definition in (sales.sales_totals, sales.sales_stats):
    app.projections.add(dataclasses.replace(definition, name=f"{definition.name}_{SUFFIX}",
                                            table="", ktable_topic=""))
app.projections.add(poison)
if COUNTED:
    @projection(f"counted_{SUFFIX}", sources=[COUNTED],
                columns={"count": BigInteger(), "note": Text()})
    def counted(state: State | None, event: Event) -> State | None:
        return {"count": (state or {"count": 0})["count"] + 1, "note": event.data["note"]}

    app.projections.add(counted)
