"""Read API: HTTP queries over what the projections materialize.

Owns: queries over SQL read models (the views named after projections, read as the read-only
role), KTables materialized from their compacted topics into state stores (``state``: RocksDB
on disk, restored from its checkpoint) and interactive queries over them,
freshness and read-your-writes, and the HTTP app.

May import: ``projections`` (definitions, table names), ``outbox.kafka`` and
``outbox.topics`` (topic readers, topic ids), ``eventfold.contract``, SQLAlchemy (query
building), psycopg, confluent-kafka, rocksdict, FastAPI, prometheus-client.
Nothing upstream imports it; it never imports ``write_model``.
"""

from eventfold.read_api.http import ReadApiOptions, create_read_app
from eventfold.read_api.ktables import KTableHost
from eventfold.read_api.read_models import ReadModel
from eventfold.read_api.schema import QueryError, ReadModelSchema
from eventfold.read_api.state import KTableView, StateStore, StoreConfig

__all__ = ["KTableHost", "KTableView", "QueryError", "ReadApiOptions", "ReadModel",
           "ReadModelSchema", "StateStore", "StoreConfig", "create_read_app"]
