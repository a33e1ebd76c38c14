"""The writer lease through a batch's commit that lasts longer than a lease (a large batch
into a large table): the commit holds the lease's registry row, so the renewal thread waits
behind it, and the commit renews the lease itself as it ends, in the database (a standby
still finds it held) and in the runner (which goes on writing)."""

from __future__ import annotations

import time

import psycopg
import pytest
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.lease import WriterBusy, WriterLease, renew_held

from eventfold.contract import libpq_url

LEASE_S = 1.0


def test_a_commit_longer_than_a_lease_renews_it_as_it_ends(inventory_app, stack_settings,
                                                           unique) -> None:
    url, name = stack_settings.database_url, f"lease_{unique}"
    ProjectionCatalog(url).register(name)
    writer = WriterLease(url, name, holder="writer", lease_s=LEASE_S)
    epoch = writer.acquire()
    with psycopg.connect(libpq_url(url)) as commit:
        with commit.transaction():  # as ReadModelStore.commit: the row claimed, then written
            commit.execute("SELECT 1 FROM projection_versions WHERE projection = %s "
                           "FOR UPDATE", (name,))
            time.sleep(2.5 * LEASE_S)
            started = time.monotonic()
            renew_held(commit, name, epoch)
        writer.renewed_in_commit(started)
    writer.check()
    with pytest.raises(WriterBusy, match="writer"):
        WriterLease(url, name, holder="standby", lease_s=LEASE_S).acquire()
    writer.release()
