"""Exactly-once writes of a projection version's Kafka outputs: each writer slot (the driver,
or a Spark task's partition) produces in Kafka transactions under a transactional id stable
across runs, so that a newer runner fences an older one at the broker (``fence_writers``
takes every slot's id at once when a runner takes the writer lease)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaError, KafkaException, Producer

from eventfold.outbox.connection import KafkaConnection
from eventfold.projections.state.producer import FLUSH_TIMEOUT_S, PRODUCER_SETTINGS

log = logging.getLogger(__name__)


DRIVER_SLOT = "driver"
"""The transactional id's slot of the batches a runner folds on its driver; a Spark task's is
``task-<its partition>``."""


def writer_transactional_id(writer: str, slot: str) -> str:
    """The transactional id of one slot of a projection version's writer (``writer``: the
    version's prefix, ``eventfold.<projection>.v<version>``): stable across runs, so that a
    newer runner's producer fences an older one's at the broker."""
    return f"{writer}.{slot}"


def writer_slots(tasks: int) -> list[str]:
    """Every slot a runner with at most ``tasks`` tasks per job writes from."""
    return [DRIVER_SLOT, *(f"task-{index}" for index in range(tasks))]


class WritesFenced(RuntimeError):
    """A newer runner's producer took this transactional id over: this runner's writes are
    refused by the broker, and it must stop."""


class TransactionalWrites:
    """A transactional producer of one writer slot: ``begin`` before a task produces,
    ``commit`` once it has (its records become visible to read-committed consumers
    together, or never, if a newer producer fenced this one meanwhile)."""

    def __init__(self, kafka: KafkaConnection, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer = Producer(kafka.client_config(**PRODUCER_SETTINGS, **{
            "transactional.id": transactional_id, "transaction.timeout.ms": 60_000}))
        self._open = False
        self.fenced = False
        self._call(self.producer.init_transactions, FLUSH_TIMEOUT_S)

    def begin(self) -> None:
        """A new transaction; one a failed attempt left open is aborted first."""
        if self._open:
            self._call(self.producer.abort_transaction, FLUSH_TIMEOUT_S)
            self._open = False
        self._call(self.producer.begin_transaction)
        self._open = True

    def commit(self) -> None:
        self._call(self.producer.commit_transaction, FLUSH_TIMEOUT_S)
        self._open = False

    def abort_quietly(self) -> None:
        """Abort the open transaction, if any (a task that failed or was fenced): left open,
        it would hold back read-committed readers of its partitions until it timed out. A
        producer fenced meanwhile has nothing left to abort."""
        if not self._open:
            return
        try:
            self._call(self.producer.abort_transaction, FLUSH_TIMEOUT_S)
        except (KafkaException, WritesFenced) as exc:
            log.debug("aborting %s: %s", self.transactional_id, exc)
        self._open = False

    def _call(self, action: Callable[..., object], *args: float) -> None:
        try:
            action(*args)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or error.code() in _FENCED_CODES:
                self.fenced = True
                raise WritesFenced(f"the producer {self.transactional_id} was fenced by a "
                                   f"newer one: {error.str()}") from None
            if error.txn_requires_abort():
                self._open = True  # the next begin aborts it
            raise


_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                           KafkaError.INVALID_PRODUCER_EPOCH})


def fence_writers(kafka: KafkaConnection, writer: str, slots: Sequence[str]) -> None:
    """Take every slot's transactional id, all at once: whatever an older runner of the
    version still has open is aborted, and its producers are refused from now on."""
    with ThreadPoolExecutor(max_workers=min(len(slots), 16) or 1) as pool:
        for fenced in pool.map(lambda slot: TransactionalWrites(
                kafka, writer_transactional_id(writer, slot)), slots):
            fenced.producer.flush(0)
