"""Read API: HTTP queries over what the projections materialize.

Owns: queries over SQL read models (the views named after projections), KTable views
materialized by consuming their compacted topics from the beginning, and the HTTP app.

May import: ``projections`` (definitions, table naming, offset planning), SQLAlchemy,
confluent-kafka, FastAPI. It never imports write_model or outbox: reads do not reach upstream.
"""

from read_api.http import create_read_app
from read_api.ktables import KTableView
from read_api.read_models import ReadModelQueries

__all__ = ["KTableView", "ReadModelQueries", "create_read_app"]
