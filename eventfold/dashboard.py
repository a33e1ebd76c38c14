"""The pipeline dashboard the read API serves at ``/ui``: write side -> outbox -> topics ->
projections -> read models and KTables, each with its live figures.

``/ui`` is one static page (``dashboard.html``: plain HTML, CSS and JavaScript, no build
step) that polls ``/ui/pipeline.json`` every second and draws throughput sparklines from the
differences between polls. The JSON is ``eventfold status``'s view plus the topics' end
offsets, each projection's latest dead letters and a replay's progress, computed at most once
a second however many browsers poll.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from importlib.resources import files
from typing import Any

import psycopg
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from eventfold.config import Settings
from eventfold.contract import event_topic, libpq_url
from eventfold.declared import DeclaredApp
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.dead_letters import read_dead_letters
from eventfold.projections.state.catalog import read_checkpoint
from eventfold.status import pipeline_status

LATEST_DEAD_LETTERS = 3


class PipelineSnapshots:
    """The dashboard's figures, at most one computation per ``min_interval_s``."""

    def __init__(self, app: DeclaredApp, settings: Settings, min_interval_s: float = 1.0) -> None:
        self.app = app
        self.settings = settings
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._taken_at = float("-inf")
        self._last: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        with self._lock:
            if time.monotonic() - self._taken_at >= self.min_interval_s:
                self._last = self._take()
                self._taken_at = time.monotonic()
            return self._last

    def _take(self) -> dict[str, Any]:
        status = pipeline_status(self.app, self.settings)
        snapshot = {**status.as_json(), "at": time.time(), "topics": self._topics()}
        letters = self._latest_dead_letters() if status.kafka["reachable"] else {}
        progress = self._replays(status.projections) if status.postgres["reachable"] else {}
        for projection in snapshot["projections"]:
            projection["latest_dead_letters"] = letters.get(projection["name"], [])
            projection["replay"] = progress.get(projection["name"])
        plain: dict[str, Any] = json.loads(json.dumps(snapshot, default=str))
        return plain

    def _topics(self) -> list[dict[str, Any]]:
        """Each aggregate type's topic: its end offsets summed (what CDC has published)."""
        planner = OffsetPlanner(self.settings.kafka, timeout_s=5)
        try:
            topics = []
            for aggregate in self.app.aggregate_types:
                topic = event_topic(aggregate)
                ends = planner.end_offsets(planner.partitions([topic]))
                topics.append({"aggregate_type": aggregate, "topic": topic,
                               "partitions": len(ends), "end_offset": sum(ends.values())})
            return topics
        except Exception as exc:  # Kafka away: the status part says so
            return [{"error": str(exc)}]
        finally:
            planner.close()

    def _latest_dead_letters(self) -> dict[str, list[dict[str, Any]]]:
        return {projection.name: [letter.as_json() for letter in read_dead_letters(
                    self.settings.kafka, projection.dead_letter_topic, LATEST_DEAD_LETTERS)]
                for projection in self.app.projections}

    def _replays(self, projections: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """A building version's events applied so far, beside the live version's."""
        building = [p for p in projections if p.get("building_version")]
        if not building:
            return {}
        progress = {}
        with psycopg.connect(libpq_url(self.settings.database_url), connect_timeout=5) as conn:
            for p in building:
                checkpoint = read_checkpoint(conn, p["name"], p["building_version"])
                done = checkpoint.events_applied if checkpoint else 0
                progress[p["name"]] = {"version": p["building_version"], "events_applied": done,
                                       "of": p["events_applied"]}
        return progress


def add_dashboard(api: FastAPI, app: DeclaredApp, settings: Settings) -> None:
    snapshots = PipelineSnapshots(app, settings)
    page = files("eventfold").joinpath("dashboard.html").read_text()

    @api.get("/ui", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    @api.get("/ui/pipeline.json", include_in_schema=False)
    async def pipeline() -> JSONResponse:
        return JSONResponse(await asyncio.to_thread(snapshots.get))
