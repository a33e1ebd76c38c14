"""``eventfold dlq``: a projection's dead letters listed, shown, retried, discarded."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings

if TYPE_CHECKING:
    from eventfold.app import Eventfold
    from eventfold.projections.definition.projection import Projection
    from eventfold.projections.state.parking import Resolution


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = commands.add_parser(
        "dlq", help="a projection's dead letters: list, show, retry a parked key, discard; "
                    "a reaction's refusals and parked keys: list, retry")
    dlq.add_argument("action", choices=["list", "show", "retry", "discard"],
                     help="list: each letter's offset, status, source position, key and error; "
                          "show: one letter with its event decoded; retry: fold a parked "
                          "key's held events in order (after fixing the fold); discard: never "
                          "fold a letter's event, recording who and why")
    dlq.add_argument("name", help="the projection (or reaction)")
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


def _user() -> str:
    """Who runs this command, for the records of what was done with dead letters."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's arbitrary uid)
        return "unknown"


def _dlq(settings: Settings, args: argparse.Namespace) -> int:
    from eventfold.app import app_of

    app = app_of(settings)
    if args.name in {r.name for r in app.reactions}:
        return _reaction_letters(app, settings.with_local_stack(), args)
    try:
        projection = app.projections.get(args.name)
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


def _reaction_letters(app: Eventfold, settings: Settings, args: argparse.Namespace) -> int:
    """A reaction's dead letters: its refusals (what the domain refused, what raised) and its
    parked keys, each holding its events back behind the one it raised on."""
    import psycopg

    from eventfold.contract import libpq_url
    from eventfold.reactions.parking import parked_keys, request_retry

    if args.action == "retry":
        if args.target is None:
            raise ConfigError(f"dlq retry needs the KEY of a parked key (see `eventfold dlq "
                              f"list {args.name}`)")
        with psycopg.connect(libpq_url(settings.database_url)) as conn:
            held = request_retry(conn, args.name, args.target)
        if held is None:
            raise ConfigError(f"reaction {args.name} has no parked key {args.target!r}")
        print(f"reaction {args.name}: its runner acts on the {held} held events of "
              f"{args.target!r} at its next batch, in order (the key stays parked if one "
              f"raises again)")
        return 0
    if args.action != "list":
        raise ConfigError(f"{args.name} is a reaction: `eventfold dlq list {args.name}` lists "
                          f"its refusals and parked keys, `dlq retry {args.name} KEY` acts on "
                          f"a parked key's events again")
    from eventfold.cli.reaction import print_refusals
    from eventfold.reactions.positions import refusals_of

    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        parked = parked_keys(conn, args.name)
        if args.json:
            refusals = refusals_of(conn, args.name, args.last or 20)
            print(json.dumps({"parked": [vars(p) for p in parked],
                              "refusals": [vars(r) for r in refusals]}, default=str))
            return 0
    for p in parked:
        print(f"{args.name}\tparked\tkey={p.key}\t{p.held} held since {p.event_id}"
              f"{' (retry asked)' if p.retry_requested else ''}\t{p.reason}")
    return print_refusals(settings, [args.name], args.last or 20, as_json=False)


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
    from eventfold.projections.dead_letters import RetryFailed, retry_key
    from eventfold.wiring import output_topic_configs

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
