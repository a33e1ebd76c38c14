"""`projection run` starts a failed query again with growing pauses, and stops, with exit code
1 and the last failure said, after six failed starts in a row with no batch between them; a
start that made progress begins the count afresh. In a host of several projections, the one
that gives up stops alone."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from types import SimpleNamespace

import pytest

from eventfold import cli
from eventfold.cli import projection as projection_cli
from eventfold.projections import host as projection_host
from eventfold.projections.host import ProjectionHost
from eventfold.projections.host_wiring import MAX_FAILED_STARTS, HostWiring
from eventfold.projections.supervision import RunOutcome, Supervisor

BROKER_DOWN = RunOutcome(0, "KafkaException: broker down")
REFUSED = RunOutcome(0, "psycopg.OperationalError: connection refused")


class _Spark:
    """What a host asks of the Spark session before its projections' runners do."""

    def __init__(self) -> None:
        self.sparkContext = SimpleNamespace(setLocalProperty=lambda key, value: None)


def _wiring() -> HostWiring:
    """A host's wiring with nothing behind its runners (the tests replace their runs)."""
    return HostWiring(
        app_name="shop", projections=None, database_url="postgresql://127.0.0.1:1/none",
        kafka=None, writer_lease_s=10, spark_session=lambda name: _Spark(), runner=None,
        replay=None, observer=lambda names: None)  # type: ignore[arg-type]


@pytest.fixture
def host_of(monkeypatch):
    """Runs ``cli.main`` with a host whose runs end as ``outcomes[name]`` says, in order."""
    calls: dict[str, int] = defaultdict(int)
    pauses: dict[str, list[float]] = defaultdict(list)
    waits = threading.Event.wait
    wiring = _wiring()

    def run_with(outcomes: dict[str, list[RunOutcome]]) -> int:
        def run_until_it_ends(supervisor: Supervisor, lease: object,
                              ready: object = None) -> RunOutcome:
            calls[supervisor.name] += 1
            return outcomes[supervisor.name][calls[supervisor.name] - 1]

        def wait(self: threading.Event, timeout: float | None = None) -> bool:
            # Only the projections' pauses are skipped: the host's other threads (its
            # heartbeat) wait for real, or they would spin, and outlive the test
            thread = threading.current_thread().name
            if timeout is None or not thread.startswith("projection-"):
                return waits(self, timeout)
            pauses[thread].append(timeout)
            return False

        monkeypatch.setattr(Supervisor, "_run_until_it_ends", run_until_it_ends)
        monkeypatch.setattr(threading.Event, "wait", wait)
        monkeypatch.setattr(projection_host, "stop_on_signal", lambda requested: None)
        monkeypatch.setattr(projection_cli, "_projection",
                            lambda settings, args: ProjectionHost(wiring, args.names).run() or 0)
        return cli.main(["projection", "run", *outcomes])

    run_with.calls, run_with.pauses = calls, pauses  # type: ignore[attr-defined]
    # ``cli.main`` points the root logger at this test's captured stderr, closed after it
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield run_with
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_run_that_keeps_failing_stops_with_exit_code_1(host_of, capsys) -> None:
    code = host_of({"orders": [BROKER_DOWN] * 3 + [RunOutcome(2, BROKER_DOWN.error)]
                    + [REFUSED] * 10})
    assert code == 1
    # 3 failures; a run that made batches before it failed (the count starts again, at 1);
    # then 6 failed starts in a row without a batch, and no seventh
    assert host_of.calls["orders"] == 4 + MAX_FAILED_STARTS
    assert host_of.pauses["projection-orders"] == [2, 4, 8, 2, 4, 8, 16, 30, 30]
    error = capsys.readouterr().err
    assert "projection orders failed 6 times in a row without a batch, and stops" in error
    assert "connection refused" in error


def test_in_a_host_the_projection_that_gives_up_stops_alone(host_of, capsys) -> None:
    code = host_of({"orders": [REFUSED] * 10, "customers": [BROKER_DOWN, RunOutcome(7)]})
    assert code == 1
    assert host_of.calls == {"orders": 1 + MAX_FAILED_STARTS, "customers": 2}
    assert host_of.pauses["projection-customers"] == [2]
    error = capsys.readouterr().err
    assert error.splitlines()[-1].startswith("eventfold: 1 of 2 projections stopped: orders: "
                                             "projection orders failed 6 times in a row")


def test_a_stop_signal_during_a_pause_ends_the_run_cleanly(monkeypatch) -> None:
    monkeypatch.setattr(Supervisor, "_run_until_it_ends",
                        lambda self, lease, ready=None: BROKER_DOWN)
    monkeypatch.setattr(threading.Event, "wait", lambda self, timeout=None: True)
    host = ProjectionHost(_wiring(), ["orders"])
    Supervisor(host, _Spark(), "orders", None).run()  # type: ignore[arg-type]
    assert "orders" not in host.stopped_on
