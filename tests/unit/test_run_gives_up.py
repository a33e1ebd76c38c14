"""`projection run` starts a failed query again with growing pauses, and stops, with exit code
1 and the last failure said, after six failed starts in a row with no batch between them; a
start that made progress begins the count afresh."""

from __future__ import annotations

import threading

from eventfold import cli


def test_a_run_that_keeps_failing_stops_with_exit_code_1(monkeypatch, capsys) -> None:
    outcomes = [cli._RunOutcome(0, "KafkaException: broker down")] * 3 + [
        cli._RunOutcome(2, "KafkaException: broker down")] + [
        cli._RunOutcome(0, "psycopg.OperationalError: connection refused")] * 10
    calls, pauses = [], []
    monkeypatch.setattr(cli, "_run_until_it_ends",
                        lambda *args: calls.append(args) or outcomes[len(calls) - 1])
    monkeypatch.setattr(threading.Event, "wait",
                        lambda self, timeout=None: pauses.append(timeout) or False)
    monkeypatch.setattr(cli, "_projection", lambda settings, args: cli._run_and_start_again(
        None, settings, "orders", False, None))
    code = cli.main(["projection", "run", "orders"])
    assert code == 1
    # 3 failures; a run that made batches before it failed (the count starts again, at 1);
    # then 6 failed starts in a row without a batch, and no seventh
    assert len(calls) == 4 + cli.MAX_FAILED_STARTS
    assert pauses == [2, 4, 8, 2, 4, 8, 16, 30, 30]
    error = capsys.readouterr().err
    assert "projection orders failed 6 times in a row without a batch, and stops" in error
    assert "connection refused" in error


def test_a_stop_signal_during_a_pause_ends_the_run_cleanly(monkeypatch) -> None:
    monkeypatch.setattr(cli, "_run_until_it_ends",
                        lambda *args: cli._RunOutcome(0, "KafkaException: broker down"))
    monkeypatch.setattr(threading.Event, "wait", lambda self, timeout=None: True)
    assert cli._run_and_start_again(None, None, "orders", False, None) == 0


