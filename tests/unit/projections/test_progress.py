"""Long work shows progress: a live bar on a terminal, else a log line every few seconds and
one at the end (never one per batch)."""

from __future__ import annotations

import logging

import pytest

from eventfold.projections.outcome import FoldOutcome
from eventfold.projections.replay import ReplayProgress


def test_without_a_terminal_it_logs_every_few_seconds_and_at_the_end(
        caplog: pytest.LogCaptureFixture) -> None:
    progress = ReplayProgress("totals", 1000, terminal=False, log_every_s=60)
    with caplog.at_level(logging.INFO, logger="eventfold.projections.replay"):
        for batch in range(10):
            progress.add(batch, 100, FoldOutcome(), {})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # the first batch, then the last one
    assert lines[0].startswith("replay totals:  10%, 100 of 1,000 events")
    assert lines[1].startswith("replay totals: 100%, 1,000 of 1,000 events")
    assert "events/s, ETA" in lines[1]


def test_on_a_terminal_it_draws_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    progress = ReplayProgress("totals", 1000, what="catching up", terminal=True)
    progress.add(0, 400, FoldOutcome(), {})
    progress.add(1, 600, FoldOutcome(), {})
    progress.close()
    progress.close()  # the runner and the replay both close it
    drawn = capsys.readouterr().err
    assert "catching up totals" in drawn and "1000/1000" in drawn and "events/s" in drawn
