"""One HTTP worker of a read API instance leads its background work; the others read what it
publishes (read_api.workers), and one of them leads once it has died."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from eventfold.read_api.freshness import Freshness, FreshnessMonitor
from eventfold.read_api.state.membership import Member, Membership, TopicReport
from eventfold.read_api.workers import WorkerLead


def test_one_worker_leads_and_the_others_read_each_publication_once(tmp_path: Path) -> None:
    lead, other = WorkerLead(tmp_path), WorkerLead(tmp_path)
    assert lead.leads() and lead.leads()
    assert not other.leads()
    assert other.latest("members") is None  # nothing published yet
    lead.publish("members", b"[1]")
    assert other.latest("members") == b"[1]"
    assert other.latest("members") is None  # read already
    lead.publish("members", b"[2]")
    assert other.latest("members") == b"[2]"


def test_a_worker_alone_leads_and_publishes_nothing() -> None:
    alone = WorkerLead()
    assert alone.alone and alone.leads()
    alone.publish("members", b"[]")
    assert alone.latest("members") is None


def test_when_the_lead_dies_another_worker_leads(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from eventfold.read_api.workers import WorkerLead; "
         f"lead = WorkerLead(Path({str(tmp_path)!r})); assert lead.leads(); "
         "print('leads', flush=True); "
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "leads\n"
        other = WorkerLead(tmp_path)
        assert not other.leads()
        holder.kill()
        holder.wait(timeout=10)
        assert other.leads()
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_freshness_snapshot_reaches_a_follower_as_it_was() -> None:
    fresh = Freshness(3, 41, datetime(2026, 11, 26, 12, 0, tzinfo=UTC),
                      {("events.Product", 0): 17, ("events.Product", 1): 5}, 2,
                      datetime(2026, 11, 26, 12, 0, 1, tzinfo=UTC))
    assert Freshness.from_record(fresh.as_record()) == fresh


def test_a_follower_takes_the_versions_and_members_the_lead_publishes(tmp_path: Path) -> None:
    lead = WorkerLead(tmp_path)
    assert lead.leads()
    fresh = Freshness(2, 7, None, {}, 0, datetime(2026, 11, 26, tzinfo=UTC))
    lead.publish("freshness", FreshnessMonitor.publication({"orders": fresh}, {"orders": []}))
    lead.publish("members", b'[["http://a:1", {"t": {"restored": {"0": 3}, "held": [0], '
                            b'"stored": [0, 1]}}], ["http://b:2", {}]]')

    follower = WorkerLead(tmp_path)
    monitor = FreshnessMonitor([], "", None, "", lead=follower)  # type: ignore[arg-type]
    versions: list[tuple[str, int]] = []
    monitor.on_version(lambda name, version: versions.append((name, version)))
    membership = Membership("http://b:2", dict, lead=follower)
    seen: list[tuple[Member, ...]] = []
    membership.on_change(seen.append)
    monitor.start()
    membership.start()
    try:
        assert monitor.wait_first_poll(5) and membership.wait_first(5)
        assert monitor.get("orders") == fresh and versions[0] == ("orders", 2)
        a, b = membership.members()
        assert a.tables["t"] == TopicReport({0: 3}, frozenset({0}), frozenset({0, 1}))
        assert b == Member("http://b:2") and seen[0] == (a, b)
    finally:
        monitor.stop()
        membership.stop()
