"""docs/cli.md is the command line's reference as the CLI itself writes it: a command, an
option or a help text changed without it fails here (``python -m eventfold.cli.reference >
docs/cli.md`` writes it again)."""

from __future__ import annotations

from eventfold.cli import build_parser
from eventfold.cli.reference import commands, reference
from tests.packaging import ROOT


def test_docs_cli_is_what_the_cli_writes() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == reference(), (
        "docs/cli.md is stale: python -m eventfold.cli.reference > docs/cli.md")


def test_every_command_is_in_it() -> None:
    written = reference()
    for path, _ in commands(build_parser()):
        assert f"## `{' '.join(('eventfold', *path))}`" in written
