"""A projection host as a team runs it: `eventfold projection run --all` runs an app's
projections (a fold with a KTable and notifications, an aggregation, and a poison projection
whose fold always raises and that parks nothing) as queries of one Spark application while
commands flow. The poison projection dead-letters every event and the others fold on; one
`/metrics` and `/health` report all three; SIGTERM stops the three cleanly. (A SIGKILL of a
host mid-stream: tests/integration/test_cli.py.)"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
from sqlalchemy.exc import ProgrammingError

from eventfold import migrations
from eventfold.contract import event_topic
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.projections.dead_letters import read_dead_letters
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.hosts import HostDirectory, Request
from tests.pipeline_helpers import (
    folded_total,
    ktable_totals,
    log_says,
    rows,
    sales_totals_of_the_store,
    selling,
    topic_records,
    wait_for,
)
from tests.support.cli import eventfold, scrape, stack_env, status_json, total


def test_a_host_runs_an_apps_projections_and_a_poison_one_disturbs_none(
        stack_settings, engine, tmp_path, unique) -> None:
    from examples import sales

    sales.app.runtime(stack_settings).setup()
    totals, stats, poison = (f"{name}_{unique}" for name in ("sales_totals", "sales_stats",
                                                             "poison"))
    metrics_port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.host_app:app",
                    EVENTFOLD_TEST_PROJECTION=unique, EVENTFOLD_METRICS_PORT=str(metrics_port),
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    metrics = f"http://127.0.0.1:{metrics_port}"

    def health() -> tuple[int, dict]:
        try:
            answer = httpx.get(f"{metrics}/health", timeout=5)
        except httpx.TransportError:
            return 0, {}
        return answer.status_code, answer.json()

    log = tmp_path / "host.log"
    host = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                             "--all"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        with selling(stack_settings, unique) as sent:
            wait_for(lambda: health()[0] == 200, "every query of the host to run",
                     timeout_s=240)
            assert set(health()[1]["projections"]) == {totals, stats, poison}
            _, status = status_json(env)  # `eventfold status` shows the host
            assert [set(h["projections"]) for h in status["hosts"]
                    if set(h["projections"]) & {totals, stats, poison}] == [
                {totals, stats, poison}]

            def each_folded() -> bool:
                samples = scrape(metrics)
                return all(total(samples, "eventfold_projection_records_total",
                                 projection=name) > 0 for name in (totals, stats, poison))
            wait_for(lambda: each_folded() and folded_total(engine, totals, unique) > 0,
                     "each projection of the host to fold a batch", timeout_s=180)
        expected = sales_totals_of_the_store(engine, unique)
        assert len(expected) == 7 and sum(expected.values()) == sent() * (sent() + 1) // 2

        def lag() -> float:
            return total(scrape(metrics), "eventfold_projection_lag_events")
        wait_for(lambda: lag() == 0, "the host's projections to catch up", timeout_s=120)
        samples = scrape(metrics)
        for name in (totals, stats, poison):
            assert any(n == "eventfold_projection_lag_events" and labels["projection"] == name
                       for n, labels, _ in samples), name
        assert total(samples, "eventfold_projection_dead_letters_total", projection=poison) > 0
        # The shared topic holds other tests' records that are not events: every projection
        # dead-letters those; none of this test's sales but in the poison projection.
        for name in (totals, stats):
            assert not [letter for letter in read_dead_letters(
                stack_settings.kafka, f"eventfold.dlq.{name}", None)
                if (letter.key or "").startswith(unique)], name
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=90) == 0
    finally:
        stop_pid(host.pid, what="projection host", timeout_s=90)
    output = log.read_text()
    assert "stopping after the current batch" in output
    for name in (totals, stats, poison):
        assert f"projection {name} stopped after" in output
    assert "Traceback" not in output and "Py4J" not in output, output[-3000:]

    assert rows(engine, totals, unique, "total") == expected
    assert ktable_totals(stack_settings, totals, unique) == expected
    assert {k: int(v) for k, v in rows(engine, stats, unique, "revenue").items()} == expected
    letters = [(letter.event() or {}).get("event_id") for letter in
               read_dead_letters(stack_settings.kafka, f"eventfold.dlq.{poison}", None)
               if (letter.key or "").startswith(unique)]
    with engine.connect() as conn:
        events = conn.exec_driver_sql(
            "SELECT count(*) FROM events WHERE stream_type = 'ProductSales' AND stream_id "
            "LIKE %s", (f"{unique}-%",)).scalar_one()
    assert None not in letters
    assert len(letters) == len(set(letters)) == events  # each event once: none lost or doubled
    assert rows(engine, poison, unique, "total") == {}


def _notes(engine, counted: str) -> dict[str, object]:
    """The counted projection's notes by key; none before its table exists."""
    try:
        return rows(engine, counted, "", "note")
    except ProgrammingError:
        return {}


def test_a_source_topic_made_again_under_a_host_stops_its_projection_and_no_other(
        stack_settings, engine, tmp_path, unique) -> None:
    """An operator deletes one projection's source topic under a host and makes it again,
    while sales flow to the host's other projections. The host's idle projections share one
    look at their sources (``source_watch``), which fails while a topic it looks at is gone:
    the projection whose topic it was stops, saying so, and none of the others misses a
    sale."""
    from examples import sales
    from tests.support.events import made_again, publish

    sales.app.runtime(stack_settings).setup()
    totals, counted, aggregate = f"sales_totals_{unique}", f"counted_{unique}", f"Counted{unique}"
    publish(stack_settings, aggregate, [(f"s{n}", "Counted", {"note": "old"}) for n in range(5)])
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.host_app:app",
                    EVENTFOLD_TEST_PROJECTION=unique, EVENTFOLD_TEST_COUNTED=aggregate,
                    EVENTFOLD_METRICS_PORT=str(free_port()))
    log = tmp_path / "host.log"
    host = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                             "--all"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        with selling(stack_settings, unique) as sent:
            wait_for(lambda: len(_notes(engine, counted)) == 5
                     and folded_total(engine, totals, unique) > 0,
                     "the host to fold the counted events and sales", timeout_s=240)
            made_again(stack_settings, aggregate, "new", 8)  # reading on would skip 5
            wait_for(lambda: log_says(log, f"projection {counted} stopped: "),
                     "the counted projection to stop", timeout_s=90)
            after = sent()
            wait_for(lambda: folded_total(engine, totals, unique) > after * (after + 1) // 2,
                     "sales sent after the stop to be folded", timeout_s=60)
        expected = sales_totals_of_the_store(engine, unique)
        assert sum(expected.values()) == sent() * (sent() + 1) // 2
        wait_for(lambda: rows(engine, totals, unique, "total") == expected,
                 "every sale folded", timeout_s=120)
        assert host.poll() is None, "the host runs on"
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=90) == 1  # one of its projections stopped
    finally:
        stop_pid(host.pid, what="projection host", timeout_s=90)
    output = log.read_text()
    assert re.search(rf"projection {counted} stopped: .*{event_topic(aggregate)}(, which it "
                     r"has read from,)? was deleted", output), output[-3000:]
    assert "The host's other projections carry on" in output
    for other in (totals, f"sales_stats_{unique}", f"poison_{unique}"):
        assert f"projection {other} stopped after" in output
        assert f"projection {other} failed" not in output, output[-3000:]
    assert set(_notes(engine, counted).values()) == {"old"}
    assert ktable_totals(stack_settings, totals, unique) == expected


def test_a_replay_handed_to_a_host_stops_on_ctrl_c_and_resumes_there(
        stack_settings, engine, tmp_path, unique) -> None:
    """`projection replay` while a host streams the projection runs on the host (the CLI
    starts no Spark). Ctrl-C of the CLI cancels it after the batch under way: exit code 130,
    the live version still active. Asked again, it resumes from that batch and switches."""
    from examples import sales

    sales.app.runtime(stack_settings).setup()
    name = f"handed_{unique}"
    # its own events, so that the replay has batches to cancel when the test runs alone
    bus = sales.app.runtime(stack_settings).command_bus()
    before = topic_records(stack_settings, "ProductSales")
    for n in range(200):
        bus.execute(sales.RecordSale(product=f"{unique}-{n % 20}", value=1))
    wait_for(lambda: topic_records(stack_settings, "ProductSales") >= before + 200,
             "the test's sales to reach their topic")
    events = topic_records(stack_settings, "ProductSales")
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.renamed_app:app",
                    EVENTFOLD_TEST_PROJECTION=name,
                    EVENTFOLD_REPLAY_MAX_ROWS_PER_BATCH=str(max(events // 100, 1)))
    directory = HostDirectory(stack_settings.database_url)
    catalog = ProjectionCatalog(stack_settings.database_url)
    log = tmp_path / "host.log"
    host = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run", name],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: directory.host_running(name) is not None
                 and folded_total(engine, name, "") > 0, "the host to stream", timeout_s=240)

        def requested() -> Request | None:
            with engine.connect() as conn:
                found = conn.exec_driver_sql(
                    "SELECT max(id) FROM projection_requests WHERE projection = %s",
                    (name,)).scalar_one()
            return directory.request(found) if found else None

        replay_log = tmp_path / "replay.log"
        replay = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection",
                                   "replay", name], env=env, stdout=subprocess.PIPE,
                                  stderr=replay_log.open("w"), text=True)
        try:
            wait_for(lambda: (found := requested()) is not None and found.done > 0,
                     "the host to commit a batch of the replay", timeout_s=180)
            replay.send_signal(signal.SIGINT)
            assert replay.wait(timeout=120) == 130, replay_log.read_text()[-3000:]
        finally:
            stop_pid(replay.pid, what="projection replay")
        cancelled = requested()
        assert cancelled is not None and cancelled.state == "cancelled"
        assert 0 < cancelled.done < events
        assert "cancelled after" in replay_log.read_text()
        assert catalog.active(name) == 1

        again = eventfold("projection", "replay", name, env=env, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        done = re.search(rf"replayed {name}: v2 active, ([\d,]+) events", again.stdout)
        assert done, again.stdout
        assert 0 < int(done[1].replace(",", "")) < events  # not again from the start
        assert "handed to the host running it" in again.stderr
        assert "SparkContext" not in again.stderr and "Spark master" not in again.stderr
        assert catalog.active(name) == 2
        # its next batch finds v2 active
        bus.execute(sales.RecordSale(product=unique, value=1))
        wait_for(lambda: "a replay made v2 active; continuing on it" in log.read_text(),
                 "the host's live query to go on with v2", timeout_s=60)
        assert host.poll() is None, log.read_text()[-3000:]
    finally:
        stop_pid(host.pid, what="projection host", timeout_s=90)
        directory.close()
        catalog.close()


def test_a_replay_asked_of_a_host_that_died_before_claiming_it_goes_to_the_one_after_it(
        stack_settings, unique) -> None:
    """A host killed a moment ago still looks alive for ``ALIVE_S``: a replay asked then is
    handed to it. Once it is taken for dead, the request, still pending, moves to the host
    that runs the projection now, which claims it; the dead one could no longer."""
    migrations.upgrade(stack_settings.database_url)
    name = f"rerouted_{unique}"
    directory = HostDirectory(stack_settings.database_url)
    dead, restarted = f"dead-{unique}", f"restarted-{unique}"
    try:
        directory.register(dead, [name])
        request_id = directory.submit(dead, name, "replay", "topics")
        assert directory.reroute(request_id, name) == dead  # alive: nothing to move
        directory._conn().execute(
            "UPDATE members SET seen_at = now() - interval '1 minute' "
            "WHERE kind = 'projection_host' AND member_id = %s", (dead,))
        assert not directory.request(request_id).host_alive
        assert directory.reroute(request_id, name) is None  # no live host runs it yet
        directory.register(restarted, [name])
        assert directory.reroute(request_id, name) == restarted
        assert directory.request(request_id).host_alive
        assert directory.claim(dead) is None
        claimed = directory.claim(restarted)
        assert claimed is not None and claimed.id == request_id
        assert directory.reroute(request_id, name) is None  # running: it stays where it is
    finally:
        directory.unregister(dead)
        directory.unregister(restarted)
        directory.close()
