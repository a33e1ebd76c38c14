"""``eventfold reaction``: run reactions, see where they are and what was refused, move one
on purpose."""

from __future__ import annotations

import argparse
import json
import threading
from datetime import datetime
from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings

if TYPE_CHECKING:
    from eventfold.app import Eventfold
    from eventfold.reactions.operations import ResetTo


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    react = commands.add_parser(
        "reaction", help="run reactions; status, refusals, processes; reset one to a position")
    react.add_argument("action",
                       choices=["list", "run", "status", "refusals", "processes", "reset"],
                       help="run: until SIGTERM; status: lag and refusals; refusals: what "
                            "the domain refused (newest first); processes: a process "
                            "manager's running keys, their state and timers; reset: move one "
                            "to the "
                            "beginning, the end or a time, saying how many events it will "
                            "act on again")
    react.add_argument("names", nargs="*", help="the reactions (run: default all of them)")
    where = react.add_mutually_exclusive_group()
    where.add_argument("--to-beginning", action="store_true", help="reset: to the first event")
    where.add_argument("--to-end", action="store_true", help="reset: past the last event")
    where.add_argument("--to-time", metavar="ISO",
                       help="reset: to each partition's first event at or after this time")
    react.add_argument("--dry-run", action="store_true",
                       help="reset: say how many events it would act on again, move nothing")
    react.add_argument("--force", action="store_true",
                       help="reset: even to events older than the command log keeps command "
                            "ids (their commands execute again)")
    react.add_argument("--last", type=int, default=20, metavar="N",
                       help="refusals: the newest N; processes: the first N keys")
    react.add_argument("--key-prefix", default="", metavar="PREFIX",
                       help="processes: only the keys starting with PREFIX")
    react.add_argument("--json", action="store_true", help="status, refusals, processes: JSON")
    react.set_defaults(run=_reaction)


def _reaction(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    app = app_of(settings)
    if args.action == "list":
        from eventfold.reactions.definition import topics_of

        for reaction in app.reactions:
            print(f"{reaction.name}\treads: {', '.join(topics_of(reaction))}\t"
                  f"starts at the {'end' if reaction.start == 'latest' else 'beginning'}")
        return 0
    names = args.names or [r.name for r in app.reactions]
    try:
        for name in names:
            app.reactions.get(name)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None
    to = _reset_target(names, args) if args.action == "reset" else None
    settings = settings.with_local_stack()
    if args.action == "run":
        return _run(app, settings, names)
    if args.action == "status":
        return _status(app, settings, names, args.json)
    if args.action == "refusals":
        return print_refusals(settings, names, args.last, args.json)
    if args.action == "processes":
        return _processes(app, settings, names, args)
    assert to is not None
    return _reset(app, settings, names[0], to, args)


def _processes(app: Eventfold, settings: Settings, names: list[str],
               args: argparse.Namespace) -> int:
    import psycopg

    from eventfold.contract import libpq_url
    from eventfold.reactions.process import Process, running_processes

    managers = [name for name in names if isinstance(app.reactions.get(name), Process)]
    if not managers:
        raise ConfigError(f"no process manager among {', '.join(names)}")
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        found = {name: running_processes(conn, name, args.last, args.key_prefix)
                 for name in managers}
    if args.json:
        print(json.dumps({name: [vars(p) for p in rows] for name, rows in found.items()}))
        return 0
    for name, rows in found.items():
        for p in rows:
            timers = ", ".join(f"{timer} at {at}" for timer, at in p.timers) or "no timers"
            print(f"{name}\t{p.key}\t{json.dumps(p.state)}\t{timers}\t"
                  f"updated {p.updated_at}")
    return 0


def _run(app: Eventfold, settings: Settings, names: list[str]) -> int:
    from eventfold.projections.signals import stop_on_signal

    stopping = threading.Event()
    stop_on_signal(stopping, "stopping after the current batch")
    app.runtime(settings).run_reactions(names, stopping)
    return 0


def _status(app: Eventfold, settings: Settings, names: list[str], as_json: bool) -> int:
    from eventfold.reactions.operations import report

    reports = [report(settings.kafka, settings.database_url, app.reactions.get(name))
               for name in names]
    if as_json:
        print(json.dumps([{"name": r.name, "started": r.started, "lag": r.lag,
                           "refused": r.refused, "parked": r.parked,
                           **({"running": r.processes[0], "timers": r.processes[1]}
                              if r.processes else {})} for r in reports]))
        return 0
    for r in reports:
        where = f"{r.lag} events behind" if r.started else "never ran"
        running = (f"\t{r.processes[0]} running, {r.processes[1]} timers pending"
                   if r.processes else "")
        print(f"{r.name}\t{where}\t{r.refused} refused\t{r.parked} keys parked{running}")
    return 0


def print_refusals(settings: Settings, names: list[str], last: int, as_json: bool) -> int:
    """The newest ``last`` refusals of each reaction (``reaction refusals``, ``dlq list``)."""
    import psycopg

    from eventfold.contract import libpq_url
    from eventfold.reactions.positions import refusals_of

    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        found = {name: refusals_of(conn, name, last) for name in names}
    if as_json:
        print(json.dumps({name: [vars(r) for r in rows] for name, rows in found.items()}))
        return 0
    for name, rows in found.items():
        for r in rows:
            print(f"{name}\t{r.recorded_at}\t{r.kind}\t{r.command or '-'}\t{r.event_type} "
                  f"{r.event_id} ({r.stream_id})\t{r.reason}")
    return 0


def _reset_target(names: list[str], args: argparse.Namespace) -> ResetTo:
    """Where ``reaction reset`` moves to, checked before anything connects."""
    if len(names) != 1:
        raise ConfigError("reaction reset takes exactly one reaction")
    if args.to_beginning:
        return "beginning"
    if args.to_end:
        return "end"
    if args.to_time:
        try:
            return datetime.fromisoformat(args.to_time)
        except ValueError:
            raise ConfigError(f"--to-time {args.to_time!r} is not an ISO time") from None
    raise ConfigError("reaction reset needs --to-beginning, --to-end or --to-time")


def _reset(app: Eventfold, settings: Settings, name: str, to: ResetTo,
           args: argparse.Namespace) -> int:
    from eventfold.contract import interval_seconds
    from eventfold.reactions.operations import BeyondCommandRetention, ReactionRunning, reset

    try:
        again = reset(settings.kafka, settings.database_url, app.reactions.get(name), to,
                      interval_seconds(settings.command_id_retention), args.dry_run,
                      args.force)
    except (ReactionRunning, BeyondCommandRetention) as exc:
        raise ConfigError(str(exc)) from None
    verb = "would" if args.dry_run else "will"
    if again >= 0:
        print(f"reaction {name} {verb} act again on {again} events")
    else:
        print(f"reaction {name} {verb} skip {-again} events")
    return 0
