"""The command line explains itself: help for every subcommand, positional and option, and
``--version``."""

from __future__ import annotations

import argparse
from importlib.metadata import version

import pytest

from eventfold.cli import build_parser, main


def test_every_subcommand_and_argument_says_what_it_is_for() -> None:
    parser = build_parser()
    [subcommands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    described = {choice.dest: choice.help for choice in subcommands._choices_actions}
    for name, subparser in subcommands.choices.items():
        assert described.get(name), f"`eventfold {name}` has no help"
        for action in subparser._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"`eventfold {name}` {action.dest} has no help"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"eventfold {version('eventfold')}"


@pytest.mark.parametrize("argv", [
    ["dlq", "retry", "totals", "key-\udcff"],  # bytes that are not UTF-8, as Python gets them
    ["dlq", "discard", "totals", "3", "--reason", "bad \udc80 byte"],
    ["projection", "status", "\ud800"],
])
def test_an_argument_no_database_can_hold_is_refused_by_name(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "lone surrogate (not valid Unicode)" in error
    assert error.startswith("eventfold: argument ")


@pytest.mark.parametrize(("argv", "said"), [
    (["projection", "run"], "projection run needs a NAME (see `eventfold projection list`) or "
                            "--all"),
    (["projection", "run", "sales_totals", "--all"], "name projections or give --all, not both"),
    (["projection", "replay", "sales_totals", "sales_stats"],
     "projection replay rebuilds one projection at a time"),
    (["projection", "run", "sales_totals", "nope"], "unknown projection 'nope'"),
])
def test_projection_names_are_checked_before_spark_starts(
        argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EVENTFOLD_APP", "examples.sales:app")
    assert main(argv) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["projection", "replay", "reserve_stock"],
     "reserve_stock is a reaction, not a projection: `eventfold reaction run reserve_stock` "
     "runs it; a reaction never replays, `eventfold reaction reset reserve_stock "
     "--to-beginning` acts again"),
    (["reaction", "run", "nope"], "unknown reaction 'nope'; known: payment_deadline, "
                                  "reserve_stock"),
    (["reaction", "reset", "reserve_stock"],
     "reaction reset needs --to-beginning, --to-end or --to-time"),
    (["reaction", "reset", "reserve_stock", "--to-time", "yesterday"],
     "--to-time 'yesterday' is not an ISO time"),
])
def test_a_reaction_is_named_and_moved_only_as_a_reaction(
        argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EVENTFOLD_APP", "examples.fulfilment:app")
    assert main(argv) == 2
    assert said in capsys.readouterr().err
