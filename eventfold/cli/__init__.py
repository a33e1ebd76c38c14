"""The ``eventfold`` command line: the parser, assembled from one module per area (``stack``,
``serve``, ``projection``, ``reaction``, ``status``, ``connector``, ``dlq``), and the exit
codes every command shares. A new command goes in its area's module, registered by its
``register``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eventfold.cli import connector, dlq, projection, reaction, serve, stack, status
from eventfold.config import ConfigError, Settings
from eventfold.logs import configure_logging

AREAS = (stack, serve, projection, reaction, status, connector, dlq)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eventfold",
                                     description="The ``eventfold`` command line.")
    parser.add_argument("--version", action="version", version=f"eventfold {_version()}")
    parser.add_argument("--app-dir", metavar="DIR",
                        help="import EVENTFOLD_APP's module from DIR first (then the working "
                             "directory, then the installed packages); same as "
                             "EVENTFOLD_APP_DIR")
    commands = parser.add_subparsers(dest="command", required=True)
    for area in AREAS:
        area.register(commands)
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
        from eventfold.projections.host_wiring import ProjectionsStopped, needs_a_person
        from eventfold.projections.replay_requests import ReplayCancelled, ReplayFailed

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
