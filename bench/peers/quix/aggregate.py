"""bench/projections.py's fold in Quix Streams: the total of each key's sale values, a
stateful ``apply`` into its RocksDB store with its changelog. Runs in its own virtualenv
(``bench/peers/setup.sh``: Quix pins an older confluent-kafka than Eventfold). Reads the
bench's event topic from the beginning until it has folded ``events`` events, then prints one
JSON line: events/s from the first event to the last, and the keys, total and count of the
states it wrote (bench/peers/results.py checks them against what was produced).

    bench/peers/quix/.venv/bin/python bench/peers/quix/aggregate.py BOOTSTRAP TOPIC EVENTS STATE_DIR
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from quixstreams import Application, State


def main() -> None:
    bootstrap, topic_name, events, state_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        sys.argv[4]
    app = Application(broker_address=bootstrap, consumer_group=f"eventfold-peer-{uuid.uuid4()}",
                      auto_offset_reset="earliest", state_dir=state_dir,
                      processing_guarantee="at-least-once")
    topic = app.topic(topic_name, key_deserializer="str", value_deserializer="json")
    latest: dict[str, tuple[int, int]] = {}
    clock: list[float] = []
    seen = [0]

    def fold(envelope: dict[str, Any], key: str, _timestamp: int, _headers: Any,
             state: State) -> None:
        if not clock:
            clock.append(time.perf_counter())
        value = json.loads(envelope["payload"])["value"]
        total, count = state.get("totals", (0, 0))
        latest[key] = totals = (total + value, count + 1)
        state.set("totals", totals)
        seen[0] += 1
        if seen[0] == events:
            clock.append(time.perf_counter())
            app.stop()

    app.dataframe(topic).apply(fold, stateful=True, metadata=True)
    app.run()
    seconds = clock[-1] - clock[0]
    print(json.dumps({"events_per_s": round(events / seconds), "keys": len(latest),
                      "total": sum(t for t, _ in latest.values()),
                      "count": sum(c for _, c in latest.values())}))


if __name__ == "__main__":
    main()
