"""Operating the outbox connector: apply with a diff, validate, status with the replication
slot's retained WAL, pause/resume/restart, delete (and drop its slot)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from eventfold.contract import libpq_url
from eventfold.contract.backoff import doubled
from eventfold.outbox.connection import redact
from eventfold.outbox.connector import ConnectClient, ConnectError, OutboxConnectorSpec
from eventfold.outbox.topics import TopicAdmin

log = logging.getLogger(__name__)

DEFAULT_WAL_WARNING_BYTES = 1024**3
SLOT_SETTLE_S = 30.0
"""How long `status` gives a restarted worker to start its connector, and its task to attach
to its slot, before calling them absent or inactive (a worker on a busy host took over 15 s to
read its config topic again)."""
HEARTBEAT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(3600 * 1000),
                          "retention.bytes": "-1"}
ConfigDiff = dict[str, tuple[str | None, str | None]]


@dataclass(frozen=True)
class SlotInfo:
    name: str
    active: bool
    retained_wal_bytes: int
    unconfirmed_wal_bytes: int


@dataclass
class ConnectorStatus:
    name: str
    connector_state: str
    tasks: list[dict[str, Any]]
    slot: SlotInfo | None
    warnings: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.connector_state == "RUNNING" and bool(self.tasks) and all(
            t["state"] == "RUNNING" for t in self.tasks)

    @property
    def starting(self) -> bool:
        """Coming up after a restart: no task yet, a task not yet running, or a running task
        not yet attached to its slot. Not a failure."""
        if self.connector_state in ("UNASSIGNED", "RESTARTING"):
            return True
        if self.connector_state == "ABSENT":
            # A worker that has not yet read its config topic knows no connector: one whose
            # slot exists was made, and is coming back
            return self.slot is not None
        if self.connector_state != "RUNNING":
            return False
        if not self.tasks or any(t["state"] in ("UNASSIGNED", "RESTARTING")
                                 for t in self.tasks):
            return True
        return self.running and self.slot is not None and not self.slot.active


def _failed_parts(raw: dict[str, Any] | None) -> list[str]:
    if raw is None:
        return []
    parts = ["connector"] if raw["connector"]["state"] == "FAILED" else []
    return parts + [f"task {t['id']}" for t in raw["tasks"] if t["state"] == "FAILED"]


def _first_trace_line(raw: dict[str, Any] | None) -> str:
    traces = [part.get("trace", "") for part in [raw["connector"], *raw["tasks"]]] if raw else []
    return next((trace.splitlines()[0][:300] for trace in traces if trace), "no trace")


@dataclass(frozen=True)
class ApplyResult:
    action: str  # "created", "updated" or "unchanged"
    diff: ConfigDiff


def config_diff(current: dict[str, str] | None, wanted: dict[str, str]) -> ConfigDiff:
    """Keys whose value differs: key -> (current, wanted); ``name`` is Connect's own."""
    current = {k: v for k, v in (current or {}).items() if k != "name"}
    return {key: (current.get(key), wanted.get(key))
            for key in sorted(set(current) | set(wanted))
            if current.get(key) != wanted.get(key)}


def describe_diff(diff: ConfigDiff) -> list[str]:
    """One line per difference, fit to print: a secret's value shows as ``****``."""
    return [f"{key}: {_shown(key, old)} -> {_shown(key, new)}"
            for key, (old, new) in diff.items()]


def _shown(key: str, value: str | None) -> str:
    return repr(value) if value is None else repr(redact({key: value})[key])


class ConnectorOperations:
    """One outbox connector, through the Connect REST API and the database's slot views."""

    def __init__(self, client: ConnectClient, spec: OutboxConnectorSpec,
                 topics: TopicAdmin | None = None) -> None:
        self.client = client
        self.spec = spec
        self.topics = topics
        """Creates the heartbeat topics ahead of the connector, if given."""

    def diff(self) -> ConfigDiff:
        return config_diff(self.client.get_config(self.spec.name), self.spec.config())

    def apply(self, timeout_s: float = 60, stop_first: bool = False) -> ApplyResult:
        """Create the connector or bring its config to the spec (``stop_first``: see
        ``ConnectClient.apply``)."""
        current = self.client.get_config(self.spec.name)
        difference = config_diff(current, self.spec.config())
        if current is not None and not difference:
            log.info("connector %s unchanged", self.spec.name)
            return ApplyResult("unchanged", {})
        if self.topics is not None:
            self.topics.ensure(self.spec.heartbeat_topics, HEARTBEAT_TOPIC_CONFIG)
        self.client.apply(self.spec, timeout_s, stop_first=stop_first and current is not None)
        return ApplyResult("created" if current is None else "updated", difference)

    def validate(self) -> list[tuple[str, str]]:
        return self.client.validate({"name": self.spec.name, **self.spec.config()})

    def status(self, wal_warning_bytes: int = DEFAULT_WAL_WARNING_BYTES,
               settle_s: float = SLOT_SETTLE_S) -> ConnectorStatus:
        """The connector's and its tasks' states and the slot. Right after a worker or
        database restart the connector is starting (tasks unassigned, the slot not yet
        attached): this waits up to ``settle_s`` for it to settle before reporting."""
        deadline = time.monotonic() + settle_s
        while True:
            status = self._status_now()
            if not status.starting or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if status.slot is not None and status.slot.retained_wal_bytes > wal_warning_bytes:
            status.warnings.append(
                f"slot {status.slot.name} retains {status.slot.retained_wal_bytes:,} bytes of "
                f"WAL (over {wal_warning_bytes:,}): is the connector consuming?")
        if status.slot is not None and not status.slot.active and status.running:
            status.warnings.append(f"slot {status.slot.name} is not active")
        return status

    def _status_now(self) -> ConnectorStatus:
        raw = self.client.status(self.spec.name)
        slot = self.slot()
        if raw is None:
            return ConnectorStatus(self.spec.name, "ABSENT", [], slot)
        status = ConnectorStatus(self.spec.name, raw["connector"]["state"], raw["tasks"], slot)
        if raw["connector"].get("trace"):
            status.warnings.append(f"connector trace: {raw['connector']['trace'][:2000]}")
        return status

    def slot(self) -> SlotInfo | None:
        with self._database() as conn:
            row = conn.execute("""
                SELECT slot_name, active,
                       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
                       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn),
                                0)::bigint
                FROM pg_replication_slots WHERE slot_name = %s
            """, (self.spec.slot_name,)).fetchone()
        return SlotInfo(*row) if row else None

    def pause(self) -> None:
        self.client.pause(self.spec.name)
        self.client.wait_state(self.spec.name, "PAUSED")

    def resume(self) -> None:
        self.client.resume(self.spec.name)
        self.client.wait_running(self.spec.name)

    def restart(self, only_failed: bool = True) -> dict[str, Any]:
        return self.client.restart(self.spec.name, only_failed=only_failed)

    def supervise(self, stop: threading.Event, interval_s: float = 5.0,
                  max_pause_s: float = 300.0) -> None:
        """Until ``stop`` is set: restart the connector's FAILED tasks (and the connector).
        Kafka Connect never restarts a failed task itself, and some failures are transient:
        after a broker dies, fencing a task's zombie producers can time out while partition
        leadership moves, and the task stays FAILED. Restarts of a task that fails again wait
        longer each time, up to ``max_pause_s``."""
        pause, failed_in_a_row = interval_s, 0
        while not stop.wait(pause):
            try:
                raw = self.client.status(self.spec.name)
            except ConnectError as exc:
                log.warning("connector %s: status unavailable (%s)", self.spec.name, exc)
                pause = interval_s
                continue
            failed = _failed_parts(raw)
            if not failed:
                pause, failed_in_a_row = interval_s, 0
                continue
            failed_in_a_row += 1
            log.warning("connector %s: %s FAILED (%s); restarting them (attempt %d)",
                        self.spec.name, ", ".join(failed), _first_trace_line(raw),
                        failed_in_a_row)
            try:
                self.restart(only_failed=True)
            except ConnectError as exc:
                log.warning("connector %s: restart refused (%s)", self.spec.name, exc)
            pause = doubled(interval_s, failed_in_a_row, max_pause_s)

    def delete(self, keep_slot: bool = False, timeout_s: float = 60) -> bool:
        """Delete the connector and, unless ``keep_slot``, drop its replication slot (an
        unused slot would retain WAL forever) and its offsets with it: they point into the
        slot's WAL, and a connector applied again must start afresh, not resume from them.
        With ``keep_slot`` the offsets stay too, so a later ``apply`` resumes without loss.
        The publication belongs to the migrations."""
        if self.client.status(self.spec.name) is not None:
            # Stopped first, so that no task is starting when the config goes: Connect 4.1
            # cannot fence the zombies of a task that starts while its connector is deleted,
            # and every later offset reset of that name then fails until the worker restarts.
            self.client.stop(self.spec.name)
            if not keep_slot:
                self.client.reset_offsets(self.spec.name)
        deleted = self.client.delete(self.spec.name)
        if keep_slot:
            return deleted
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            slot = self.slot()
            if slot is None:
                return deleted
            if not slot.active:
                with self._database() as conn:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot.name,))
                log.info("dropped replication slot %s", slot.name)
                return deleted
            time.sleep(0.2)  # the task is still shutting down and holds the slot
        raise ConnectError(f"slot {self.spec.slot_name} still active {timeout_s:.0f} s after "
                           "deleting the connector")

    def _database(self) -> psycopg.Connection[Any]:
        return psycopg.connect(libpq_url(self.spec.database_url), autocommit=True)
