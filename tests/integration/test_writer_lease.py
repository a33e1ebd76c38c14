"""The writer lease where a step outlasts it:

- a batch's commit that lasts longer than a lease (it waits on a lock an operator holds): the
  commit holds the lease's registry row, so the renewal thread waits behind it, and the
  commit renews the lease itself as it ends, in the database (a standby still finds it held)
  and in the runner (which goes on writing);
- a run the host's watchdog gives up as stalled, and the host then stops: the stalled run's
  lease is no longer renewed, so a standby takes the projection over within about a lease.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import psycopg
import pytest

from eventfold.contract import libpq_url
from eventfold.projections import faults, metrics
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.lease import WriterBusy, WriterLease, writer_of
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore
from tests.pipeline_helpers import wait_for
from tests.support.campaign import app as campaign
from tests.support.campaign.actors import HostActor

LEASE_S = 1.0


def test_a_commit_longer_than_a_lease_renews_it_as_it_ends(inventory_app, stack_settings,
                                                           unique) -> None:
    url, name = stack_settings.database_url, f"lease_{unique}"
    ProjectionCatalog(url).register(name)
    counted = dataclasses.replace(campaign.totals, name=name, table="", ktable_topic="")
    writer = WriterLease(url, name, holder="writer", lease_s=LEASE_S)
    epoch = writer.acquire()
    writer.renewing()
    commit = {"writer_epoch": epoch, "writer_lease_s": LEASE_S,
              "lease_renewed": writer.renewed_in_commit}
    try:
        with ReadModelStore(url, counted, 1) as store:
            store.ensure_schema()
            store.commit(0, StagedBatch("first"), {}, **commit)
            with psycopg.connect(libpq_url(url)) as operator:
                # The next commit takes the registry row, then waits on the checkpoint's.
                operator.execute("SELECT 1 FROM projection_checkpoints WHERE projection = %s "
                                 "FOR UPDATE", (name,))
                committing = threading.Thread(target=store.commit, args=(
                    1, StagedBatch("second"), {}), kwargs=commit)
                committing.start()
                time.sleep(2.5 * LEASE_S)
                operator.rollback()
            committing.join(30)
            assert store.checkpoint().batch_id == 1
        writer.check()  # renewed by the commit: still the writer
        with pytest.raises(WriterBusy, match="writer"):
            WriterLease(url, name, holder="standby", lease_s=LEASE_S).acquire()
    finally:
        writer.release()


def test_a_stalled_run_lets_its_lease_expire_so_a_standby_takes_over(
        inventory_app, stack_settings, spark) -> None:
    """The host's watchdog gives a stuck run up, and the host is stopped right then (a
    SIGTERM): no run of it takes the lease again, and the stuck one renews it no more."""
    names = campaign.Names(f"stall_{uuid.uuid4().hex[:8]}")
    app = campaign.campaign_app(names)
    settings = stack_settings.model_copy(update={
        "writer_lease_s": LEASE_S, "projection_stall_s": 1.0, "metrics": False,
        "trigger_interval": "100 milliseconds", "driver_batch_max_rows": 1_000_000})
    app.runtime(settings).setup()
    app.runtime(settings).command_bus().execute(
        campaign.Ring(till=f"{names.suffix}-till", amount=5))
    stalled = HostActor(f"stalled-{names.suffix}", "writer", app=app, settings=settings,
                        projection=names.projection)
    standby = HostActor(f"standby-{names.suffix}", "standby", app=app, settings=settings,
                        projection=names.projection, standby=True)
    stuck, release = threading.Event(), threading.Event()

    def stall(point: str, actor: str | None) -> None:
        if actor == stalled.name and point == "batch.started" and not stuck.is_set():
            stuck.set()
            release.wait(120)  # stuck where nothing interrupts it

    uninstall = faults.install(stall)
    try:
        stalled.start()
        wait_for(stuck.is_set, "the writer's batch to get stuck", timeout_s=120)
        standby.start()
        wait_for(lambda: metrics.STALLED.labels(names.projection)._value.get() == 1,
                 "the watchdog to give the stuck run up", timeout_s=60)
        stalled.stop()
        # A stuck run that renewed its lease on would keep it for good: a takeover within a
        # bound of leases shows it stopped (a loaded machine adds seconds, so no tighter).
        wait_for(lambda: _holder(settings, names.projection) == standby.name,
                 "the standby to take the projection over", timeout_s=15 * LEASE_S)
    finally:
        uninstall()
        release.set()
        for actor in (stalled, standby):
            actor.stop()
        for actor in (stalled, standby):
            actor.join(60)


def _holder(settings, projection: str) -> str | None:
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        writer = writer_of(conn, projection)
    return None if writer is None else writer.holder
