"""``eventfold stack``, ``init``, ``migrate``, ``setup`` and ``demo``: a machine and a
database made ready (the local stack, a first app, the schema, topics and connector)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from eventfold.config import ConfigError, Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stack = commands.add_parser(
        "stack", help="start/stop the local Postgres, broker and Connect",
        description="install: fetch the jars once (Maven Central), record the JVMs' "
                    "class-data archives and check Java and PostgreSQL; up: start what is not "
                    "running (data kept); down: stop (data kept); "
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

    commands.add_parser(
        "demo", help="start the stack, run the inventory example end to end, stop the stack"
    ).set_defaults(run=_demo)


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
    from eventfold.local_stack.class_data import build_stack_archives
    from eventfold.local_stack.java import install_jars, jars_dir, java_binary
    from eventfold.local_stack.postgres import find_bin_dir
    from eventfold.projections.execution.class_archive import build as build_spark_archive

    filled = install_jars()
    print(f"jars: {'fetched into ' + ', '.join(map(str, filled)) if filled else 'present'} "
          f"({jars_dir()})")
    print(f"java: {java_binary()}")
    print(f"postgres: {find_bin_dir()}")
    _record_archives("the broker's and Connect's", build_stack_archives)
    _record_archives("the local Spark driver's", build_spark_archive)
    return 0


def _record_archives(whose: str,
                     build: Callable[[], tuple[Path | list[Path], float | None]]) -> None:
    """An archive only makes starts sooner: one that cannot be recorded is reported, and the
    installation stands."""
    try:
        archives, seconds = build()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"class-data archives of {whose} JVM: not recorded, its starts stay slower "
              f"({exc})", file=sys.stderr)
        return
    paths = ", ".join(map(str, archives if isinstance(archives, list) else [archives]))
    done = "present" if seconds is None else f"recorded in {seconds:.0f} s"
    print(f"class-data archives of {whose} JVM: {done} ({paths})")


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

    app_of(settings).runtime(settings.with_local_stack()).setup(fix_topics=args.fix_topics)
    print("database migrated, event topics created, connector RUNNING")
    return 0


def _migrate(settings: Settings, _: argparse.Namespace) -> int:
    from eventfold import migrations

    migrations.upgrade(settings.with_local_stack().database_url)
    print("database at head")
    return 0


def _demo(settings: Settings, _: argparse.Namespace) -> int:
    from eventfold.demo import run_demo

    return run_demo(settings)
