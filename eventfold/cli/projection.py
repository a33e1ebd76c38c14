"""``eventfold projection``: list, run (a host of one or more), replay, status."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings

log = logging.getLogger("eventfold")

if TYPE_CHECKING:
    from eventfold.app import Eventfold
    from eventfold.projections.replay import ReplaySource
    from eventfold.run_observer import RunObserver


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    proj = commands.add_parser("projection", help="list, run, replay projections; status")
    proj.add_argument("action", choices=["list", "run", "replay", "status"],
                      help="list: every projection and its outputs; run: stream (until "
                           "SIGTERM, or --once); replay: rebuild beside the live version and "
                           "switch; status: lag, last batch, dead letters (exit 5 when stale)")
    proj.add_argument("names", nargs="*", metavar="NAME",
                      help="the projection (replay: one; run: one or more, in one Spark "
                           "application; status: default all)")
    proj.add_argument("--all", action="store_true",
                      help="run: every projection of the app, in one Spark application, and "
                           "every reaction beside them (not with --once)")
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
    return _run_projections(app, settings, names, args.once, args.standby,
                            with_reactions=args.all)


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
    reactions = [name for name in args.names if name in {r.name for r in app.reactions}]
    if reactions:
        # A reaction acts: replaying it would send its commands again, so it never replays.
        raise ConfigError(f"{reactions[0]} is a reaction, not a projection: "
                          f"`eventfold reaction run {reactions[0]}` runs it; a reaction never "
                          f"replays, `eventfold reaction reset {reactions[0]} --to-beginning` "
                          "acts again on its events on purpose, saying how many")
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
    from eventfold.projections.replay_requests import replay_on_a_host

    result = replay_on_a_host(settings.database_url, name, source)
    if result is None:
        observer = _observer(app, settings, name, with_lag=False)
        if observer is not None:
            observer.projections[name].replaying()
        try:
            result = app.runtime(settings).replay(name, source)
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
                     once: bool, standby: bool = False, with_reactions: bool = False) -> int:
    """The host; with ``with_reactions`` (``--all``, streaming) the app's reactions too, on a
    thread of their own beside the projections, stopping with them."""
    from eventfold.projections.signals import stop_on_signal

    runtime = app.runtime(settings)
    host = runtime.projection_host(names, once, standby)
    reactions = [r.name for r in app.reactions] if with_reactions and not once else []
    if not reactions:
        host.run()
        return 0
    failed: list[BaseException] = []

    def react() -> None:
        try:
            runtime.run_reactions(reactions, host.stop_requested)
        except BaseException as exc:  # the host must not go on without them, unseen
            log.error("the reactions stopped on an error; stopping the host: %s", exc,
                      exc_info=exc)
            failed.append(exc)
            host.stop_requested.set()

    thread = threading.Thread(target=react, name="reactions", daemon=True)
    thread.start()
    try:
        if names:
            host.run()
        else:  # reactions alone: no Spark application for them
            stop_on_signal(host.stop_requested, "stopping after the current batch")
            while thread.is_alive():
                thread.join(0.5)
    finally:
        host.stop_requested.set()
        thread.join(60)
    return 1 if failed else 0


def _observer(app: Eventfold, settings: Settings, name: str,
              with_lag: bool = True) -> RunObserver | None:
    if not settings.metrics or not settings.metrics_port:
        return None
    from eventfold.run_observer import RunObserver

    return RunObserver(app, settings, [name], with_lag)
