"""Read API: HTTP queries over what the projections materialize.

Owns: queries over SQL read models (the views named after projections, read as the read-only
role), KTables materialized by consuming their compacted topics from the beginning (local
state stores, interactive queries), freshness and read-your-writes, and the HTTP app.

May import: ``projections`` (definitions, table names), ``outbox.kafka`` (topic readers),
``eventfold.contract``, SQLAlchemy (query building), psycopg, confluent-kafka, FastAPI,
prometheus-client.
Nothing upstream imports it; it never imports ``write_model``.
"""

from eventfold.read_api.http import ReadApiOptions, create_read_app
from eventfold.read_api.ktables import KTableHost, KTableStore, KTableView
from eventfold.read_api.read_models import ReadModel
from eventfold.read_api.schema import QueryError, ReadModelSchema

__all__ = ["KTableHost", "KTableStore", "KTableView", "QueryError", "ReadApiOptions",
           "ReadModel", "ReadModelSchema", "create_read_app"]
