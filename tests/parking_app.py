"""A reaction with a bug for the test of parked keys: a placed purchase reserves its stock
(``examples.fulfilment``'s ``reserve_stock``) and a paid one stocks a shelf named after it
(``<purchase>-paid``: what must not happen before its reservation); placing raises for the
purchases listed in the file ``EVENTFOLD_TEST_BROKEN_FILE`` names (the bug), and works once
they are taken out of it (the fix)."""

from __future__ import annotations

import os
from pathlib import Path

from eventfold import Event, Eventfold, reaction
from examples import fulfilment


def _broken() -> set[str]:
    path = Path(os.environ["EVENTFOLD_TEST_BROKEN_FILE"])
    return set(path.read_text().split()) if path.exists() else set()


@reaction("reserve_with_a_bug", sources=[fulfilment.Purchase],
          event_types=["PurchasePlaced", "PurchasePaid"])
def reserve_with_a_bug(event: Event) -> fulfilment.ReserveStock | fulfilment.StockShelf | None:
    if event.type == "PurchasePaid":
        return fulfilment.StockShelf(shelf_id=f"{event.stream_id}-paid", quantity=1)
    if event.stream_id in _broken():
        raise RuntimeError(f"a bug meets purchase {event.stream_id}")
    return fulfilment.reserve_stock.react(event)  # type: ignore[return-value]


app = Eventfold("parking")
app.commands = fulfilment.app.commands
app.reactions.add(reserve_with_a_bug)
