"""The inventory example's commands, and a projection (named by ``EVENTFOLD_TEST_PROJECTION``)
whose fold fails on a delivery of 13 units: for tests that follow a poison event from the
command that wrote it to the dead letter it becomes, in CLI processes. With
``EVENTFOLD_TEST_FOLD_FIXED=1`` the fold is the fixed one (13 units are 13 units), as a
deployment after the bug fix would run it. ``EVENTFOLD_TEST_KTABLE_PARTITIONS`` gives its
KTable that many partitions. ``EVENTFOLD_TEST_UNLUCKY_PREFIX`` limits the
projection to products whose id starts with it, so that a test's projection, which reads the
shared topic from its start, folds no other test's products (13 units, or data made hostile
on purpose: a batch logs at most ``NOTED_LETTERS`` letters per task)."""

from __future__ import annotations

import os

from sqlalchemy import BigInteger

from eventfold import Eventfold
from eventfold.projections import Event, State, projection
from examples import inventory


def _unlucky(state: State | None, event: Event) -> State | None:
    if not event.stream_id.startswith(os.environ.get("EVENTFOLD_TEST_UNLUCKY_PREFIX", "")):
        return state  # another test's product (its data may be hostile on purpose): left out
    unlucky = int(event.data["quantity"]) == 13
    if unlucky and os.environ.get("EVENTFOLD_TEST_FOLD_FIXED") != "1":
        raise ValueError("13 units: unlucky")
    return {"quantity": (state or {"quantity": 0})["quantity"] + int(event.data["quantity"])}


app = Eventfold("poisoned")
app.commands = inventory.app.commands
app.projections.add(projection(os.environ["EVENTFOLD_TEST_PROJECTION"], sources=["Product"],
                               columns={"quantity": BigInteger()},
                               event_types=["StockReceived"],
                               ktable_partitions=int(os.environ.get(
                                   "EVENTFOLD_TEST_KTABLE_PARTITIONS", "0")) or None)(_unlucky))
