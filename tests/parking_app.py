"""A reaction with a bug for the test of parked keys: it raises on the purchases listed in the
file ``EVENTFOLD_TEST_BROKEN_FILE`` names (the bug), and works once they are taken out of it
(the fix); otherwise it is ``examples.fulfilment``'s ``reserve_stock``."""

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
def reserve_with_a_bug(event: Event) -> fulfilment.ReserveStock | None:
    if event.stream_id in _broken():
        raise RuntimeError(f"a bug meets purchase {event.stream_id}")
    return fulfilment.reserve_stock.react(event)  # type: ignore[return-value]


app = Eventfold("parking")
app.commands = fulfilment.app.commands
app.reactions.add(reserve_with_a_bug)
