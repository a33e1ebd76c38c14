"""``eventfold status``: the whole pipeline on one screen, or as JSON, with an exit code;
``eventfold members``: every process alive now, as the membership table has it."""

from __future__ import annotations

import argparse
import json

from eventfold.config import Settings
from eventfold.contract.members import KTABLE_MEMBER, KTABLE_READER, PROJECTION_HOST

MEMBER_KINDS = (PROJECTION_HOST, KTABLE_MEMBER, KTABLE_READER)


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

    members = commands.add_parser(
        "members", help="every process alive now: projection hosts, read API instances",
        description="The live rows of the membership table (docs/architecture.md, "
                    "\"Membership\"): each member's kind, id, start, last renewal, how long "
                    "it lives unrenewed, and what it reports.")
    members.add_argument("--kind", choices=MEMBER_KINDS, action="append",
                         help="only members of this kind (repeatable)")
    members.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    members.set_defaults(run=_members)


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


def _members(settings: Settings, args: argparse.Namespace) -> int:
    import psycopg
    from rich.console import Console
    from rich.table import Table

    from eventfold.contract import libpq_url
    from eventfold.contract.members import live

    with psycopg.connect(libpq_url(settings.with_local_stack().database_url),
                         connect_timeout=10) as conn:
        found = {kind: live(conn, kind) for kind in args.kind or MEMBER_KINDS}
    if args.json:
        print(json.dumps({kind: [{"id": m.member_id, "started_at": m.started_at,
                                  "seen_at": m.seen_at, "ttl_s": m.ttl_s, "detail": m.detail}
                                 for m in members] for kind, members in found.items()},
                         indent=2, default=str))
        return 0
    table = Table("kind", "id", "started", "renewed", "lives unrenewed", "reports")
    for kind, members in found.items():
        for m in members:
            table.add_row(kind, m.member_id, f"{m.started_at:%H:%M:%S}",
                          f"{m.seen_at:%H:%M:%S.%f}"[:-3], f"{m.ttl_s:g} s",
                          json.dumps(m.detail, separators=(",", ":"))[:80])
    Console().print(table if table.rows else "no live members")
    return 0
