"""``eventfold status``: the whole pipeline on one screen, or as JSON, with an exit code."""

from __future__ import annotations

import argparse
import json

from eventfold.config import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser(
        "status", help="the whole pipeline on one screen; exit code says what is wrong",
        description="Postgres, Kafka, the outbox connector and its slot, each projection's "
                    "lag, last batch, dead letters and replay, and the read API instances. "
                    "Exit codes: 0 healthy; 3 a component does not answer (Postgres, Kafka, "
                    "Connect); 4 CDC not flowing (connector or task not RUNNING, slot "
                    "inactive or retaining too much WAL); 5 a projection is stale (events "
                    "wait, last batch older than --stale-after); 2 a configuration mistake.")
    status.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    status.add_argument("--stale-after", type=float, default=60, metavar="SECONDS",
                        help="a projection with events waiting whose last batch is older than "
                             "this is stale")
    status.add_argument("--wal-warning-bytes", type=int, default=1024**3,
                        help="the slot retaining more WAL than this is unhealthy")
    status.set_defaults(run=_status)


def _status(settings: Settings, args: argparse.Namespace) -> int:
    from rich.console import Console

    from eventfold.app import app_of
    from eventfold.status import pipeline_status, render

    status = pipeline_status(app_of(settings), settings.with_local_stack(),
                             args.stale_after, args.wal_warning_bytes)
    if args.json:
        print(json.dumps(status.as_json(), indent=2, default=str))
    else:
        render(status, Console())
    return status.exit_code
