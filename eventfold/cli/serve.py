"""``eventfold serve``: the command or read API over HTTP, in supervised workers."""

from __future__ import annotations

import argparse
import logging

from eventfold.config import ConfigError, Settings

log = logging.getLogger("eventfold")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="serve the command or read API over HTTP")
    serve.add_argument("api", choices=["commands", "reads"],
                       help="commands: the command API (EVENTFOLD_COMMAND_API_PORT); reads: the "
                            "read API (EVENTFOLD_READ_API_PORT)")
    serve.set_defaults(run=_serve)


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
