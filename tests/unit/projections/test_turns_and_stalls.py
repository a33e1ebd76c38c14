"""Fair turns between a host's projections, and the stream thread's stall bound: pure logic,
with the clock moved by hand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eventfold.projections.execution import jobs, turns, writes
from eventfold.projections.state.lease import WriterBusy, WriterFenced
from eventfold.projections.state.transactions import writer_slots, writer_transactional_id


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(turns.time, "monotonic", lambda: now[0])
    return now


def test_a_projection_alone_takes_its_largest_batches(clock: list[float]) -> None:
    shared = turns.Turns()
    shared.worked("catching_up", 500_000)
    assert shared.batch_rows("catching_up", 500_000, 20_000, 1_000) == 500_000


def test_a_batch_is_fair_while_another_live_projection_follows_closely(
        clock: list[float]) -> None:
    shared = turns.Turns()
    shared.worked("small", 12)
    assert shared.batch_rows("catching_up", 500_000, 20_000, 1_000) == 20_000
    assert shared.batch_rows("catching_up", 5_000, 20_000, 1_000) == 5_000
    assert shared.batch_rows("catching_up", 500_000, 0, 1_000) == 500_000, "0 turns it off"
    clock[0] += turns.WORK_SEEN_FOR_S + 0.01
    assert shared.batch_rows("catching_up", 500_000, 20_000, 1_000) == 500_000, (
        "work seen long ago no longer counts")


def test_projections_that_all_catch_up_keep_their_large_batches(clock: list[float]) -> None:
    shared = turns.Turns()
    for name in ("a", "b", "c"):
        shared.worked(name, 100_000)
    assert shared.batch_rows("a", 500_000, 20_000, 1_000) == 500_000


def test_transactional_ids_name_the_version_and_every_slot() -> None:
    assert writer_slots(2) == ["driver", "task-0", "task-1"]
    assert writer_transactional_id("eventfold.sales.v3", "task-1") == (
        "eventfold.sales.v3.task-1")


def test_lease_errors_name_the_holder_and_the_way_out() -> None:
    busy = str(WriterBusy("sales", "host-a:41:ab12", None))
    assert "host-a:41:ab12" in busy and "--standby" in busy
    fenced = str(WriterFenced("sales", "host-b:7:cd34", 5))
    assert "host-b:7:cd34 took it over (epoch 5)" in fenced
    assert "could not be renewed" in str(WriterFenced("sales", None, None))
    assert "a newer run of it in this process" in str(
        WriterFenced("sales", "host-b:7:cd34", 6, mine=True))


def test_a_look_or_batch_past_the_floor_plus_three_longest_batches_is_stalled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from eventfold.projections import stream_thread

    now = [500.0]
    monkeypatch.setattr(stream_thread.time, "monotonic", lambda: now[0])
    runner = SimpleNamespace(projection=SimpleNamespace(name="sales"))
    thread = stream_thread.StreamThread(runner, 0.1)  # type: ignore[arg-type]
    thread._step_started, thread._longest_batch_s = 500.0, 10.0
    now[0] = 500.0 + 60 + 3 * 10
    assert thread.stalled_for(60) is None, "within the bound"
    now[0] += 1
    assert thread.stalled_for(60) == pytest.approx(91)
    assert thread.job_group.startswith("eventfold-sales-")


def test_each_stall_without_a_batch_doubles_the_bound_until_a_batch_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A first batch slower than the setting (a cold Spark on a loaded machine) must not be
    cancelled at the same point on every start until the host gives up."""
    from types import SimpleNamespace

    from eventfold.projections import supervision

    never = SimpleNamespace(is_set=lambda: False, wait=lambda _s: False)
    a_host = SimpleNamespace(stop_requested=never, standby=False)
    supervisor = supervision.Supervisor(a_host, None, "sales", None)  # type: ignore[arg-type]
    stalled = supervision.RunOutcome
    outcomes = iter([stalled(0, "stalled", stalled=True)] * 6
                    + [stalled(2, "stalled", stalled=True),
                       stalled(0, "stalled", stalled=True), stalled(1)])
    floors: list[float] = []

    def run_once(_lease: object, _ready: object = None) -> supervision.RunOutcome:
        floors.append(supervisor.stall_floor_s(5))
        return next(outcomes)

    monkeypatch.setattr(supervisor, "_lease", lambda: object())
    monkeypatch.setattr(supervisor, "_run_until_it_ends", run_once)
    supervisor.run()
    assert floors == [5, 10, 20, 40, 80, 80, 80, 5, 10]


def test_a_replay_leaves_a_core_and_rests_while_a_live_projection_follows(
        clock: list[float]) -> None:
    shared = turns.Turns()
    assert shared.replay_turn(2, 2.0, 1_000) == (2, 0.0), "nothing live: every core, no rest"
    shared.worked("live", 3)
    assert shared.replay_turn(2, 2.0, 1_000) == (1, 2.0)
    assert shared.replay_turn(1, 2.0, 1_000) == (1, 2.0), "never below one core"
    assert shared.replay_turn(2, 0.0, 1_000) == (1, 0.0), "0 never rests"
    clock[0] += turns.WORK_SEEN_FOR_S + 1
    assert shared.replay_turn(2, 2.0, 1_000) == (1, 2.0), "live work a while ago goes on"
    clock[0] += turns.REPLAY_YIELDS_FOR_S
    assert shared.replay_turn(2, 2.0, 1_000) == (2, 0.0), "but not after a minute"
    shared.worked("live", 3)
    shared.worked("live", 50_000)
    assert shared.replay_turn(8, 2.0, 1_000) == (8, 0.0), (
        "a live projection catching up is no reason")


class TimedSlice:
    """A source slice whose chunks take their time to read, on the clock of ``writes``."""

    def __init__(self, now: list[float], seconds: list[float]) -> None:
        self.now, self.seconds = now, seconds

    def record_chunks(self, rows: int) -> Iterator[int]:
        for n, took in enumerate(self.seconds):
            self.now[0] += took
            yield n


def test_a_task_rests_between_its_chunks_in_proportion_to_its_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now, rests = [0.0], []

    def sleep(seconds: float) -> None:
        rests.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(writes.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(writes.time, "sleep", sleep)
    clock = writes.TaskClock(rest_ratio=2.0)
    for source_slice in (TimedSlice(now, [0.5, 0.25]), TimedSlice(now, [0.5])):
        for _ in jobs.record_chunks(source_slice, clock):  # type: ignore[arg-type]
            now[0] += 0.25  # the task's work on the chunk
    assert rests == [2 * (0.5 + 0.25 + 0.25), 2 * (0.25 + 0.5)], (
        "between every two chunks of the task, its slices' too; none after the last")
    assert clock.total()["rest"] == sum(rests)
    unhurried = writes.TaskClock()
    assert list(jobs.record_chunks(TimedSlice(now, [1.0, 1.0]), unhurried)) == [0, 1]  # type: ignore[arg-type]
    assert len(rests) == 2, "a batch that asks for no rest gets none"
