"""The Debezium outbox connector: a declarative spec, and Kafka Connect's REST API to run it."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from sqlalchemy.engine import make_url

from eventfold.contract import DEFAULT_TOPIC_PREFIX
from eventfold.contract.backoff import doubled
from eventfold.outbox.design import DEFAULT_OUTBOX_DESIGN, OutboxDesign
from eventfold.write_model.persistence.schema import HEARTBEAT_TABLE, OUTBOX_PUBLICATION

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RoutedColumns:
    """The captured table's columns the router reads: the message's key, payload, topic
    (by aggregate type) and id, and the ones placed in the envelope, by envelope field."""

    key: str
    payload: str
    aggregate_type: str
    event_id: str
    envelope: tuple[tuple[str, str], ...]
    excluded: tuple[str, ...] = ()
    """Columns left out of the change events (types Debezium does not carry)."""


_ENVELOPE = (("stream_version", "streamVersion"), ("global_position", "globalPosition"),
             ("recorded_at", "recordedAt"), ("schema_version", "schemaVersion"),
             ("metadata", "metadata"))
ROUTED_COLUMNS = {
    # Column names follow the router's defaults.
    OutboxDesign.OUTBOX_TABLE: RoutedColumns(
        "aggregateid", "payload", "aggregatetype", "id",
        (("type", "eventType"), ("id", "eventId"), *_ENVELOPE)),
    OutboxDesign.EVENTS_TABLE: RoutedColumns(
        "stream_id", "data", "stream_type", "event_id",
        (("event_type", "eventType"), ("event_id", "eventId"), *_ENVELOPE),
        excluded=("tx_id",)),  # xid8: only the store's own readers need it
}


@dataclass(frozen=True)
class OutboxConnectorSpec:
    """What to capture and where to route it; renders the Debezium + EventRouter config.

    ``database_url`` is the database as the Connect workers reach it, which in production may
    differ from how the application reaches it.
    """

    database_url: str
    name: str = "eventfold-outbox"
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    slot_name: str = "eventfold_outbox"
    publication_name: str = OUTBOX_PUBLICATION
    design: OutboxDesign = DEFAULT_OUTBOX_DESIGN
    heartbeat_table: str = f"public.{HEARTBEAT_TABLE}"
    heartbeat_interval_ms: int = 10_000
    poll_interval_ms: int = 50
    password_ref: str = ""
    """A Connect config provider reference the workers resolve to the database password
    (``${file:/etc/kafka/secrets.properties:password}``, ``${env:PGPASSWORD}``). The password
    in ``database_url`` is for this process's own queries and never goes to Connect, whose
    config topic and REST API would show it in clear."""
    exactly_once: bool = True
    """KIP-618: records and source offsets commit in one Kafka transaction, so a worker crash
    re-sends nothing. Needs workers with ``exactly.once.source.support=enabled``."""

    @property
    def heartbeat_topics(self) -> list[str]:
        """Topics the heartbeats go to (created ahead: not every broker auto-creates)."""
        return [f"__debezium-heartbeat.{self.name}", f"{self.name}.{self.heartbeat_table}"]

    def config(self) -> dict[str, str]:
        url = make_url(self.database_url)
        if url.password and not self.password_ref:
            raise ValueError(
                "the connector's database password must reach Kafka Connect through a config "
                "provider, not its plain config: set EVENTFOLD_CONNECT_DATABASE_PASSWORD to a "
                "reference such as ${file:/etc/kafka/secrets.properties:password} (and "
                "configure that provider on the workers)")
        columns = ROUTED_COLUMNS[self.design]
        captured = f"public.{self.design.captured_table}"
        placement = ",".join(f"{col}:envelope:{field}" for col, field in columns.envelope)
        excluded = ({"column.exclude.list": ",".join(f"{captured}.{c}" for c in columns.excluded)}
                    if columns.excluded else {})
        return {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": url.host or "127.0.0.1",
            "database.port": str(url.port or 5432),
            "database.user": url.username or "postgres",
            "database.password": self.password_ref,
            "database.dbname": url.database or "postgres",
            **_ssl_settings(url.query),
            "topic.prefix": self.name,
            "slot.name": self.slot_name,
            "publication.name": self.publication_name,
            # The publication is created by a migration, not by the connector.
            "publication.autocreate.mode": "disabled",
            "table.include.list": f"{captured},{self.heartbeat_table}",
            **excluded,
            # An idle outbox must not pin WAL: the heartbeat writes to a published table, so
            # the slot's confirmed position moves on with the rest of the database.
            "heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "heartbeat.action.query": (
                f"INSERT INTO {self.heartbeat_table} (id, beat_at) VALUES (1, now()) "
                "ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at"),
            "snapshot.mode": "no_data",
            "tombstones.on.delete": "false",
            "poll.interval.ms": str(self.poll_interval_ms),
            "max.batch.size": "20480",
            "max.queue.size": "81920",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            # The router sees captured rows only; heartbeat rows pass through to their topic.
            "transforms.outbox.predicate": "isOutbox",
            "predicates": "isOutbox",
            "predicates.isOutbox.type":
                "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
            "predicates.isOutbox.pattern": f".*\\.{self.design.captured_table}$",
            "transforms.outbox.table.field.event.id": columns.event_id,
            "transforms.outbox.table.field.event.key": columns.key,
            "transforms.outbox.table.field.event.payload": columns.payload,
            "transforms.outbox.route.by.field": columns.aggregate_type,
            "transforms.outbox.route.topic.replacement": f"{self.topic_prefix}${{routedByValue}}",
            "transforms.outbox.table.expand.json.payload": "false",
            "transforms.outbox.table.fields.additional.placement": placement,
            "exactly.once.support": "required" if self.exactly_once else "requested",
        }


LIBPQ_SSL_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword",
                        "sslfactory")


def _ssl_settings(query: Mapping[str, str | tuple[str, ...]]) -> dict[str, str]:
    """The database URL's libpq SSL parameters (``?sslmode=verify-full&sslrootcert=...``) as
    Debezium's ``database.ssl*`` settings, so that Connect reaches the database as securely
    as the application does."""
    return {f"database.{key}": str(value if isinstance(value, str) else value[-1])
            for key, value in query.items() if key in LIBPQ_SSL_PARAMETERS}


class ConnectError(RuntimeError):
    """Kafka Connect refused a request or a connector did not reach RUNNING."""


def _explain(what: str, response: requests.Response) -> str:
    text = response.text[:1500]
    if "Failed to find any class that implements Connector" in text or (
            response.status_code == 404 and "connector-plugins" in response.url):
        return (f"{what}: the connector plugin is not installed on the Connect workers "
                f"({response.status_code}: {text[:300]})")
    return f"{what} -> {response.status_code}: {text}"


class ConnectClient:
    """A small client of the Kafka Connect REST API, retrying rebalances and connection errors."""

    RETRY_STATUSES = (409, 500, 502, 503, 504)

    def __init__(self, url: str, timeout_s: float = 10, retries: int = 20) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.session = requests.Session()

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        for attempt in range(1, self.retries + 1):
            try:
                response = self.session.request(
                    method, f"{self.url}{path}", timeout=self.timeout_s, **kwargs
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                # A worker busy with a rebalance or a dead broker answers late: each call
                # here is safe to repeat (PUT, restart, pause, resume, DELETE, GET).
                if attempt == self.retries:
                    raise ConnectError(
                        f"Kafka Connect at {self.url} is unreachable: {exc}") from exc
            else:
                if response.status_code not in self.RETRY_STATUSES or attempt == self.retries:
                    return response
                log.info("connect %s %s -> %d (attempt %d); retrying", method, path,
                         response.status_code, attempt)
            time.sleep(doubled(0.2, attempt, 3.0))
        raise AssertionError("unreachable")

    def put_config(self, name: str, config: dict[str, str]) -> dict[str, Any]:
        """Create or update the connector (idempotent)."""
        response = self._request("PUT", f"/connectors/{name}/config", json=config)
        if response.status_code not in (200, 201):
            raise ConnectError(_explain(f"PUT /connectors/{name}/config", response))
        return dict(response.json())

    def get_config(self, name: str) -> dict[str, str] | None:
        response = self._request("GET", f"/connectors/{name}/config")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ConnectError(_explain(f"GET /connectors/{name}/config", response))
        return dict(response.json())

    def validate(self, config: dict[str, str]) -> list[tuple[str, str]]:
        """Connect's own validation of ``config``: (key, error) for every problem."""
        plugin = config["connector.class"]
        response = self._request("PUT", f"/connector-plugins/{plugin}/config/validate",
                                 json=config)
        if response.status_code != 200:
            raise ConnectError(_explain(f"validating with {plugin}", response))
        return [(entry["value"]["name"], error) for entry in response.json()["configs"]
                for error in entry["value"]["errors"]]

    def restart(self, name: str, only_failed: bool = True) -> dict[str, Any]:
        """Restart the connector's instance and tasks; by default only those that FAILED."""
        params = {"includeTasks": "true", "onlyFailed": str(only_failed).lower()}
        response = self._request("POST", f"/connectors/{name}/restart", params=params)
        if response.status_code not in (200, 202, 204):
            raise ConnectError(_explain(f"POST /connectors/{name}/restart", response))
        return dict(response.json()) if response.content else {}

    def status(self, name: str) -> dict[str, Any] | None:
        response = self._request("GET", f"/connectors/{name}/status")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    def delete(self, name: str, timeout_s: float = 60) -> bool:
        """Delete the connector and wait until the cluster no longer knows it (deletion
        spreads through a rebalance in distributed mode)."""
        response = self._request("DELETE", f"/connectors/{name}")
        if response.status_code == 404:
            return False
        if response.status_code not in (200, 204):
            raise ConnectError(f"DELETE /connectors/{name} -> {response.status_code}: "
                               f"{response.text[:500]}")
        deadline = time.monotonic() + timeout_s
        while self.status(name) is not None:
            if time.monotonic() > deadline:
                raise ConnectError(f"connector {name} still listed {timeout_s:.0f} s after "
                                   "DELETE")
            time.sleep(0.2)
        return True

    def pause(self, name: str) -> None:
        self._expect_accepted("PUT", f"/connectors/{name}/pause")

    def stop(self, name: str) -> None:
        """Stop the connector (no tasks run; its config and offsets stay)."""
        self._expect_accepted("PUT", f"/connectors/{name}/stop")
        self.wait_state(name, "STOPPED")

    def reset_offsets(self, name: str) -> None:
        """Forget where the (stopped) connector had read to (KIP-875): Connect keeps a source
        connector's offsets in Kafka across a delete, and a connector created again under the
        same name would resume from them."""
        self._expect_accepted("DELETE", f"/connectors/{name}/offsets")

    def resume(self, name: str) -> None:
        self._expect_accepted("PUT", f"/connectors/{name}/resume")

    def _expect_accepted(self, method: str, path: str) -> None:
        response = self._request(method, path)
        if response.status_code not in (200, 202, 204):
            raise ConnectError(f"{method} {path} -> {response.status_code}: "
                               f"{response.text[:500]}")

    def wait_state(self, name: str, state: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status(name)
            if status and status["connector"]["state"] == state and all(
                    t["state"] == state for t in status["tasks"]):
                return
            time.sleep(0.2)
        raise ConnectError(f"connector {name} not {state} after {timeout_s:.0f} s")

    def wait_running(self, name: str, timeout_s: float = 60) -> dict[str, Any]:
        """Wait until the connector and all its tasks are RUNNING; fail fast on FAILED."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            status = self.status(name)
            if status:
                states = [status["connector"]["state"]] + [t["state"] for t in status["tasks"]]
                failed = [t for t in status["tasks"] if t["state"] == "FAILED"]
                if failed or status["connector"]["state"] == "FAILED":
                    trace = (failed[0] if failed else status["connector"]).get("trace", "")
                    raise ConnectError(f"connector {name} FAILED:\n{trace[:3000]}")
                if status["tasks"] and all(s == "RUNNING" for s in states):
                    return status
            time.sleep(0.25)
        raise ConnectError(f"connector {name} not RUNNING after {timeout_s:.0f} s: {status}")

    def apply(self, spec: OutboxConnectorSpec, timeout_s: float = 60,
              stop_first: bool = False) -> dict[str, Any]:
        """Create or update ``spec``'s connector and wait for it to run (idempotent).

        A config PUT restarts the tasks asynchronously: a task of the old config can go on
        capturing for a moment after it returns, and its last records are then captured again
        by the new one. ``stop_first`` (for an existing connector) stops it before the PUT
        and resumes it after, so the two never overlap."""
        if stop_first:
            self.stop(spec.name)
        self.put_config(spec.name, spec.config())
        if stop_first:
            self.resume(spec.name)
        status = self.wait_running(spec.name, timeout_s)
        log.info("connector %s RUNNING (%d task(s))", spec.name, len(status["tasks"]))
        return status
