"""``eventfold connector`` and ``verify-log``: the Debezium outbox connector operated, and a
topic checked against the event store."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings

if TYPE_CHECKING:
    from eventfold.outbox.operations import ConnectorStatus

log = logging.getLogger("eventfold")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    connector = commands.add_parser("connector", help="operate the Debezium outbox connector")
    connector.add_argument("action", choices=["apply", "diff", "validate", "status", "pause",
                                              "resume", "restart", "supervise", "delete"],
                           help="supervise: run until SIGTERM, restarting FAILED tasks")
    connector.add_argument("--all", action="store_true",
                           help="restart: every task, not only FAILED ones")
    connector.add_argument("--keep-slot", action="store_true",
                           help="delete: keep the replication slot (to re-apply later)")
    connector.add_argument("--wal-warning-bytes", type=int, default=1024**3,
                           help="status: warn when the slot retains more WAL than this")
    connector.set_defaults(run=_connector)

    verify = commands.add_parser(
        "verify-log", help="compare the event store with an aggregate type's topic")
    verify.add_argument("aggregate_type", help="e.g. Product: its events and its topic")
    verify.add_argument("--prefix", default="", help="only streams whose id starts so")
    verify.set_defaults(run=_verify_log)


def _connector(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    settings = settings.with_local_stack()
    operations = app_of(settings).runtime(settings).connector()
    name = operations.spec.name
    if args.action in ("apply", "diff"):
        from eventfold.outbox.operations import describe_diff

        difference = operations.diff()
        for line in describe_diff(difference):
            print(f"  {line}")
        if args.action == "diff":
            print(f"{name}: {len(difference)} difference(s)" if difference
                  else f"{name}: up to date")
            return 1 if difference else 0
        result = operations.apply()
        print(f"{name}: {result.action}")
    elif args.action == "validate":
        errors = operations.validate()
        for key, error in errors:
            print(f"  {key}: {error}")
        print(f"{name}: {len(errors)} error(s)" if errors else f"{name}: valid")
        return 1 if errors else 0
    elif args.action == "status":
        return _print_status(operations.status(wal_warning_bytes=args.wal_warning_bytes))
    elif args.action == "pause":
        operations.pause()
        print(f"{name}: PAUSED")
    elif args.action == "resume":
        operations.resume()
        print(f"{name}: RUNNING")
    elif args.action == "restart":
        print(json.dumps(operations.restart(only_failed=not args.all), indent=2))
    elif args.action == "supervise":
        stop = threading.Event()
        from eventfold.projections.signals import stop_on_signal

        stop_on_signal(stop, "stopping")
        log.info("supervising connector %s: FAILED tasks are restarted", name)
        operations.supervise(stop)
    else:
        deleted = operations.delete(keep_slot=args.keep_slot)
        print(f"{name}: {'deleted' if deleted else 'not found'}"
              f"{'' if args.keep_slot else ', replication slot dropped'}")
    return 0


def _print_status(status: ConnectorStatus) -> int:
    starting = " (starting: check again shortly)" if status.starting else ""
    print(f"connector {status.name}: {status.connector_state}{starting}")
    for task in status.tasks:
        print(f"  task {task['id']}: {task['state']} on {task.get('worker_id', '?')}")
        if task.get("trace"):
            print("    " + task["trace"][:3000].replace("\n", "\n    "))
    if status.slot:
        print(f"  slot {status.slot.name}: {'active' if status.slot.active else 'inactive'}, "
              f"retains {status.slot.retained_wal_bytes:,} bytes of WAL "
              f"({status.slot.unconfirmed_wal_bytes:,} not yet confirmed)")
    else:
        print("  no replication slot")
    for warning in status.warnings:
        print(f"  WARNING: {warning}")
    return 0 if status.running and not status.warnings else 1


def _verify_log(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    app = app_of(settings)
    if args.aggregate_type not in app.aggregate_types:
        raise ConfigError(f"unknown aggregate type {args.aggregate_type!r} in {settings.app}; "
                          f"known: {', '.join(app.aggregate_types) or 'none'}")
    report = app.runtime(settings.with_local_stack()).verify_log(args.aggregate_type, args.prefix)
    print(report.summary())
    for stream_id, versions in list(report.missing.items())[:20]:
        print(f"  missing {stream_id}: versions {versions[:10]}")
    if report.missing_count > 0:
        print(f"  (the first aggregates by id; {report.missing_count} events missing in all)")
    for stream_id, versions in list(report.out_of_order.items())[:20]:
        print(f"  out of order {stream_id}: {versions[:10]}")
    return 0 if report.ok else 1
