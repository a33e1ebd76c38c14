"""JSON logs as a log pipeline reads them, across processes: a command sent with a
correlation id whose event the projection cannot fold shows up, under that id, in the JSON
line of the `projection run` process that dead-letters it; the command API's own lines are
JSON too; `eventfold dlq list|show` finds the letter and its event."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from tests.kafka_helpers import read_topic
from tests.pipeline_helpers import wait_for
from tests.support.cli import eventfold, stack_env


def json_lines(log: Path) -> list[dict]:
    """Our lines (Spark's JVM writes its own text lines to the same stream)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_a_commands_correlation_id_reaches_the_projections_log_line(
        inventory_app, stack_settings, tmp_path, unique) -> None:
    name = f"unlucky_{unique}"
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_TEST_UNLUCKY_PREFIX=unique,
                    EVENTFOLD_LOG_FORMAT="json",
                    EVENTFOLD_COMMAND_API_PORT=str(port),
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    api_log, run_log = tmp_path / "commands.log", tmp_path / "run.log"
    api = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "commands"],
                           env=env, stdout=api_log.open("w"), stderr=subprocess.STDOUT)
    run = None
    try:
        wait_until(lambda: port_is_open(port), what="command API", timeout_s=60, pid=api.pid)
        correlation = f"checkout-{unique}"
        for quantity in (2, 13, 3):
            response = httpx.post(f"http://127.0.0.1:{port}/commands/ReceiveStock",
                                  json={"product": f"{unique}-p", "quantity": quantity},
                                  headers={"X-Correlation-ID": correlation if quantity == 13
                                           else f"other-{unique}"}, timeout=30)
            assert response.status_code == 201, response.text
        run = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                                name], env=env, stdout=run_log.open("w"),
                               stderr=subprocess.STDOUT)

        # The new projection reads the shared topic from its start; only our products are
        # unlucky (EVENTFOLD_TEST_UNLUCKY_PREFIX), so the letter under our id is ours.
        def dead_lettered() -> list[dict]:
            return [line for line in json_lines(run_log)
                    if line["message"].startswith("dead-lettering")
                    and line.get("projection") == name
                    and line.get("correlation_id") == correlation]
        wait_for(lambda: bool(dead_lettered()), "the run to dead-letter the 13 units under "
                 "the command's correlation id", timeout_s=240)
        # One event (a batch that ran again, at-least-once, would log its letter again).
        lines = dead_lettered()
        assert len({line["event_id"] for line in lines}) == 1, lines
        line = lines[0]
        assert line["level"] == "WARNING" and "13 units: unlucky" in line["message"]
        assert line["event_id"]
        assert any("streaming from" in line["message"] for line in json_lines(run_log))
        # The dead letter holds the message as it was published, metadata included.
        letters = [letter for letter in (json.loads(r["value"]) for r in read_topic(
            stack_settings.kafka, f"eventfold.dlq.{name}"))
            if letter["key"] == f"{unique}-p" and "unlucky" in letter["error"]]
        assert len({letter["offset"] for letter in letters}) == 1, letters
        published = json.loads(letters[0]["value"])
        assert json.loads(published["metadata"])["correlation_id"] == correlation
        assert published["eventId"] == line["event_id"]

        # `eventfold dlq` lists it and shows its event.
        listed = eventfold("dlq", "list", name, "--json", env=env, timeout=60)
        assert listed.returncode == 0, listed.stderr[-2000:]
        entries = [e for e in json.loads(listed.stdout) if e["key"] == f"{unique}-p"]
        # The poison event, then the key's next delivery, parked behind it.
        failed = [e for e in entries if "13 units: unlucky" in e["error"]]
        assert len(failed) == len(letters)
        entry = failed[0]
        assert {e["source"] for e in failed} == {entry["source"]}
        assert any(e["error"] == f"parked behind {entry['source']} (event {line['event_id']})"
                   for e in entries), entries
        shown = eventfold("dlq", "show", name, str(entry["dead_letter_offset"]), env=env,
                          timeout=60)
        assert shown.returncode == 0, shown.stderr[-2000:]
        event = json.loads(shown.stdout)["event"]
        assert event["data"]["quantity"] == 13 and event["stream_version"] == 2
        assert event["metadata"]["correlation_id"] == correlation
        missing = eventfold("dlq", "show", name, "999", env=env, timeout=60)
        assert missing.returncode == 2 and "no dead letter at offset 999" in missing.stderr
    finally:
        for process, what in ((run, "projection run"), (api, "serve commands")):
            if process is not None:
                stop_pid(process.pid, what=what, timeout_s=90)
    served = json_lines(api_log)
    assert any(line["logger"].startswith("uvicorn") for line in served), api_log.read_text()
    assert any("stopped cleanly" in line["message"] for line in served)
    assert all(line.startswith("{") or not line.strip()
               for line in api_log.read_text().splitlines()), api_log.read_text()[:2000]
