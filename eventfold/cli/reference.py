"""The command line's reference, written from the parser itself: every command's usage and
options, as ``--help`` prints them. ``python -m eventfold.cli.reference > docs/cli.md``
writes it; a test checks docs/cli.md is what this writes."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from eventfold.cli import build_parser

WIDTH = "100"
"""The width the help is formatted to (argparse reads ``COLUMNS``): the same on every
machine."""

EXIT_CODES = {
    0: "done; for `status`, everything healthy",
    1: "a failure a person has to look at (the message says which): a projection refused or "
       "stopped, a stack that cannot start, a replay that failed",
    2: "a mistake in the command line or the configuration (nothing was started)",
    3: "`status`: a component does not answer (Postgres, Kafka or Kafka Connect)",
    4: "`status`: CDC is not flowing (the connector or a task is not RUNNING, its "
       "replication slot is not active, or the slot retains more WAL than the warning "
       "threshold)",
    5: "`status`: a projection is stale: events wait for it and its last batch is older "
       "than `--stale-after` (or it never ran)",
    86: "a fault point's crash (`EVENTFOLD_CRASH_AT`, tests only)",
    130: "interrupted (Ctrl-C), or a replay cancelled (it resumes when asked again)",
}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of ``parser`` (itself first), depth first, with its words."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def reference() -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        sections = [f"## `{' '.join(('eventfold', *path))}`\n\n```text\n"
                    f"{sub.format_help().rstrip()}\n```\n"
                    for path, sub in commands(build_parser())]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    codes = "\n".join(f"| {code} | {meaning} |" for code, meaning in EXIT_CODES.items())
    return ("# The `eventfold` command line\n\n"
            "Written from the CLI itself (`python -m eventfold.cli.reference > docs/cli.md`; "
            "`tests/unit/app/test_cli_reference.py` checks it is current). Settings come from "
            "`EVENTFOLD_*` variables and `eventfold.toml` ([configuration](configuration.md)); "
            "what to do about what a command reports: [the runbook](runbook.md).\n\n"
            "## Exit codes\n\n| code | meaning |\n|---|---|\n" + codes + "\n\n"
            + "\n".join(sections))


if __name__ == "__main__":
    print(reference(), end="")
