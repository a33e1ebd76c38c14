"""``projection run --all``: a host whose reactions thread dies stops, exit 1, rather than
fold on with its reactions gone unseen."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from eventfold.cli.projection import _run_projections


class _Host:
    def __init__(self) -> None:
        self.stop_requested = threading.Event()

    def run(self) -> None:
        assert self.stop_requested.wait(10), "the host was never asked to stop"


class _Runtime:
    def __init__(self, fails: bool) -> None:
        self.host, self.fails = _Host(), fails

    def projection_host(self, names: list[str], once: bool, standby: bool) -> _Host:
        return self.host

    def run_reactions(self, names: list[str], stopping: threading.Event) -> None:
        if self.fails:
            raise RuntimeError("a handler's bug")
        stopping.wait(10)


def _app(runtime: _Runtime) -> Any:
    return SimpleNamespace(reactions=[SimpleNamespace(name="notify")],
                           runtime=lambda settings: runtime)


def test_a_dead_reactions_thread_stops_the_host_with_exit_1(caplog) -> None:
    runtime = _Runtime(fails=True)
    assert _run_projections(_app(runtime), None, ["totals"], once=False,  # type: ignore[arg-type]
                            with_reactions=True) == 1
    assert "the reactions stopped on an error; stopping the host" in caplog.text


def test_a_host_stopped_on_purpose_exits_0() -> None:
    runtime = _Runtime(fails=False)
    threading.Timer(0.2, runtime.host.stop_requested.set).start()
    assert _run_projections(_app(runtime), None, ["totals"], once=False,  # type: ignore[arg-type]
                            with_reactions=True) == 0
