"""The ``eventfold`` command line."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings
from eventfold.logs import configure_logging

if TYPE_CHECKING:

    from eventfold.app import Eventfold
    from eventfold.outbox.operations import ConnectorStatus
    from eventfold.projections.definition.projection import Projection
    from eventfold.projections.replay import ReplaySource
    from eventfold.projections.state.parking import Resolution
    from eventfold.run_observer import RunObserver

log = logging.getLogger("eventfold")


def _user() -> str:
    """Who runs this command, for the records of what was done with dead letters."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's arbitrary uid)
        return "unknown"


def _stack(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.local_stack.stack import CLUSTER

    if args.action == "install":
        return _install_stack()
    stack = settings.local_stack()
    if args.action in ("up", "restart"):
        if args.action == "restart" and not args.component:
            raise ConfigError("stack restart needs a COMPONENT: postgres, broker or connect")
        endpoints = (stack.restart(args.component) if args.action == "restart"
                     else stack.up(CLUSTER if args.cluster else None,
                                   spark_cluster=args.cluster))
        print(f"stack running in {stack.data_dir}")
        if stack.auth.sasl:
            print(f"broker: {stack.auth.protocol}, {stack.auth.mechanism} user "
                  f"{stack.auth.username} (from EVENTFOLD_KAFKA_CONFIG)")
        if endpoints.kafka_ca_location:
            print(f"clients trust the stack's CA: {endpoints.kafka_ca_location} "
                  "(ssl.ca.location; eventfold's clients of this stack use it by themselves)")
        for name, value in endpoints.as_env().items():
            print(f"export {name}={value}")
        if spark := stack.spark.state():
            print(f"export EVENTFOLD_SPARK_MASTER={spark.master_url}")
    elif args.action == "down":
        print("stack stopped (data kept; `eventfold stack reset` deletes it)" if stack.down()
              else f"no stack running in {stack.data_dir}; nothing to stop")
    elif args.action == "reset":
        stack.reset()
        print(f"stack stopped and its data deleted ({stack.data_dir})")
    else:
        status = stack.status()
        print(json.dumps(status, indent=2))
        if "components" not in status:
            print(f"no stack running in {stack.data_dir} (set EVENTFOLD_STACK_DIR, or run from "
                  "the project directory or below it)", file=sys.stderr)
    return 0


def _install_stack() -> int:
    """Fetch the stack's jars once and check the system packages it runs on."""
    from eventfold.local_stack.java import install_jars, jars_dir, java_binary
    from eventfold.local_stack.postgres import find_bin_dir

    filled = install_jars()
    print(f"jars: {'fetched into ' + ', '.join(map(str, filled)) if filled else 'present'} "
          f"({jars_dir()})")
    print(f"java: {java_binary()}")
    print(f"postgres: {find_bin_dir()}")
    return 0


def _init(_: Settings, args: argparse.Namespace) -> int:
    from eventfold.scaffold import Scaffold

    try:
        written = Scaffold(args.name).write(Path.cwd())
    except (ValueError, FileExistsError) as exc:
        raise ConfigError(str(exc)) from None
    print(f"wrote {', '.join(path.name for path in written)}. Next:")
    for step in ("eventfold stack up", "eventfold setup", "eventfold serve commands &",
                 "curl -X POST localhost:8000/commands/Deposit -H 'content-type: "
                 "application/json' -d '{\"account\": \"alice\", \"amount\": 100}'",
                 "eventfold projection run balances --once", "eventfold serve reads &",
                 "curl localhost:8001/read-models/balances/rows/alice"):
        print(f"  {step}")
    return 0


def _setup(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    app_of(settings).setup(settings.with_local_stack(), fix_topics=args.fix_topics)
    print("database migrated, event topics created, connector RUNNING")
    return 0


def _migrate(settings: Settings, _: argparse.Namespace) -> int:
    from eventfold import migrations

    migrations.upgrade(settings.with_local_stack().database_url)
    print("database at head")
    return 0


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of
    from eventfold.local_stack.process import port_is_open
    from eventfold.serving import serve_forever

    settings = settings.with_local_stack()
    app_of(settings)  # fail here, with a clear message, not in a worker
    if args.api == "commands":
        factory, port, variable = ("eventfold.asgi:command_api", settings.command_api_port,
                                   "EVENTFOLD_COMMAND_API_PORT")
    else:
        factory, port, variable = ("eventfold.asgi:read_api", settings.read_api_port,
                                   "EVENTFOLD_READ_API_PORT")
    host = settings.http_host
    # The workers bind with SO_REUSEPORT, which would share a port another server holds.
    if port_is_open(port, "127.0.0.1" if host in ("0.0.0.0", "") else host):
        raise ConfigError(f"port {port} on {host} is already in use; stop what listens there "
                          f"or choose another port with {variable}")
    listening = f"serving the {args.api} API on http://{host}:{port} (OpenAPI docs at /docs)"
    if settings.log_format == "json":
        log.info(listening)  # every line of the process's output is then JSON
    else:
        print(listening, flush=True)
    serve_forever(factory, host, port, workers=settings.http_workers)
    return 0


def _projection(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    app = app_of(settings)
    if args.action == "list":
        return _list_projections(app, settings)
    names = _chosen_projections(app, args)
    if args.action == "status":
        return _projection_status(app, settings.with_local_stack(), names, args.stale_after)
    settings = settings.with_local_stack()
    if args.action == "replay":
        [name] = names
        return _replay(app, settings, name, args.source)
    return _run_projections(app, settings, names, args.once, args.standby)


def _chosen_projections(app: Eventfold, args: argparse.Namespace) -> list[str]:
    """The projections named (all of them for ``--all``, and for ``status`` without names),
    checked before Spark starts, which takes a while."""
    if args.all and args.names:
        raise ConfigError("name projections or give --all, not both")
    if args.all or (args.action == "status" and not args.names):
        return [projection.name for projection in app.projections]
    if not args.names:
        raise ConfigError(f"projection {args.action} needs a NAME (see `eventfold projection "
                          "list`)" + (" or --all" if args.action == "run" else ""))
    if args.action == "replay" and len(args.names) > 1:
        raise ConfigError("projection replay rebuilds one projection at a time")
    try:
        return [app.projections.get(name).name for name in args.names]
    except LookupError as exc:
        raise ConfigError(str(exc)) from None


def _projection_status(app: Eventfold, settings: Settings, names: list[str],
                       stale_after: float) -> int:
    from eventfold.projections.status import projection_status
    from eventfold.status import STALE, projection_entry

    stale = False
    for name in names:
        found = projection_status(app.projections.get(name), settings.database_url,
                                  settings.kafka)
        print(found.describe())
        if reason := projection_entry(found, None, stale_after)["stale"]:
            print(f"  STALE: {reason}")
            stale = True
    return STALE if stale else 0


def _replay(app: Eventfold, settings: Settings, name: str, source: ReplaySource) -> int:
    """On the host that streams the projection, if one does (no second Spark application);
    else in this process."""
    from eventfold.projection_host import replay_on_a_host

    result = replay_on_a_host(settings, name, source)
    if result is None:
        observer = _observer(app, settings, name, with_lag=False)
        if observer is not None:
            observer.projections[name].replaying()
        try:
            result = app.replay(settings, name, source)
        finally:
            if observer is not None:
                observer.close()
    print(f"replayed {result.projection}: v{result.new_version} active, "
          f"{result.events:,} events in {result.seconds:.1f} s "
          f"({result.events_per_s:,.0f} events/s); v{result.old_version} dropped")
    return 0


def _list_projections(app: Eventfold, settings: Settings) -> int:
    """Each projection with its sources and outputs; the active versions' outputs when the
    database answers, else version 1's names."""
    import psycopg

    from eventfold.projections.state.catalog import ProjectionCatalog
    from eventfold.projections.status import projection_outputs

    versions: ProjectionCatalog | None = None
    try:
        versions = ProjectionCatalog(settings.with_local_stack().database_url)
        versions.outputs("")  # reachable?
    except (ConfigError, psycopg.Error) as exc:
        print(f"(database not reachable, showing version 1: {str(exc).splitlines()[0]})",
              file=sys.stderr)
        versions = None
    for projection in app.projections:
        version, derived = versions.outputs(projection.name) if versions else (1, [])
        outputs = projection_outputs(projection, version, derived)
        keyed = f"\tkey_by={projection.key_by}" if projection.key_by else ""
        shown = "".join(f"\t{what}={','.join(v) if isinstance(v, list) else v}"
                        for what, v in outputs.items() if v)
        print(f"{projection.name}\tv{version}\t{projection.kind}\t"
              f"sources={','.join(projection.source_topics)}{keyed}{shown}")
    if versions is not None:
        versions.close()
    return 0


def _run_projections(app: Eventfold, settings: Settings, names: list[str],
                     once: bool, standby: bool = False) -> int:
    from eventfold.projection_host import ProjectionHost

    ProjectionHost(app, settings, names, once, standby).run()
    return 0


def _observer(app: Eventfold, settings: Settings, name: str,
              with_lag: bool = True) -> RunObserver | None:
    if not settings.metrics or not settings.metrics_port:
        return None
    from eventfold.run_observer import RunObserver

    return RunObserver(app, settings, [name], with_lag)


def _connector(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    settings = settings.with_local_stack()
    operations = app_of(settings).connector(settings)
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
        from eventfold.projection_host import stop_on_signal

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
    report = app.verify_log(settings.with_local_stack(), args.aggregate_type, args.prefix)
    print(report.summary())
    for stream_id, versions in list(report.missing.items())[:20]:
        print(f"  missing {stream_id}: versions {versions[:10]}")
    if report.missing_count > 0:
        print(f"  (the first aggregates by id; {report.missing_count} events missing in all)")
    for stream_id, versions in list(report.out_of_order.items())[:20]:
        print(f"  out of order {stream_id}: {versions[:10]}")
    return 0 if report.ok else 1


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


def _dlq(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    try:
        projection = app_of(settings).projections.get(args.name)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None
    settings = settings.with_local_stack()
    if args.action == "list":
        return _dlq_list(settings, projection, args)
    if args.target is None:
        what = "KEY of a parked key" if args.action == "retry" else "OFFSET of a dead letter"
        raise ConfigError(f"dlq {args.action} needs the {what} (see `eventfold dlq list "
                          f"{args.name}`)")
    if args.action == "retry":
        return _dlq_retry(settings, projection, args.target, args.by)
    offset = _letter_offset(args.target)
    if args.action == "discard":
        return _dlq_discard(settings, projection, offset, args)
    from eventfold.projections.dead_letters import find_dead_letter

    try:
        letter = find_dead_letter(settings.kafka, projection.dead_letter_topic, offset)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None
    print(json.dumps(letter.as_json(with_event=True), indent=2, default=str))
    return 0


def _letter_offset(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"a dead letter's OFFSET is a whole number, not {text!r}") from None


def _dlq_list(settings: Settings, projection: Projection, args: argparse.Namespace) -> int:
    from eventfold.projections.dead_letters import read_dead_letters, resolutions_of

    letters = read_dead_letters(settings.kafka, projection.dead_letter_topic, args.last)
    done = resolutions_of(settings.database_url, projection.name,
                          [letter.dead_letter_offset for letter in letters])
    if args.json:
        print(json.dumps([{**letter.as_json(), "status": _status_of(done.get(
            letter.dead_letter_offset))} for letter in letters], indent=2, default=str))
        return 0
    for letter in letters:
        print(f"{letter.dead_letter_offset}\t{_status_of(done.get(letter.dead_letter_offset))}"
              f"\t{letter.source}\tkey={letter.fold_key or letter.key}\t{letter.error}")
    return 0


def _status_of(resolution: Resolution | None) -> str:
    if resolution is None:
        return "pending"
    return f"{resolution.action} by {resolution.resolved_by}" + (
        f" ({resolution.reason})" if resolution.reason else "")


def _dlq_retry(settings: Settings, projection: Projection, key: str, by: str) -> int:
    from eventfold.app import output_topic_configs
    from eventfold.projections.dead_letters import RetryFailed, retry_key

    try:
        result = retry_key(settings.database_url, settings.kafka, projection, key, by,
                           settings.replication, output_topic_configs(settings))
    except RetryFailed as exc:
        print(f"eventfold: {exc}", file=sys.stderr)
        return 1
    print(f"{projection.name} v{result.version} key {key!r}: {result.folded} event(s) folded "
          f"in order from {len(result.letters)} dead letter(s); the key is no longer parked. "
          f"State: {json.dumps(result.state, default=str)}")
    return 0


def _dlq_discard(settings: Settings, projection: Projection, offset: int,
                 args: argparse.Namespace) -> int:
    from eventfold.projections.dead_letters import discard

    if not args.reason:
        raise ConfigError("dlq discard needs --reason: why the event is never to be folded")
    try:
        done = discard(settings.database_url, settings.kafka, projection, offset, args.by,
                       args.reason)
    except LookupError as exc:
        raise ConfigError(str(exc)) from None
    print(f"dead letter {offset} ({done.letter.source}) discarded by {args.by}: {args.reason}")
    if done.key is not None and done.still_held:
        print(f"key {done.key!r} still waits on {done.still_held} event(s): `eventfold dlq "
              f"retry {projection.name} {done.key}` folds them in order")
    elif done.key is not None:
        print(f"key {done.key!r} waits on nothing more: it is no longer parked")
    return 0


def _demo(settings: Settings, _: argparse.Namespace) -> int:
    from eventfold.demo import run_demo

    return run_demo(settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eventfold", description=__doc__)
    parser.add_argument("--version", action="version", version=f"eventfold {_version()}")
    parser.add_argument("--app-dir", metavar="DIR",
                        help="import EVENTFOLD_APP's module from DIR first (then the working "
                             "directory, then the installed packages); same as "
                             "EVENTFOLD_APP_DIR")
    commands = parser.add_subparsers(dest="command", required=True)

    stack = commands.add_parser(
        "stack", help="start/stop the local Postgres, broker and Connect",
        description="install: fetch the jars once (Maven Central) and check Java and "
                    "PostgreSQL; up: start what is not running (data kept); down: stop (data "
                    "kept); "
                    "restart COMPONENT: stop and start one; reset: stop and delete all data; "
                    "status: PIDs and endpoints")
    stack.add_argument("action", choices=["install", "up", "down", "restart", "reset",
                                          "status"],
                       help="what to do with the stack (see above)")
    stack.add_argument("component", nargs="?",
                       help="restart: which one (postgres, broker, connect; on a cluster "
                            "stack also broker-2, broker-3, connect-2)")
    stack.add_argument("--cluster", action="store_true",
                       help="up: three brokers (replication factor 3, min.insync.replicas 2), "
                            "two Connect workers, and a Spark standalone master with two "
                            "workers (1 core, 3 GiB each) for EVENTFOLD_SPARK_MASTER")
    stack.set_defaults(run=_stack)

    init = commands.add_parser(
        "init", help="write a first app here: NAME.py, eventfold.toml, test_NAME.py",
        description="Writes an application module (an aggregate, two commands, a projection), "
                    "eventfold.toml naming it, and a test of its projection; never overwrites.")
    init.add_argument("--name", default="myapp", help="the module's name (default: myapp)")
    init.set_defaults(run=_init)

    commands.add_parser("migrate", help="alembic upgrade head").set_defaults(run=_migrate)
    setup = commands.add_parser(
        "setup", help="migrate, create event topics, apply the CDC connector")
    setup.add_argument("--fix-topics", action="store_true",
                       help="alter existing topics whose configs differ from what they need "
                            "(else such a difference is an error naming topic and setting)")
    setup.set_defaults(run=_setup)

    serve = commands.add_parser("serve", help="serve the command or read API over HTTP")
    serve.add_argument("api", choices=["commands", "reads"],
                       help="commands: the command API (EVENTFOLD_COMMAND_API_PORT); reads: the "
                            "read API (EVENTFOLD_READ_API_PORT)")
    serve.set_defaults(run=_serve)

    proj = commands.add_parser("projection", help="list, run, replay projections; status")
    proj.add_argument("action", choices=["list", "run", "replay", "status"],
                      help="list: every projection and its outputs; run: stream (until "
                           "SIGTERM, or --once); replay: rebuild beside the live version and "
                           "switch; status: lag, last batch, dead letters (exit 5 when stale)")
    proj.add_argument("names", nargs="*", metavar="NAME",
                      help="the projection (replay: one; run: one or more, in one Spark "
                           "application; status: default all)")
    proj.add_argument("--all", action="store_true",
                      help="run: every projection of the app, in one Spark application")
    proj.add_argument("--once", action="store_true",
                      help="catch up with everything available now, then stop")
    proj.add_argument("--standby", action="store_true",
                      help="run: where another runner writes a projection, wait and take over "
                           "when it ends (without it, such a run is refused)")
    proj.add_argument("--from", dest="source", choices=["auto", "kafka", "store"],
                      default="auto",
                      help="replay: start from the topics, or from the event store and then the "
                           "topics; auto reads the store when a topic no longer starts at 0")
    proj.add_argument("--stale-after", type=float, default=60, metavar="SECONDS",
                      help="status: a projection with events waiting whose last batch is "
                           "older than this is stale (exit code 5)")
    proj.set_defaults(run=_projection)

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

    dlq = commands.add_parser(
        "dlq", help="a projection's dead letters: list, show, retry a parked key, discard")
    dlq.add_argument("action", choices=["list", "show", "retry", "discard"],
                     help="list: each letter's offset, status, source position, key and error; "
                          "show: one letter with its event decoded; retry: fold a parked "
                          "key's held events in order (after fixing the fold); discard: never "
                          "fold a letter's event, recording who and why")
    dlq.add_argument("name", help="the projection")
    dlq.add_argument("target", nargs="?",
                     help="show, discard: the letter's offset in the dead-letter topic (from "
                          "list); retry: the parked key")
    dlq.add_argument("--last", type=int, default=None, metavar="N",
                     help="list: only the newest N letters")
    dlq.add_argument("--json", action="store_true", help="list: one JSON document")
    dlq.add_argument("--reason", default="", help="discard: why (kept with the record)")
    dlq.add_argument("--by", default=_user(),
                     help="retry, discard: who acts (default: the login name)")
    dlq.set_defaults(run=_dlq)

    verify = commands.add_parser(
        "verify-log", help="compare the event store with an aggregate type's topic")
    verify.add_argument("aggregate_type", help="e.g. Product: its events and its topic")
    verify.add_argument("--prefix", default="", help="only streams whose id starts so")
    verify.set_defaults(run=_verify_log)

    commands.add_parser(
        "demo", help="start the stack, run the inventory example end to end, stop the stack"
    ).set_defaults(run=_demo)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eventfold")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_arguments(args)
        if args.app_dir:
            # In the environment, so that HTTP workers and Spark's workers see it too.
            os.environ["EVENTFOLD_APP_DIR"] = str(Path(args.app_dir).resolve())
        settings = Settings.from_env()
        configure_logging(settings.log_level, settings.log_format)
        return int(args.run(settings, args))
    except ConfigError as exc:
        print(f"eventfold: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eventfold: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from eventfold.local_stack import StackError
        from eventfold.projection_host import (
            ProjectionsStopped,
            ReplayCancelled,
            ReplayFailed,
            needs_a_person,
        )

        if isinstance(exc, ReplayCancelled):
            print(f"eventfold: {exc}", file=sys.stderr)
            return 130
        if isinstance(exc, (StackError, ProjectionsStopped, ReplayFailed, *needs_a_person())):
            print(f"eventfold: {exc}", file=sys.stderr)
            return 1
        raise


def _check_arguments(args: argparse.Namespace) -> None:
    """A ConfigError for an argument no stored value can hold: bytes that are not UTF-8
    arrive as lone surrogates, and would fail deep inside a database call."""
    from eventfold.write_model.domain.values import text_problem

    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and (problem := text_problem(text)) is not None:
                raise ConfigError(f"argument {name.replace('_', '-')}: {problem}")


if __name__ == "__main__":
    sys.exit(main())
