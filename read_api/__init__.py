"""Read API: HTTP queries over what the projections materialize.

Owns: queries over SQL read models (the views named after projections), KTable views
materialized by consuming their compacted topics from the beginning, and the HTTP app.

May import: ``projections`` (definitions, versions), ``outbox.kafka`` (topic readers),
SQLAlchemy, confluent-kafka, FastAPI. Nothing upstream imports it; it never imports
``write_model``.
"""

from read_api.http import create_read_app
from read_api.ktables import KTableView
from read_api.read_models import ReadModelQueries

__all__ = ["KTableView", "ReadModelQueries", "create_read_app"]
