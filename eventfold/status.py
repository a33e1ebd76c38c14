"""``eventfold status``: the whole pipeline on one screen (or as JSON), and an exit code that
says what is wrong.

Exit codes, the most basic problem first:

- 0: everything healthy;
- 3: a component does not answer (Postgres, Kafka or Kafka Connect);
- 4: CDC is not flowing (the connector or a task is not RUNNING, its replication slot is not
  active, or the slot retains more WAL than the warning threshold);
- 5: a projection is stale: events wait for it and its last batch is older than the stale
  threshold (or it never ran).

(2 is the CLI's code for a configuration mistake.)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eventfold.config import Settings
from eventfold.contract import libpq_url
from eventfold.declared import DeclaredApp
from eventfold.outbox.connector import ConnectError
from eventfold.projections.state.catalog import builds
from eventfold.projections.state.hosts import live_hosts
from eventfold.projections.state.lease import live_writers
from eventfold.projections.state.readers import live_readers
from eventfold.projections.status import ProjectionStatus, projection_status
from eventfold.reactions.definition import Declared
from eventfold.reactions.operations import report as reaction_report
from eventfold.wiring import connector_operations

UNREACHABLE, CDC_DOWN, STALE = 3, 4, 5


@dataclass
class Problem:
    code: int
    what: str


@dataclass
class PipelineStatus:
    checked_at: str
    postgres: dict[str, Any]
    kafka: dict[str, Any]
    connector: dict[str, Any]
    projections: list[dict[str, Any]] = field(default_factory=list)
    read_apis: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)
    reactions: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return min((p.code for p in self.problems), default=0)

    def as_json(self) -> dict[str, Any]:
        return {"healthy": not self.problems, "exit_code": self.exit_code, **asdict(self)}


def pipeline_status(app: DeclaredApp, settings: Settings, stale_after_s: float = 60,
                    wal_warning_bytes: int = 1024**3) -> PipelineStatus:
    status = PipelineStatus(datetime.now(UTC).isoformat(timespec="seconds"),
                            _postgres(settings), _kafka(settings), {})
    for component in ("postgres", "kafka"):
        found = getattr(status, component)
        if not found["reachable"]:
            status.problems.append(Problem(UNREACHABLE, f"{component}: {found['error']}"))
    status.connector = _connector(app, settings, wal_warning_bytes, status.problems)
    if status.postgres["reachable"]:
        _database_side(app, settings, status, stale_after_s)
    return status


def _postgres(settings: Settings) -> dict[str, Any]:
    try:
        with psycopg.connect(libpq_url(settings.database_url), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return {"reachable": True, "server_version": row[0] if row else None}
    except psycopg.Error as exc:
        return {"reachable": False, "error": str(exc).strip().splitlines()[0]}


def _kafka(settings: Settings) -> dict[str, Any]:
    try:
        metadata = AdminClient(settings.kafka.client_config()).list_topics(timeout=10)
        return {"reachable": True, "bootstrap": settings.kafka.bootstrap_servers,
                "brokers": len(metadata.brokers)}
    except Exception as exc:  # KafkaException, or a bad client setting
        return {"reachable": False, "bootstrap": settings.kafka.bootstrap_servers,
                "error": str(exc)}


def _connector(app: DeclaredApp, settings: Settings, wal_warning_bytes: int,
               problems: list[Problem]) -> dict[str, Any]:
    operations = connector_operations(settings)
    operations.client.retries = 2  # a status screen answers quickly, even when Connect won't
    try:
        found = operations.status(wal_warning_bytes=wal_warning_bytes, settle_s=0)
    except (ConnectError, psycopg.Error) as exc:
        problems.append(Problem(UNREACHABLE, f"connector: {exc}"))
        return {"name": operations.spec.name, "reachable": False, "error": str(exc)}
    if not found.running:
        problems.append(Problem(CDC_DOWN, f"connector {found.name} is {found.connector_state}"
                                f" with tasks {[t['state'] for t in found.tasks]}"))
    problems.extend(Problem(CDC_DOWN, warning) for warning in found.warnings
                    if not warning.startswith("connector trace"))
    slot = asdict(found.slot) if found.slot else None
    return {"name": found.name, "reachable": True, "state": found.connector_state,
            "tasks": [{"id": t.get("id"), "state": t["state"], "worker": t.get("worker_id")}
                      for t in found.tasks], "slot": slot, "warnings": found.warnings}


def _database_side(app: DeclaredApp, settings: Settings, status: PipelineStatus,
                   stale_after_s: float) -> None:
    with psycopg.connect(libpq_url(settings.database_url), connect_timeout=5) as conn:
        building = builds(conn)
        readers = live_readers(conn)
        hosts = live_hosts(conn)
        writers = live_writers(conn, settings.writer_lease_s)
    for projection in app.projections:
        try:
            found = projection_status(projection, settings.database_url, settings.kafka)
        except Exception as exc:  # Kafka away: already a problem of its own
            status.projections.append({"name": projection.name, "error": str(exc)})
            continue
        entry = projection_entry(found, building.get(projection.name), stale_after_s)
        entry["writer"] = writers.get(projection.name)
        if entry["stale"]:
            status.problems.append(Problem(STALE, f"projection {projection.name}: "
                                                  f"{entry['stale']}"))
        status.projections.append(entry)
    status.reactions = [_reaction_entry(reaction, settings) for reaction in app.reactions]
    instances: dict[str, dict[str, Any]] = {}
    for reader in readers:
        instance = instances.setdefault(reader.instance_id, {
            "instance": reader.instance_id, "ktables": [], "seen_at": reader.seen_at})
        instance["ktables"].append(f"{reader.projection} v{reader.version}")
        instance["seen_at"] = max(instance["seen_at"], reader.seen_at)
    status.read_apis = [{**i, "seen_at": i["seen_at"].isoformat(timespec="seconds")}
                        for i in instances.values()]
    status.hosts = [{"host": h.host_id, "projections": h.projections,
                     "writes": [name for name in h.projections
                                if writers.get(name) == h.host_id],
                     "started_at": h.started_at.isoformat(timespec="seconds"),
                     "heartbeat_at": h.heartbeat_at.isoformat(timespec="seconds"),
                     "replays": h.replays} for h in hosts]


def _reaction_entry(reaction: Declared, settings: Settings) -> dict[str, Any]:
    """One reaction's line: how far behind, how much refused, its running processes."""
    try:
        found = reaction_report(settings.kafka, settings.database_url, reaction)
    except Exception as exc:  # Kafka away: already a problem of its own
        return {"name": reaction.name, "error": str(exc)}
    return {"name": found.name, "started": found.started, "lag": found.lag,
            "refused": found.refused, "parked": found.parked,
            "running": found.processes[0] if found.processes else None,
            "timers": found.processes[1] if found.processes else None}


def projection_entry(found: ProjectionStatus, building: int | None,
                     stale_after_s: float) -> dict[str, Any]:
    """One projection's line; ``stale`` says why it is, or is empty."""
    age = (time.time() - found.last_batch_at.timestamp()) if found.last_batch_at else None
    stale = ""
    if found.lag and age is None:
        stale = f"never ran; {found.lag:,} events wait"
    elif found.lag and age is not None and age > stale_after_s:
        stale = f"{found.lag:,} events wait and the last batch was {age:.0f} s ago"
    return {"name": found.name, "version": found.version, "building_version": building,
            "lag": found.lag, "events_applied": found.events_applied,
            "dead_letters": found.dead_letters, "parked_keys": found.parked_keys,
            "held_events": found.held_events,
            "last_batch_at": (found.last_batch_at.isoformat(timespec="seconds")
                              if found.last_batch_at else None),
            "last_batch_age_s": round(age, 1) if age is not None else None,
            "rows": found.rows, "stale": stale}


def _dead_letters(entry: dict[str, Any]) -> str:
    if not entry["dead_letters"]:
        return "0"
    parked = (f", {entry['parked_keys']:,} keys parked" if entry["parked_keys"] else "")
    return f"[yellow]{entry['dead_letters']:,}{parked}[/]"


def render(status: PipelineStatus, console: Console) -> None:
    """Tables for a person: components, CDC, projections, read APIs, then what is wrong."""
    ok, bad = "[green]ok[/]", "[red]DOWN[/]"
    components = Table(title="Pipeline", title_justify="left")
    for column in ("component", "state", "detail"):
        components.add_column(column)
    postgres, kafka, connector = status.postgres, status.kafka, status.connector
    components.add_row("Postgres", ok if postgres["reachable"] else bad,
                       escape(postgres.get("server_version") or postgres.get("error", "")))
    components.add_row("Kafka", ok if kafka["reachable"] else bad,
                       f"{kafka['bootstrap']}: {kafka.get('brokers', 0)} broker(s)"
                       if kafka["reachable"] else escape(kafka["error"]))
    if connector.get("reachable"):
        slot = connector["slot"]
        tasks = ", ".join(f"{t['id']}: {t['state']}" for t in connector["tasks"]) or "no task"
        components.add_row(f"connector {connector['name']}", _state(connector["state"]),
                           f"tasks {tasks}")
        components.add_row("replication slot",
                           "[green]active[/]" if slot and slot["active"] else "[red]inactive[/]",
                           f"{slot['name']}: {slot['retained_wal_bytes']:,} bytes of WAL "
                           "retained" if slot else "no slot")
    else:
        components.add_row(f"connector {connector['name']}", bad,
                           escape(connector.get("error", "")))
    console.print(components)
    projections = Table(title="Projections", title_justify="left")
    for column in ("projection", "version", "lag", "last batch", "dead letters", "rows"):
        projections.add_column(column, justify="left" if column == "projection" else "right")
    for p in status.projections:
        if "error" in p:
            projections.add_row(p["name"], "", "", f"[red]{escape(p['error'])}[/]", "", "")
            continue
        version = f"v{p['version']}" + (f" (replay building v{p['building_version']})"
                                        if p["building_version"] else "")
        age = p["last_batch_age_s"]
        last = "never" if age is None else f"{age:,.0f} s ago"
        projections.add_row(p["name"], version,
                            f"[red]{p['lag']:,}[/]" if p["stale"] else f"{p['lag']:,}", last,
                            _dead_letters(p), "" if p["rows"] is None else f"{p['rows']:,}")
    console.print(projections)
    hosts = Table(title="Projection hosts", title_justify="left")
    for column in ("host", "writes", "stands by for", "replaying", "last heartbeat"):
        hosts.add_column(column)
    for host in status.hosts:
        hosts.add_row(host["host"], ", ".join(host["writes"]) or "-",
                      ", ".join(p for p in host["projections"] if p not in host["writes"])
                      or "-",
                      ", ".join(host["replays"]) or "-", host["heartbeat_at"])
    console.print(hosts if status.hosts else "[dim]No projection host streams.[/]")
    if status.reactions:
        console.print(_reactions_table(status.reactions))
    readers = Table(title="Read API instances serving KTables", title_justify="left")
    for column in ("instance", "KTables", "last heartbeat"):
        readers.add_column(column)
    for reader in status.read_apis:
        readers.add_row(reader["instance"], ", ".join(reader["ktables"]), reader["seen_at"])
    console.print(readers if status.read_apis else "[dim]No read API instance serves KTables.[/]")
    if status.problems:
        console.print(f"[red bold]Unhealthy (exit code {status.exit_code}):[/]")
        for problem in status.problems:
            console.print(f"  [red]{problem.code}[/] {escape(problem.what)}")
    else:
        console.print("[green bold]Healthy.[/]")


def _reactions_table(reactions: list[dict[str, Any]]) -> Table:
    table = Table(title="Reactions", title_justify="left")
    for column in ("reaction", "lag", "refused", "parked keys", "processes running",
                   "timers pending"):
        table.add_column(column, justify="left" if column == "reaction" else "right")
    for r in reactions:
        if "error" in r:
            table.add_row(r["name"], f"[red]{escape(r['error'])}[/]", "", "", "", "")
            continue
        table.add_row(r["name"], f"{r['lag']:,}" if r["started"] else "never ran",
                      f"{r['refused']:,}",
                      f"[red]{r['parked']:,}[/]" if r["parked"] else "0",
                      "-" if r["running"] is None else f"{r['running']:,}",
                      "-" if r["timers"] is None else f"{r['timers']:,}")
    return table


def _state(state: str) -> str:
    return f"[green]{state}[/]" if state == "RUNNING" else f"[red]{state}[/]"
