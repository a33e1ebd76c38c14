"""The peers of bench/projections.py, run on its topic in the same run: Kafka Streams
(``kafka_streams/``, 1 and 2 stream threads) and Quix Streams (``quix/``, in its own
virtualenv), each folding every event's value into a total per key in its own RocksDB store
with its changelog. Build them once with ``bash bench/peers/setup.sh``; nothing downloads
while a bench runs.

Each peer prints one JSON line (events/s from its first event to its last, and the keys,
total and count it holds at the end), checked here against what the bench produced: a peer
that lost or doubled events fails the bench instead of giving a figure.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.keys import Distribution, distinct_keys

PEERS = Path(__file__).resolve().parent
KAFKA_STREAMS = PEERS / "kafka_streams" / "target"
QUIX_PYTHON = PEERS / "quix" / ".venv" / "bin" / "python"


class PeerResultWrong(AssertionError):
    """A peer's totals differ from the events produced."""


class PeerNotBuilt(RuntimeError):
    """``bench/peers/setup.sh`` has not run on this machine."""


@dataclass(frozen=True)
class Expected:
    """What folding the bench's events gives: event ``p`` (1, 2, ...) of the key
    ``bench.keys`` gives it, with value ``p % 97 + 1``."""

    keys: int
    total: int
    count: int

    @classmethod
    def of_bench(cls, events: int, keys: int,
                 distribution: Distribution = "uniform") -> Expected:
        return cls(distinct_keys(events, keys, distribution),
                   sum(p % 97 + 1 for p in range(1, events + 1)), events)


def checked(name: str, printed: str, expected: Expected) -> float:
    """The events/s of a peer's last printed line, once its keys, total and count are those
    expected."""
    lines = [line for line in printed.splitlines() if line.startswith("{")]
    if not lines:
        raise PeerResultWrong(f"{name} printed no result:\n{printed[-2000:]}")
    result = json.loads(lines[-1])
    found = Expected(int(result["keys"]), int(result["total"]), int(result["count"]))
    if found != expected:
        raise PeerResultWrong(f"{name}: {found}, expected {expected}")
    return float(result["events_per_s"])


def kafka_streams(bootstrap: str, topic: str, threads: int, events: int,
                  expected: Expected) -> float:
    if not (KAFKA_STREAMS / "classes").is_dir():
        raise PeerNotBuilt("the Kafka Streams peer is not built: bash bench/peers/setup.sh")
    classpath = f"{KAFKA_STREAMS / 'classes'}:{KAFKA_STREAMS / 'dependency'}/*"
    with tempfile.TemporaryDirectory(prefix="eventfold-peer-ks-") as state:
        return checked(f"Kafka Streams ({threads} threads)", _run(
            ["java", "-cp", classpath, "dev.eventfold.peers.Aggregate", bootstrap, topic,
             str(threads), str(events), state]), expected)


def quix(bootstrap: str, topic: str, events: int, expected: Expected) -> float:
    if not QUIX_PYTHON.exists():
        raise PeerNotBuilt("the Quix Streams peer is not installed: bash bench/peers/setup.sh")
    with tempfile.TemporaryDirectory(prefix="eventfold-peer-quix-") as state:
        return checked("Quix Streams", _run(
            [str(QUIX_PYTHON), str(PEERS / "quix" / "aggregate.py"), bootstrap, topic,
             str(events), state]), expected)


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise PeerResultWrong(f"{command[0]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout
